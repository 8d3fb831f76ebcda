"""Per-stack TLS for ``baton dev --secure``: a private CA and one server certificate.

:func:`stack_tls` writes, under ``<stack dir>/tls/`` (mode 0700, every file 0600):

- ``ca.pem`` / ``ca.key``: a CA made for this stack alone (EC P-256, ten years). Clients
  trust it through ``BATON_REDIS_TLS_CA`` / ``BATON_NATS_TLS_CA``; nothing else does.
- ``server.pem`` / ``server.key``: the certificate every Redis and NATS process of the stack
  presents, for ``127.0.0.1``, ``::1`` and ``localhost`` (serverAuth, and clientAuth for the
  servers' own links: Redis replication and cluster bus, NATS routes).

The files are kept across restarts while they verify and stay valid for another day, so a
durable stack keeps its CA. They are made by the ``openssl`` command line tool (present
wherever the system trusts any CA: Debian's ``ca-certificates`` depends on it), which keeps
certificate generation out of Baton's runtime dependencies.

TLS here authenticates the servers and encrypts the links; clients authenticate with their
role's password (the servers do not ask for client certificates). The extensions satisfy
Python's strict X.509 checks (``VERIFY_X509_STRICT``, the default from Python 3.13).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from baton.errors import ServerBinaryMissing, ServerError

__all__ = ["TLS_DIR", "TlsFiles", "stack_tls"]

TLS_DIR = "tls"
_HOSTS = ("IP:127.0.0.1", "IP:::1", "DNS:localhost")
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_SERVER_EXT = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
    f"subjectAltName={','.join(_HOSTS)}\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid,issuer\n"
)
_RENEW_BEFORE_S = 86_400


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The CA that signed the servers' certificate, and that certificate with its key."""

    ca: Path
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this CA only (hostname checked)."""
        return ssl.create_default_context(cafile=str(self.ca))


def stack_tls(base_dir: Path) -> TlsFiles:
    """The stack's TLS files: kept if they still verify, else generated (0600)."""
    folder = base_dir / TLS_DIR
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerBinaryMissing(
            "openssl not found: a secure stack generates its TLS certificates with it "
            "(Debian: apt-get install openssl; macOS: brew install openssl)", binary="openssl")
    if _usable(openssl, files):
        return files
    fresh = base_dir / f"{TLS_DIR}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(mode=0o700, parents=True)
    _generate(openssl, fresh)
    for path in fresh.iterdir():
        path.chmod(0o600)
    shutil.rmtree(folder, ignore_errors=True)
    fresh.replace(folder)
    return files


def _usable(openssl: str, files: TlsFiles) -> bool:
    if not all(p.is_file() for p in (files.ca, files.cert, files.key)):
        return False
    checks = [
        ["verify", "-CAfile", str(files.ca), str(files.cert)],
        ["x509", "-checkend", str(_RENEW_BEFORE_S), "-noout", "-in", str(files.ca)],
        ["x509", "-checkend", str(_RENEW_BEFORE_S), "-noout", "-in", str(files.cert)],
    ]
    return all(subprocess.run([openssl, *argv], capture_output=True, check=False).returncode == 0
               for argv in checks)


def _generate(openssl: str, folder: Path) -> None:
    (folder / "server.ext").write_text(_SERVER_EXT)
    steps = [
        ["req", "-x509", *_CURVE, "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
         "-subj", "/CN=Baton dev stack CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *_CURVE, "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-set_serial", "0x" + os.urandom(16).hex(), "-days", "825",
         "-extfile", "server.ext", "-out", "server.pem"],
    ]
    for argv in steps:
        done = subprocess.run([openssl, *argv], cwd=folder, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise ServerError(f"openssl {argv[0]} failed: {done.stderr.strip()[-500:]}",
                              server="openssl")
    for scratch in ("server.csr", "server.ext"):
        (folder / scratch).unlink()
