"""redis-py's single-server client with short ways for what Baton does most: a script call
(:class:`DirectRedis`), a batch of commands in one round trip without a pipeline object
(:func:`run_batch`, :func:`run_batch_then`) and taking a pooled connection
(:class:`DirectPool`); and its connection classes, whose close-while-writing race is a
ConnectionError (:class:`SafeConnection`). :mod:`baton.store.redis_client` builds clients
from these."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "DirectPool", "DirectRedis", "SafeConnection", "SafeSSLConnection", "batches_raw",
    "run_batch", "run_batch_then", "safe_connection_class",
]


_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis]: the C parser, and a C packer of commands
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency; its absence only costs CPU
    _hiredis_pack = None
try:  # what redis-py's hiredis parser has its reader answer while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH
except ImportError:  # pragma: no cover - another redis-py: every reply is read its way
    _NOT_ENOUGH = None

# Commands sent again and again with the same arguments (the relay's blocking read of its
# shards' streams: some seventy of them): packed once, the bytes kept (a few per process).
_REPEATED = frozenset({"XREADGROUP"})
_PACKED_MAX = 64
_packed: dict[tuple[Any, ...], list[bytes]] = {}


class _ClosedWhileWriting:
    """Mixin: a write on a connection closed under it is a ConnectionError.

    redis-py (8.1) lets a transport-internal error escape when a connection is closed while a
    command is being written (another task disconnected it, or the peer reset it: the
    writer is gone or its transport is closing): ``AttributeError: 'NoneType' object has no
    attribute 'writelines'`` or a ``TypeError`` from asyncio's transport. Neither is a
    RedisError, so it would bypass every "Redis is down" path (seen after a cluster node
    restart). Only that case is translated; any other AttributeError or TypeError is a bug
    and is raised as it is.
    """

    _writer: Any
    encoder: Any
    socket_timeout: float | None
    is_connected: bool

    def pack_command(self, *args: Any) -> list[bytes]:
        """redis-py's packing of one command, in one join for the usual arguments (a one-word
        command name, then str, bytes and int): the same bytes, at a fraction of the CPU a
        commit's dozens of arguments cost through the per-argument encoder. Anything else
        goes the library's way."""
        name = args[0] if args else None
        if type(name) is not str or " " in name:
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        encoding, errors = self.encoder.encoding, self.encoder.encoding_errors
        if name in _REPEATED:
            key = (encoding, errors, args)
            try:
                packed = _packed.get(key)
            except TypeError:  # an unhashable argument (bytearray, memoryview)
                return self._pack(args, encoding, errors)
            if packed is None:
                if len(_packed) >= _PACKED_MAX:
                    _packed.clear()
                packed = _packed[key] = self._pack(args, encoding, errors)
            return list(packed)
        return self._pack(args, encoding, errors)

    def _pack(self, args: tuple[Any, ...], encoding: str, errors: str) -> list[bytes]:
        if _hiredis_pack is not None and encoding == "utf-8" and errors == "strict":
            # hiredis packs str (UTF-8, strict), bytes, memoryview, int and float (repr) as
            # redis-py's encoder does, in C: about a third of the loop below for a commit.
            # It refuses what the encoder refuses too (bool, None): those go the library's
            # way, which raises its own error for them.
            try:
                return [_hiredis_pack(args)]
            except TypeError:
                return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            kind = type(arg)
            if kind is str:
                data = arg.encode(encoding, errors)
            elif kind is bytes:
                data = arg
            elif kind is int:
                data = b"%d" % arg
            else:
                return super().pack_command(*args)  # type: ignore[misc,no-any-return]
            out += (b"$%d\r\n" % len(data), data, b"\r\n")
        return [b"".join(out)]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            if self.socket_timeout and self.is_connected:
                await self._send_within(command, check_health)
            else:
                await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except (AttributeError, TypeError) as exc:
            writer = self._writer
            if writer is not None and not writer.transport.is_closing():
                raise
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise RedisConnectionError(f"connection closed while writing: {exc!r}") from None

    async def _send_within(self, command: Any, check_health: bool) -> None:
        """redis-py's write of a command with its socket timeout, the same errors, under
        ``asyncio.timeout``: redis-py's ``asyncio.wait_for`` runs every write in a task of
        its own on Python 3.11 (a task, a timer and a loop turn per command). A connected
        socket with an empty buffer takes a command at once: nothing to wait for, no timer;
        only a write the socket did not take whole is drained, within the timeout."""
        if check_health and self._health_check_due():
            await self.check_health()  # type: ignore[attr-defined]
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer = self._writer
            writer.writelines(command)
            transport = writer.transport
            if transport.get_write_buffer_size():  # only then may the drain wait
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
            elif transport.is_closing():
                await writer.drain()  # raises for the broken connection
        except TimeoutError:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            err_no, errmsg = ("UNKNOWN", e.args[0]) if len(e.args) == 1 else e.args[:2]
            raise RedisConnectionError(
                f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise

    def _health_check_due(self) -> bool:
        interval = getattr(self, "health_check_interval", 0)
        return bool(interval) and (
            asyncio.get_running_loop().time() > getattr(self, "next_health_check", 0))


class SafeConnection(_ClosedWhileWriting, Connection):
    """A :class:`Connection` whose close-while-writing race is a ConnectionError."""


class SafeSSLConnection(_ClosedWhileWriting, SSLConnection):
    """The same over TLS."""


class DirectPool(BlockingConnectionPool):
    """redis-py's blocking pool, with a short way for the usual case.

    Taking a connection goes through a condition, a timeout, a lock's context manager and
    metric hooks (tens of microseconds, once per command). While an idle connection is
    there and nobody waits for one, it is taken and given back directly; the connection is
    still checked (:meth:`ensure_connection`) before use. Otherwise, and during a server's
    maintenance, redis-py's own way.
    """

    def _quiet(self) -> bool:
        waiters = getattr(self._condition, "_waiters", None)
        return waiters is not None and not waiters and not getattr(self, "_in_maintenance", True)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not self._available_connections or not self._quiet():
            return await super().get_connection(*args, **kwargs)
        connection = self._available_connections.pop()
        self._in_use_connections.add(connection)
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: Any) -> None:
        if (not self._quiet() or connection not in self._in_use_connections
                or connection.should_reconnect()
                or getattr(connection, "_re_auth_token", None) is not None):
            return await super().release(connection)
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)


class DirectRedis(Redis):
    """redis-py's client, with a short way for a script call (every state transition).

    ``EVALSHA`` has no reply callback and the client never retries (:func:`connect_redis`),
    so the generic command path (retry wrapper, metric hooks, option parsing) adds nothing
    to it but CPU: the call is sent and its reply read on a pooled connection directly.
    Errors are the same: the connection's own send and read disconnect on a connection
    error, a timeout or a cancellation, and raise redis-py's exceptions (a script's error,
    ``NOSCRIPT`` included, is a ``ResponseError`` as before).
    """

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if (options or args[0] != "EVALSHA" or self.single_connection_client
                or self.connection is not None):
            return await super().execute_command(*args, **options)
        pool = self.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(connection.pack_command(*args))
            return await connection.read_response()
        finally:
            await pool.release(connection)

    async def batch(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """See :func:`run_batch`: the commands written at once on a pooled connection, the
        replies read in order; an error reply is read whole and kept in its place, so the
        connection stays in step (any other error disconnects it, as redis-py does)."""
        pool = self.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(connection.pack_commands(commands))
            return await self._replies(connection, len(commands))
        finally:
            await pool.release(connection)

    async def batch_then(self, commands: Sequence[tuple[Any, ...]], last: tuple[Any, ...],
                         between: Callable[[list[Any]], None]) -> Any:
        """See :func:`run_batch_then`."""
        pool = self.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(connection.pack_commands([*commands, last]))
            replies = await self._replies(connection, len(commands))
            try:
                between(replies)
            except BaseException:
                await connection.disconnect(nowait=True)  # last's reply is still to come
                raise
            return await self.parse_response(connection, last[0])
        finally:
            await pool.release(connection)

    @staticmethod
    async def _replies(connection: Any, n: int) -> list[Any]:
        """``n`` replies in order. The first is read as redis-py reads one (waiting for it
        under the connection's timeout); each later one already parsed from what came with
        it is taken as it is (:func:`_buffered_reply`), without the timeout and the checks of
        a read that waits (about 10 µs a reply)."""
        replies: list[Any] = []
        for i in range(n):
            if i:
                reply = await _buffered_reply(connection)
                if reply is not _NONE_BUFFERED:
                    replies.append(reply)
                    continue
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:  # read whole: the connection is still in step
                replies.append(exc)
        return replies


_NONE_BUFFERED = object()


async def _buffered_reply(connection: Any) -> Any:
    """The next reply of ``connection`` if hiredis has already parsed it from the bytes read,
    else :data:`_NONE_BUFFERED` (nothing consumed: the caller reads the usual way).

    What redis-py's hiredis parser does with a reply, done here: an error reply is its
    exception (kept in its place), a connection error disconnects and raises, a push
    notification is handed to the parser's handler and the next reply looked for. Any other
    parser (the pure-Python one) always reads the usual way.
    """
    parser: Any = getattr(connection, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if reader is None or not getattr(parser, "_connected", False) or _NOT_ENOUGH is None:
        return _NONE_BUFFERED
    while True:
        reply = reader.gets()
        if reply is _NOT_ENOUGH:
            return _NONE_BUFFERED
        push = getattr(parser, "_hiredis_PushNotificationType", None)
        if push is not None and isinstance(reply, push):
            await parser.handle_push_response(reply)
            continue
        if isinstance(reply, RedisConnectionError) or (
                isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError)):
            await connection.disconnect(nowait=True)
            raise reply if isinstance(reply, RedisConnectionError) else reply[0]
        return reply


async def run_batch(redis: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Commands in one round trip, without a transaction; each reply in its place, an error
    reply as its exception (a connection error is raised).

    Meant for commands whose replies redis-py leaves as the server sends them (scripts,
    HGET, HVALS, ZADD without INCR, ...): on a single server the batch is written and its
    replies read on one pooled connection directly, without a pipeline object (its command
    stack, option parsing and metric hooks); otherwise (a cluster, a client of one
    connection) it is redis-py's pipeline.
    """
    if batches_raw(redis):
        return await cast(DirectRedis, redis).batch(commands)
    async with redis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))


def batches_raw(redis: Any) -> bool:
    """Whether :func:`run_batch` and :func:`run_batch_then` take the raw way on ``redis``
    (one server, a pooled client): only there may a batch end with a blocking command."""
    return isinstance(redis, DirectRedis) and not redis.single_connection_client


async def run_batch_then(redis: Any, commands: Sequence[tuple[Any, ...]],
                         last: tuple[Any, ...], between: Callable[[list[Any]], None]) -> Any:
    """``commands`` and then ``last`` (which may block: a blocking read) in one round trip,
    on a client for which :func:`batches_raw` holds.

    The replies of ``commands`` (as :func:`run_batch` gives them) go to ``between`` as soon
    as they are read, before the reply of ``last`` is waited for; ``last``'s reply is
    returned as redis-py's command would return it (its response callback). Should
    ``between`` raise, the connection, whose last reply is still to come, is dropped.
    """
    if not batches_raw(redis):
        raise TypeError("run_batch_then needs a pooled single-server client")
    return await cast(DirectRedis, redis).batch_then(commands, last, between)


def safe_connection_class(cls: type[Any]) -> type[Any]:
    """The safe variant of redis-py's TCP or TLS connection class (others as they are)."""
    return {Connection: SafeConnection, SSLConnection: SafeSSLConnection}.get(cls, cls)
