"""A client's ears on its sessions' settled channels: one subscription per waited session.

A commit that settles something SPUBLISHes on the session's own sharded channel
(:meth:`~baton.store.keys.Keys.settled_channel`; the message: :mod:`baton.store.notices`).
:class:`SettledChannels` SSUBSCRIBEs to a channel while some wait of this client is on it,
and unsubscribes when the last one ends, so a client hears about its own sessions only,
however many others settle. One listener task reads every subscribed channel (on a Redis
Cluster, one connection per node) and resolves the future of each wait on it; a wait then
takes a new one for the next notification. When subscribing or reading fails (Redis away),
the waits fall back to re-reading every second: a notification only saves a read. Neither
is silent: a failure to subscribe or to read is logged (once per streak of failures), and a
wait that found its work done by the fallback re-read is counted and warned about
(:mod:`baton.client.reads`).

Which reader to use is decided by the client's type (a :class:`~redis.asyncio.RedisCluster`
reads each node's connection with ``get_sharded_message``; a single server's pub/sub reads
its one connection with ``get_message``), never by the methods a pub/sub object happens to
have: redis-py 8.2 gave the single server's ``PubSub`` a ``get_sharded_message`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from baton.observability.log import error_text, get_logger
from baton.store.redis_client import is_cluster

__all__ = ["SettledChannels"]

log = get_logger("baton.client")


class SettledChannels:
    """The settled channels some wait of one client is on, and their listener."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis  # a redis.asyncio Redis or RedisCluster
        self._waiters: dict[str, set[asyncio.Future[Any]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._pubsub: Any = None
        self._subscribed = asyncio.Event()  # some channel is subscribed: the listener reads
        self._lock = asyncio.Lock()
        #: Notifications heard (for tests and the fan-out benchmark).
        self.heard = 0

    @property
    def subscribed(self) -> asyncio.Event:
        """Set while some channel is subscribed (a benchmark waits for it)."""
        return self._subscribed

    async def join(self, channel: str) -> asyncio.Future[Any]:
        """A future resolved by the channel's next notification (its message); the channel
        is subscribed to while some wait holds one (give it back with :meth:`leave`)."""
        signals = self._waiters.setdefault(channel, set())
        signal: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        signals.add(signal)
        if len(signals) == 1:
            await self._subscribe(channel)
        return signal

    def again(self, channel: str, heard: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """A fresh future for the channel's next notification, in place of one that fired."""
        signals = self._waiters.setdefault(channel, set())
        signals.discard(heard)
        signal: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        signals.add(signal)
        return signal

    async def leave(self, channel: str, signal: asyncio.Future[Any]) -> None:
        """The wait holding ``signal`` is over; the last one out unsubscribes."""
        signals = self._waiters.get(channel)
        if signals is None:
            return
        signals.discard(signal)
        if not signals:
            del self._waiters[channel]
            await self._unsubscribe(channel)

    async def close(self) -> None:
        """Stop listening; idempotent."""
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.wait({self._listener}, timeout=2.0)
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()

    async def _subscribe(self, channel: str) -> None:
        """SSUBSCRIBE to a session's channel; on failure waits re-read every second."""
        async with self._lock:
            try:
                if self._pubsub is None:
                    self._pubsub = self.redis.pubsub()
                await self._pubsub.ssubscribe(channel)
            except Exception as exc:
                log.warning("settled_subscribe_failed", channel=channel, error=error_text(exc))
                return
            self._subscribed.set()
            if self._listener is None or self._listener.done():
                self._listener = asyncio.create_task(self._dispatch(self._pubsub),
                                                     name="settled-listener")

    async def _unsubscribe(self, channel: str) -> None:
        async with self._lock:
            if self._pubsub is None or channel in self._waiters:
                return
            with contextlib.suppress(Exception):
                await self._pubsub.sunsubscribe(channel)
            if not self._waiters:
                self._subscribed.clear()

    async def _dispatch(self, pubsub: Any) -> None:
        """Wake the waiters of each notification; one task per client, only while some
        channel is subscribed (a pub/sub read needs a subscribed connection)."""
        sharded = is_cluster(self.redis)  # a cluster: one connection per node
        failing = False
        while True:
            await self._subscribed.wait()
            try:
                if sharded:
                    if not pubsub.node_pubsub_mapping:  # no node subscribed (yet, or again)
                        await asyncio.sleep(0.2)
                        continue
                    msg = await pubsub.get_sharded_message(timeout=0.2)
                else:
                    msg = await pubsub.get_message(timeout=1.0)
            except Exception as exc:  # connection lost: waiters re-read each second meanwhile
                if not failing:
                    log.warning("settled_listen_failed", error=error_text(exc),
                                note="waits re-read every second until the listener reads "
                                     "again")
                failing = True
                await asyncio.sleep(0.5)  # a backoff while Redis is away
                continue
            if failing:
                log.info("settled_listen_resumed")
                failing = False
            if msg is None or msg.get("type") not in ("smessage", "message"):
                continue
            self.heard += 1
            for signal in self._waiters.get(msg.get("channel"), ()):
                if not signal.done():
                    signal.set_result(msg.get("data"))  # see baton.store.notices
