"""NATS credentials and permissions, as the bus sees them.

Owns the connect options from :class:`Settings` (user/password or a creds file, TLS files),
telling an authentication failure from other connect errors, :class:`_Denials`, which
matches the permission violations the server reports asynchronously to the calls waiting on
them, and :class:`_Guard`, which fails such a call at once (see
:meth:`~baton.bus.bus.Bus.guarded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import nats.errors

from baton.errors import ConfigError, ForbiddenError
from baton.settings import Settings

T = TypeVar("T")

# The server reports a refused publish or subscribe asynchronously, as an error line.
# nats-py lower-cases the whole line, subject included: match prefixes case-insensitively.
_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription) to "?([^"\s]+)"?', re.IGNORECASE
)


class _Denials:
    """Permission violations the server reported, matched to the calls waiting on them."""

    def __init__(self) -> None:
        self._waiters: list[tuple[str, asyncio.Future[str]]] = []
        #: A refused subscription to a reply inbox: no request of this connection can be
        #: answered (a process running with another role's user, whose inbox differs).
        self.inbox: str = ""

    def report(self, text: str) -> bool:
        match = _VIOLATION.search(text)
        if match is None:
            return False
        subject = match[2].lower()
        if match[1].lower() == "subscription" and subject.startswith("_inbox."):
            self.inbox = subject
        for prefix, future in self._waiters:
            if subject.startswith(prefix.lower()) and not future.done():
                future.set_result(prefix if subject == prefix.lower() else subject)
        return True

    @contextlib.contextmanager
    def watch(self, prefix: str) -> Iterator[asyncio.Future[str]]:
        entry = (prefix, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            yield entry[1]
        finally:
            self._waiters.remove(entry)
            entry[1].cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class _Guard:
    """One connection's user and the denials reported to it: awaits a call that the server
    may refuse, and fails it as soon as the refusal is reported."""

    def __init__(self, denials: _Denials, user: str) -> None:
        self._denials = denials
        self.user = user

    async def __call__(self, action: str, subject: str, call: Awaitable[T]) -> T:
        """Await ``call``; raise :class:`ForbiddenError` at once if the server refuses
        ``subject`` (a prefix) to this user meanwhile, instead of waiting for a timeout."""
        with self._denials.watch(subject) as denied:
            task: asyncio.Future[T] = asyncio.ensure_future(call)
            waits: set[asyncio.Future[Any]] = {task, denied}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()
                # Its outcome (often ConnectionClosedError at shutdown) is nobody's concern
                # now: retrieved, so asyncio does not log it as never retrieved.
                task.add_done_callback(_retrieve)
                raise
            if task.done():
                return task.result()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise ForbiddenError(self.user, action, denied.result(),
                                 "not in this user's NATS permissions")


class _StartTlsEofNoise(logging.Filter):
    """Drops one harmless asyncio warning of TLS connections.

    nats-py reads the server's plain-text INFO, then upgrades the stream (``start_tls``); the
    stream's protocol still answers end-of-file as for plain TCP, and asyncio logs "returning
    true from eof_received() has no effect when using ssl" when such a connection closes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


_EOF_NOISE = _StartTlsEofNoise()


def _tls_context(settings: Settings) -> ssl.SSLContext | None:
    s = settings
    if not (s.nats_tls_ca or s.nats_tls_cert or s.nats_url.startswith("tls://")):
        return None
    logging.getLogger("asyncio").addFilter(_EOF_NOISE)  # once: filters are a set
    try:
        ctx = ssl.create_default_context(cafile=s.nats_tls_ca or None)
        if s.nats_tls_cert:
            ctx.load_cert_chain(s.nats_tls_cert, s.nats_tls_key or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the NATS TLS files: {exc}") from None
    return ctx


def _auth_options(settings: Settings) -> dict[str, Any]:
    s = settings
    options: dict[str, Any] = {}
    if s.nats_creds:
        options["user_credentials"] = s.nats_creds
    elif s.nats_user:
        options["user"], options["password"] = s.nats_user, s.nats_password
    tls = _tls_context(s)
    if tls is not None:
        options["tls"] = tls
    return options


def _is_auth_failure(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization" in text
