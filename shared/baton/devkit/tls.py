"""Per-stack TLS for ``baton dev up --secure``: a private CA and one server certificate.

:func:`stack_tls` writes, under ``<stack dir>/tls/`` (mode 0700, every file 0600); a
deployment's cluster gets the same from ``baton make-tls`` (:func:`make_tls_command`: compose
runs it once, naming its NATS nodes, for the TLS of their routes):

- ``ca.pem`` / ``ca.key``: a CA made for this stack alone (EC P-256, ten years). Clients
  trust it through ``BATON_REDIS_TLS_CA`` / ``BATON_NATS_TLS_CA``; nothing else does.
- ``server.pem`` / ``server.key``: the certificate every Redis and NATS process of the stack
  presents, for ``127.0.0.1``, ``::1`` and ``localhost`` by default (serverAuth, and
  clientAuth for the servers' own links: Redis replication and cluster bus, NATS routes).
- ``hosts``: the names and addresses the certificate was made for (new ones make new files).

The files are kept across restarts while they verify and stay valid for another day, so a
durable stack keeps its CA. They are made by the ``openssl`` command line tool (present
wherever the system trusts any CA: Debian's ``ca-certificates`` depends on it), which keeps
certificate generation out of Baton's runtime dependencies.

TLS here authenticates the servers and encrypts the links; clients authenticate with their
role's password (the servers do not ask for client certificates). The extensions satisfy
Python's strict X.509 checks (``VERIFY_X509_STRICT``, the default from Python 3.13).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import click

from baton.errors import ConfigError, ServerBinaryMissing, ServerError

__all__ = ["LOOPBACK", "TLS_DIR", "TlsFiles", "make_tls_command", "stack_tls"]

TLS_DIR = "tls"
#: What a local stack's certificate names.
LOOPBACK = ("127.0.0.1", "::1", "localhost")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9*]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_RENEW_BEFORE_S = 86_400


def _alt_names(hosts: tuple[str, ...]) -> str:
    """The subjectAltName value for ``hosts`` (IP addresses and DNS names, checked)."""
    names = []
    for host in hosts:
        try:
            names.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            if not _HOSTNAME.match(host) or "*" in host.partition(".")[2]:
                raise ConfigError(f"not a host name or IP address for a certificate: "
                                  f"{host[:100]!r}") from None
            names.append(f"DNS:{host}")
    return ",".join(names)


def _server_ext(hosts: tuple[str, ...]) -> str:
    return ("basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={_alt_names(hosts)}\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The CA that signed the servers' certificate, and that certificate with its key."""

    ca: Path
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this CA only (hostname checked)."""
        return ssl.create_default_context(cafile=str(self.ca))


def stack_tls(base_dir: Path, hosts: tuple[str, ...] = LOOPBACK,
              folder_name: str = TLS_DIR) -> TlsFiles:
    """The stack's TLS files under ``base_dir/folder_name``, for ``hosts``: kept if they
    still verify and name the same hosts, else generated (0600)."""
    if not hosts:
        raise ConfigError("a certificate needs at least one host name or address")
    ext = _server_ext(hosts)  # checks the names before anything is written
    folder = base_dir / folder_name
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerBinaryMissing(
            "openssl not found: a secure stack generates its TLS certificates with it "
            "(Debian: apt-get install openssl; macOS: brew install openssl)", binary="openssl")
    wanted = "\n".join(hosts) + "\n"
    have = _read(folder / "hosts")  # None: made before the hosts were kept, for LOOPBACK
    if _usable(openssl, files) and (have == wanted or (have is None and hosts == LOOPBACK)):
        return files
    fresh = base_dir / f"{folder_name}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(mode=0o700, parents=True)
    _generate(openssl, fresh, ext)
    (fresh / "hosts").write_text(wanted)
    for path in fresh.iterdir():
        path.chmod(0o600)
    shutil.rmtree(folder, ignore_errors=True)
    fresh.replace(folder)
    return files


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


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


def _generate(openssl: str, folder: Path, ext: str) -> None:
    (folder / "server.ext").write_text(ext)
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


@click.command("make-tls")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="where ca.pem, server.pem and server.key go (made 0700 if missing)")
@click.option("--host", "hosts", multiple=True, required=True,
              help="a DNS name or IP address the certificate names (repeat for each)")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object: the files made")
def make_tls_command(directory: str, hosts: tuple[str, ...], as_json: bool) -> None:
    """Make a private CA and a certificate for HOSTs (kept while valid and the same hosts).

    For the TLS of a NATS cluster's routes, or of any server Baton talks to: every node
    presents the one certificate (serverAuth and clientAuth), and trusts the CA alone.
    Needs the openssl command.
    """
    base = Path(directory)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = stack_tls(base.parent, tuple(hosts), base.name)
    if as_json:
        click.echo(json.dumps({"ca": str(files.ca), "cert": str(files.cert),
                               "key": str(files.key), "hosts": list(hosts)}))
    else:
        click.echo(f"TLS files for {', '.join(hosts)}: {files.ca}, {files.cert}, {files.key}")
