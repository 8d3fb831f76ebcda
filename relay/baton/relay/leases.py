"""Which shards this relay serves: fenced per-shard leases, shared out among live relays.

Each shard's outbox and timers are served by the one relay holding the shard's lease
(``relay_lease.lua``, on the shard's own hash tag). Every tick a relay renews what it holds
and rebalances towards a fair share, ``ceil(shards / live relays)``, live relays being
those announced in the service registry (counted once per lease time). A tick comes every
third of the lease time while some shard is another relay's or free: those are looked at
for expiry each tick, so a dead relay's shards are taken within a third of the lease of
lapsing. A relay holding every shard has nothing to look at: it ticks every half lease,
which leaves a slow or failed renewal half the lease before the leases lapse (retried
with a backoff meanwhile), and wakes itself and Redis a third less often when idle.

* over its share (a relay joined): release the surplus, which relays under their share take;
* under its share: take shards that are free (released, never held) or expired;
* at or over its share: still take *expired* shards, those of a relay that died without
  releasing them, so no shard waits for the registry to notice the death (up to
  ``SERVICE_STALE_MS``). Those shards are kept that long, not counted as surplus: the
  dead relay is still announced alive meanwhile, so every relay's share still counts it,
  and a shard released now would lie free, every relay being at its share, until the
  registry noticed the death. Once it has, the shares grow and the surplus is handed on.

On a Redis Cluster each shard's lease is its own call to the shard's primary: a primary
that is down or refuses writes fails the calls of its shards only, and the others are
renewed and taken as usual.

A graceful stop releases every lease at once. A relay that lost a shard (its lease expired
and another relay took it) learns it at its next renewal, or earlier when an
acknowledgement or timer firing under the old fence is refused.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Awaitable
from typing import TypeVar

from baton.observability.log import error_text, get_logger
from baton.relay.failures import REDIS_DOWN
from baton.store.outbox import Outbox
from baton.store.workers import SERVICE_STALE_MS, all_services

__all__ = ["ShardLeases"]

log = get_logger("baton.relay")

T = TypeVar("T")



class ShardLeases:
    """The shards one relay holds (shard -> fence); ``changed`` is set when they change."""

    def __init__(self, box: Outbox, name: str, shards: int, ttl_ms: int) -> None:
        self.box = box
        self.name = name
        self.shards = shards
        self.ttl_ms = ttl_ms
        self.held: dict[int, int] = {}
        self.changed = asyncio.Event()
        # Where this relay starts looking for free shards: relays spread over the ring.
        self._offset = zlib.crc32(name.encode()) % shards
        # The live relays, counted once per lease time: services announce every few
        # seconds (ANNOUNCE_EVERY_S), so counting them every tick re-reads the same ones.
        self._live = 1
        self._counted_ms: int | None = None
        # Shards taken from a relay whose lease lapsed (shard -> when): kept, not surplus,
        # until the registry has noticed that relay gone (SERVICE_STALE_MS).
        self._rescued: dict[int, int] = {}
        self._failing: set[int] = set()  # shards whose calls fail now (a primary down)

    @property
    def tick_s(self) -> float:
        """The tick while some shard is not ours: a third of the lease."""
        return self.ttl_ms / 3000

    @property
    def renew_s(self) -> float:
        """The tick while this relay holds every shard: half the lease."""
        return self.ttl_ms / 2000

    def next_tick_s(self) -> float:
        """How long after the start of a tick the next one is due."""
        return self.renew_s if len(self.held) >= self.shards else self.tick_s

    def held_shards(self) -> list[int]:
        return sorted(self.held)

    def lost(self, shard: int, holder: str = "") -> None:
        """Forget a shard the store says is no longer ours."""
        if self.held.pop(shard, None) is not None:
            log.warning("relay_shard_lost", shard=shard, holder=holder)
            self.changed.set()

    async def live_relays(self, now_ms: int) -> int:
        announced = await all_services(self.box.redis, self.box.keys, now_ms, "relay")
        names = {s.get("name") for s in announced if s["alive"]}
        names.add(self.name)
        return len(names)

    def _surplus(self, share: int, now_ms: int) -> list[int]:
        """The shards over this relay's share to hand on, never one rescued lately."""
        for shard, taken in list(self._rescued.items()):
            if shard not in self.held or now_ms - taken >= SERVICE_STALE_MS:
                del self._rescued[shard]
        spare = sorted((s for s in self.held if s not in self._rescued), reverse=True)
        return spare[:max(len(spare) - share, 0)]

    async def tick(self, now_ms: int) -> None:
        """Renew, then rebalance towards this relay's fair share."""
        failed: dict[int, Exception] = {}
        renewed = await self.box.renew_all(dict(self.held), self.name, self.ttl_ms, failed)
        if failed and not renewed:  # no primary answered: the caller backs off
            raise next(iter(failed.values()))
        if failed:  # those primaries' shards are kept while their leases may still hold
            self._failed("relay_lease_renew_failed", set(failed), next(iter(failed.values())))
        self._failing -= set(renewed)  # answered again
        for shard, answer in renewed.items():
            if not answer.ok:
                self.lost(shard, answer.holder)
        # A tenth of a tick of slack: ticks every half lease count at every second one.
        if self._counted_ms is None or now_ms - self._counted_ms >= self.ttl_ms * 0.9:
            self._live = await self.live_relays(now_ms)
            self._counted_ms = now_ms
        others = [(self._offset + i) % self.shards for i in range(self.shards)]
        others = [shard for shard in others if shard not in self.held]
        # One look at the other shards' leases, then an acquire only where it can succeed:
        # most ticks (every shard held by a live relay) write nothing.
        looks = await self.box.look(others)
        share = math.ceil(self.shards / self._live)
        for shard in self._surplus(share, now_ms):
            await self._guarded(shard, self.release(shard))
        for shard in others:
            under = len(self.held) < share
            if looks is not None:
                holder, left = looks[shard]
                if (holder not in ("", self.name) and left > 0) or (holder == "" and not under):
                    continue  # a live relay holds it, or it is free and we have our share
            taken = await self._guarded(shard, self.box.lease(
                "acquire" if under else "acquire_expired", shard, self.name, self.ttl_ms))
            if taken is not None and taken.ok:
                self.held[shard] = taken.fence
                if taken.holder:  # its relay let the lease lapse: kept (see _surplus)
                    self._rescued[shard] = now_ms
                log.info("relay_shard_taken", shard=shard, fence=taken.fence,
                         held=len(self.held), share=share, lapsed=taken.holder or None)
                self.changed.set()

    async def _guarded(self, shard: int, call: Awaitable[T]) -> T | None:
        """One shard's lease call; on a Redis Cluster its primary may be down or refusing
        writes while the others answer: logged, and the tick goes on with the next shard."""
        try:
            answer = await call
        except REDIS_DOWN as exc:
            if not self.box.cluster:
                raise  # one server: every shard's call would fail the same way
            self._failed("relay_shard_call_failed", {shard}, exc)
            return None
        if shard in self._failing:
            self._failing.discard(shard)
            log.info("relay_shard_call_recovered", shard=shard)
        return answer

    def _failed(self, event: str, shards: set[int], exc: BaseException) -> None:
        """Shards whose calls failed: a WARNING once per outage of a shard, then DEBUG at
        every tick until one answers again."""
        (log.debug if shards <= self._failing else log.warning)(
            event, shards=sorted(shards), error=error_text(exc))
        self._failing |= shards

    async def release(self, shard: int) -> None:
        fence = self.held.pop(shard, None)
        if fence is None:
            return
        self.changed.set()
        await self.box.lease("release", shard, self.name, self.ttl_ms, fence)
        log.info("relay_shard_released", shard=shard, fence=fence)

    async def release_all(self) -> None:
        for shard in list(self.held):
            await self.release(shard)
