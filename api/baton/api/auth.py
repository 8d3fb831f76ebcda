"""Who may call the API: bearer tokens, each with a role.

``read`` may read everything (sessions, traces, event streams, dead letters, workers);
``operate`` may also submit, start tasks, cancel, approve and reject. Tokens come from
``BATON_API_TOKENS`` (``role:token`` pairs separated by commas) and/or a file with one
``role:token`` per line (``#`` starts a comment). Only their SHA-256 digests are kept, and a
presented token is compared in constant time.

Without any token the API is open, with the ``operate`` role, only in dev mode and only when
it is bound to a loopback address; a request from another address is refused even then, and
what a web page may make a browser send is checked before any of this (:mod:`baton.api.guard`).
``baton dev`` does not run it open: it serves the API with a token of its own
(:func:`dev_tokens_file`), which the console it prints the address of picks up.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from baton.errors import ConfigError, ForbiddenError, UnauthenticatedError

__all__ = ["DEV_TOKENS", "OPERATE", "READ", "ROLES", "TOKENS_ENV", "Tokens", "caller_key",
           "dev_token", "dev_tokens_file", "is_loopback"]

READ = "read"
OPERATE = "operate"
ROLES = (READ, OPERATE)
TOKENS_ENV = "BATON_API_TOKENS"
_MIN_TOKEN = 16
#: The file of a ``baton dev`` stack's API token, in its home (mode 0600).
DEV_TOKENS = "api-tokens"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) names this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def caller_key(authorization: str | None) -> str:
    """Who a request counts as, for per-caller limits: its bearer token's digest (never the
    token), or ``anonymous``."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return _digest(token.strip()).hex()[:32]
    return "anonymous"


def dev_tokens_file(base_dir: Path) -> Path:
    """A dev stack's API tokens file (``operate:TOKEN``, mode 0600 from its first byte),
    made with a random token on first use and kept, so an open console keeps working
    across restarts of the stack."""
    path = base_dir / DEV_TOKENS
    if dev_token(base_dir) is None:
        from baton.devkit.files import write_private

        write_private(path, f"# baton dev's API token (the console at /console/#token=...)\n"
                            f"{OPERATE}:{secrets.token_urlsafe(32)}\n")
    return path


def dev_token(base_dir: Path) -> str | None:
    """The operate token of the dev stack at ``base_dir`` (None before it made one)."""
    try:
        text = (base_dir / DEV_TOKENS).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in text.splitlines():
        role, sep, token = line.split("#", 1)[0].strip().partition(":")
        if sep and role == OPERATE and len(token.strip()) >= _MIN_TOKEN:
            return token.strip()
    return None


@dataclass(frozen=True)
class Tokens:
    """The known tokens (by digest) and their roles; ``anonymous`` is the role of a request
    without a token (None: such a request is refused)."""

    roles: dict[bytes, str] = field(default_factory=dict)
    anonymous: str | None = None

    @classmethod
    def parse(cls, text: str, source: str) -> dict[bytes, str]:
        """``role:token`` pairs separated by commas or newlines; ConfigError naming ``source``
        on an unknown role or a short token."""
        out: dict[bytes, str] = {}
        for raw in text.replace(",", "\n").splitlines():
            item = raw.split("#", 1)[0].strip()
            if not item:
                continue
            role, sep, token = item.partition(":")
            role, token = role.strip(), token.strip()
            if not sep or role not in ROLES:
                raise ConfigError(f"{source}: expected role:token with a role of "
                                  f"{', '.join(ROLES)}, got {role or item[:20]!r}")
            if len(token) < _MIN_TOKEN:
                raise ConfigError(f"{source}: the token of the {role} role is shorter "
                                  f"than {_MIN_TOKEN} characters")
            out[_digest(token)] = role
        return out

    @classmethod
    def load(cls, *, host: str, dev: bool, file: Path | None = None,
             env: Mapping[str, str] | None = None) -> Tokens:
        """The tokens of ``BATON_API_TOKENS`` and ``file``; open only in dev on loopback."""
        env = os.environ if env is None else env
        roles = cls.parse(env.get(TOKENS_ENV, ""), TOKENS_ENV)
        if file is not None:
            try:
                roles |= cls.parse(file.read_text(), str(file))
            except OSError as exc:
                raise ConfigError(f"cannot read the API tokens file {file}: "
                                  f"{exc.strerror or exc}") from None
        if roles:
            return cls(roles)
        if dev and is_loopback(host):
            return cls({}, anonymous=OPERATE)
        where = "in dev mode on a loopback address only" if dev else "with --dev on loopback"
        raise ConfigError(f"no API tokens: set {TOKENS_ENV}=operate:TOKEN,read:TOKEN or pass "
                          f"--tokens-file (an open API is allowed {where}; bound to {host})")

    def role_of(self, authorization: str | None, client_host: str | None) -> str:
        """The role of a request's ``Authorization`` header; UnauthenticatedError if none."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            presented = _digest(token.strip())
            for known, role in self.roles.items():
                if hmac.compare_digest(known, presented):
                    return role
            raise UnauthenticatedError("unknown bearer token")
        if self.anonymous is not None and client_host is not None and is_loopback(client_host):
            return self.anonymous
        raise UnauthenticatedError("a bearer token is required (Authorization: Bearer TOKEN)")

    @staticmethod
    def require(role: str, needed: str, action: str) -> None:
        """ForbiddenError unless ``role`` may do what ``needed`` allows."""
        if needed == OPERATE and role != OPERATE:
            raise ForbiddenError(f"a token of the {role} role", action, "",
                                 f"this needs one of the {OPERATE} role")
