"""Holding a session's lease for the results of the tool runs its pass dispatched.

Without a hold, a pass that dispatched tool runs releases the lease with its last commit,
and the last result of the group wakes the session through the relay: a wake row in the
shard's wakes stream, which the relay publishes to JetStream, which a Brain fetches and
takes a new lease for. A hold cuts that hop. The last commit keeps the lease instead
(commit.lua ``hd``: meta 'listen' names this Brain), and the completion that would have
written the wake row SPUBLISHes the session id on this Brain's hold channel for the
session's shard (``listening_holder`` in _lib.lua): the hold's *signal* (the channel's
name in Redis keeps the word ``held``, see Keys.hold_channel). The pass, still under its fence,
releases (release.lua reads the nudge the completion set, keeps the lease and ends the
hold) and rechecks the session (re-reads it under the same lease).

Nothing is lost when a part fails, because a hold changes who hears of the result, never
whether it is recorded:

* the completion always sets the nudge, which the holder's release reads, so a signal lost
  on the way (the pub/sub connection dropped) costs at most the hold's length
  (``brain_hold_ms``), after which the pass releases and finds it;
* the pass keeps the session's wake unacknowledged in JetStream while it holds, as while
  it works (``in_progress``), so a Brain that dies holding has its wake redelivered to
  another, which takes over once the lease expires and finds the nudge;
* a lease that lapsed ends the hold for the completions (``listening_holder`` checks it):
  they write the wake row as before;
* a hold ends with a release, which clears 'listen' atomically with its read of the nudge,
  so a result lands either before it (the nudge is seen) or after (a wake row is written).

A Brain holds only while its subscriptions are confirmed, and at most ``brain_concurrency``
sessions at once; a hold does not count against the passes it runs. On a Redis Cluster it
listens on one connection per primary serving its channels' slots; a connection lost, or a
slot that moved (its server unsubscribes the channel), stops the holds until every channel
is subscribed again where it is now.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis

from baton.observability.log import error_text, get_logger
from baton.store.keys import Keys
from baton.store.redis_client import is_cluster

__all__ = ["Holds", "hold_name"]

log = get_logger("baton.brain")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def hold_name(worker: str) -> str:
    """The name a Brain holds as (meta 'listen', its channels): its worker name in the
    characters commit.lua accepts, the others replaced by ``_``."""
    return _UNSAFE.sub("_", worker)[:200] or "brain"


class Holds:
    """This Brain's hold channels, one per shard, and the passes waiting on them."""

    def __init__(self, redis: Any, keys: Keys, worker: str, shards: int, *,
                 hold_ms: int, limit: int, stopping: asyncio.Event) -> None:
        self.redis = redis
        self.name = hold_name(worker)
        self.channels = [keys.hold_channel(shard, self.name) for shard in range(shards)]
        self.hold_ms = hold_ms
        self.limit = limit
        self.listening = False  # the subscription is confirmed: completions reach us
        self.heard = 0  # signals received
        self.stopping = stopping  # the Brain's: holds end, none begins
        #: Called when a hold begins (a held pass frees its slot for another wake).
        self.on_hold: Callable[[], None] = lambda: None
        #: Set once the first subscription was confirmed or failed (or holds are off): a
        #: Brain is ready after it, so its first passes already hold.
        self.tried = asyncio.Event()
        self._waiters: dict[str, asyncio.Event] = {}
        self._signals: dict[str, str] = {}  # the trace headers of the signal each waiter got
        self._held = 0

    @property
    def holding(self) -> int:
        """Passes holding now (waiting for a signal or the end of their hold)."""
        return self._held

    def can_hold(self) -> bool:
        return (self.listening and self.hold_ms > 0 and self._held < self.limit
                and not self.stopping.is_set())

    def expect(self, session_id: str) -> asyncio.Event:
        """Register a pass that may hold ``session_id`` before its commit is sent, so a signal
        that comes before the commit's reply is not missed."""
        event = self._waiters.get(session_id)
        if event is None:
            event = self._waiters[session_id] = asyncio.Event()
        return event

    def forget(self, session_id: str) -> None:
        self._waiters.pop(session_id, None)
        self._signals.pop(session_id, None)

    async def hold(self, session_id: str) -> dict[str, str] | None:
        """Wait for the signal of ``session_id`` (or a wake of it joined here, which sets the
        same event), at most ``hold_ms`` and never past shutdown (:meth:`end_all`). Returns
        the trace headers the signal carried ({} for none, a joined wake, a shutdown), or
        None when the hold ran its length."""
        event = self.expect(session_id)
        self._held += 1
        self.on_hold()
        ran_out = False

        def run_out() -> None:
            nonlocal ran_out
            ran_out = True
            event.set()

        timer = asyncio.get_running_loop().call_later(self.hold_ms / 1000, run_out)
        try:
            await event.wait()
        finally:
            timer.cancel()
            self._held -= 1
            signal = self._signals.get(session_id, "")
            self.forget(session_id)
        if ran_out:
            return None
        try:
            headers = json.loads(signal) if signal else {}
        except ValueError:
            headers = {}
        if not isinstance(headers, dict):
            return {}
        return {str(k): str(v) for k, v in headers.items()}

    def end_all(self) -> None:
        """End every hold now (shutdown): each pass releases, and its Brain drains."""
        for event in self._waiters.values():
            event.set()

    def join(self, session_id: str) -> None:
        """A wake of ``session_id`` arrived here while its pass may hold: end the hold."""
        event = self._waiters.get(session_id)
        if event is not None:
            event.set()

    def _on_signal(self, signal: str) -> None:
        """Signal "<session id> <trace headers JSON>": end that session's hold (a signal
        for a session not held here, or after its hold ended, changes nothing)."""
        session_id, _, headers = signal.partition(" ")
        event = self._waiters.get(session_id)
        if event is not None:
            self._signals[session_id] = headers[:4096]
            event.set()

    async def run(self) -> None:
        """Subscribe and hand each signal to its waiter until cancelled (at shutdown); a lost
        connection stops the holds (``listening`` False) until it is subscribed again."""
        if self.hold_ms <= 0:
            self.tried.set()
            return
        ender = asyncio.ensure_future(self._end_at_stop())
        try:
            await self._listen()
        finally:
            ender.cancel()

    async def _end_at_stop(self) -> None:
        await self.stopping.wait()
        self.end_all()

    async def _listen(self) -> None:
        backoff = 0.5
        while not self.stopping.is_set():
            subscriptions: list[tuple[Any, list[str]]] = []
            confirmed = [0]  # across the connections: listening once every channel is
            try:
                # inside: a cluster's slot map with a slot no node serves (it is changing)
                # fails here, to be tried again like a lost connection
                subscriptions = self._subscriptions()
                async with asyncio.TaskGroup() as tg:
                    for pubsub, channels in subscriptions:
                        tg.create_task(self._read(pubsub, channels, confirmed))
            except Exception as exc:  # connection lost or refused: holds stop meanwhile
                self.tried.set()
                log.warning("held_listen_failed", error=error_text(_first(exc)))
            finally:
                self.listening = False
                for pubsub, _ in subscriptions:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                    if is_cluster(self.redis):  # its own client to one node
                        with contextlib.suppress(Exception):
                            await pubsub.connection_pool.disconnect()
            if confirmed[0] == len(self.channels):
                backoff = 0.5  # it had listened: try again soon
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), backoff)
            backoff = min(backoff * 2, 5.0)

    def _subscriptions(self) -> list[tuple[Any, list[str]]]:
        """The pub/sub connections to listen on and their channels: one on one server; on a
        Redis Cluster one per primary that serves some of the channels' slots (as the
        client's slot map says now), each a plain connection that blocks until a signal."""
        if not is_cluster(self.redis):
            return [(self.redis.pubsub(), self.channels)]
        nodes: dict[str, tuple[Any, list[str]]] = {}
        for channel in self.channels:
            node = self.redis.get_node_from_key(channel)
            nodes.setdefault(node.name, (node, []))[1].append(channel)
        out = []
        for node, channels in nodes.values():
            pool = ConnectionPool(connection_class=node.connection_class,
                                  **node.connection_kwargs)
            out.append((Redis(connection_pool=pool).pubsub(), channels))
        return out

    async def _read(self, pubsub: Any, channels: list[str], confirmed: list[int]) -> None:
        """Subscribe ``pubsub`` to ``channels`` and hand on each signal until it fails; a
        channel whose slot moved away (the server unsubscribes it) ends the listening, to
        subscribe again where the slot is now."""
        if is_cluster(self.redis):  # a cluster refuses channels of several slots at once
            for channel in channels:
                await pubsub.ssubscribe(channel)
        else:
            await pubsub.ssubscribe(*channels)
        async for msg in pubsub.listen():  # confirmations come as messages
            kind = msg.get("type")
            if kind == "smessage":
                self.heard += 1
                self._on_signal(_text(msg.get("data")))
            elif kind == "ssubscribe":
                confirmed[0] += 1
                if confirmed[0] == len(self.channels):
                    self.listening = True
                    self.tried.set()
                    log.debug("held_listening", channels=confirmed[0])
            elif kind == "sunsubscribe":
                raise ConnectionError(f"the server unsubscribed {_text(msg.get('channel'))}")


def _first(exc: BaseException) -> BaseException:
    """The first error of a task group's, or the error itself."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)
