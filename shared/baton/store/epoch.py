"""The store's epoch: lost Redis state is detected and reported, never taken for a new store.

Redis that restarts empty (non-durable mode), or a Redis Cluster primary that fails over to a
replica lacking its data, looks to a worker like a store where sessions were never created:
a waiting client reads "no submission", a Brain would start work anew. To tell the two apart
each shard carries an epoch, ``<ns>:{<ns>-<shard>}:epoch`` = ``{"v": 1, "id", "created_ms",
"layout"}``, written once when the store is first used. ``layout`` is the version of the key
layout the store was written with (:data:`STORE_LAYOUT`; absent = 1): a process refuses a
store of another layout at start with :class:`~baton.errors.StoreLayoutError`. The epoch
sits on the slot of the shard's sessions, so on a cluster it is lost exactly when they are.

Every role reads the epoch when it connects (:meth:`StoreEpoch.establish`) and re-reads it
while it runs (:meth:`StoreEpoch.watch`: every third of a lease while it works, ten times
less often while it idles, and at once when work arrives after idling) and whenever a read
says "not found" (:meth:`StoreEpoch.verify`). A shard whose epoch vanished or changed makes it
stop with :class:`~baton.errors.StoreEpochError`.

Initialisation: shard 0 is the anchor. A process that finds no epoch at all writes one to the
anchor (``SETNX``: racing processes agree on the first), then copies it to the other shards.
A process that finds the anchor but misses other shards fills them in only while the anchor
is younger than :data:`INIT_GRACE_MS` (another process is initialising); later, a missing
shard is lost state. What no epoch can detect: a process that never saw the store before
finds an entirely empty Redis, which is a new store to it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from baton.errors import RedisUnavailable, StoreEpochError, StoreLayoutError
from baton.observability.log import get_logger
from baton.store.capacity import refuse_eviction
from baton.store.clock import now_ms
from baton.store.keys import Keys
from baton.store.redis_client import REDIS_ERRORS, is_cluster

__all__ = ["INIT_GRACE_MS", "STORE_LAYOUT", "EpochSurvey", "StoreEpoch"]

log = get_logger("baton.store.epoch")

#: How long after a store's creation missing shard epochs are taken for an initialisation
#: still in progress rather than for lost state.
INIT_GRACE_MS = 30_000
#: The version of the key layout (baton.store.keys) this code reads and writes. 2: the
#: Brain's side of a live run (status until claimed, cancel mark, approval digest, group
#: counts) lives in the intents hash, the runs hash holds only the Hands' records; a
#: client's cancel intent or approval decision waits in the session's inbox.
STORE_LAYOUT = 2
ANCHOR = 0
#: An idle process checks the epoch this many times less often than a working one.
IDLE_FACTOR = 10


@dataclass(frozen=True, slots=True)
class EpochSurvey:
    """What every shard's epoch key says now, read without writing (for ``baton inspect``).

    ``state``: ``ok`` (every shard carries the anchor's epoch), ``new`` (no shard has one: a
    store no Baton process has used yet), ``missing`` (some shards, or the anchor, lost it:
    Redis restarted empty or failed over without the data), ``mixed`` (shards disagree: the
    store was re-initialised while some kept the old epoch).
    """

    state: str
    id: str
    created_ms: int
    shards: int
    missing: tuple[int, ...]
    differing: tuple[int, ...]
    ids: tuple[str, ...]  # per shard, "" where missing

    def of_shard(self, shard: int) -> str:
        return self.ids[shard] if 0 <= shard < len(self.ids) else ""


class StoreEpoch:
    """The epoch of one namespace's store, as this process first saw it."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        # Any: a redis.asyncio Redis or RedisCluster (both pipeline GET/SET across slots).
        self.redis = redis
        self.keys = keys
        self.id = ""
        self.created_ms = 0

    @classmethod
    async def establish(cls, redis: Any, keys: Keys) -> StoreEpoch:
        """Read the store's epoch (writing it on a new store); StoreEpochError on lost state."""
        epoch = cls(redis, keys)
        try:
            await refuse_eviction(redis)  # an evicting Redis would delete sessions
            return await epoch._establish()
        except REDIS_ERRORS as exc:  # unreachable: the caller's connect loop retries
            raise RedisUnavailable(f"cannot read the store epoch: {exc}") from None

    @classmethod
    async def survey(cls, redis: Any, keys: Keys) -> EpochSurvey:
        """Every shard's epoch as it is now; never writes (an operator's view)."""
        found = await cls(redis, keys)._read()
        ids = tuple(_id(v) for v in found)
        anchor = found[ANCHOR]
        missing = tuple(s for s, v in enumerate(found) if v is None)
        if len(missing) == len(found):
            return EpochSurvey("new", "", 0, len(found), missing, (), ids)
        ref = anchor or next(v for v in found if v is not None)
        differing = tuple(s for s, v in enumerate(found) if v is not None and _id(v) != _id(ref))
        state = "missing" if missing else "mixed" if differing else "ok"
        return EpochSurvey(state, _id(ref), int(ref.get("created_ms", 0)), len(found), missing,
                           differing, ids)

    def watch_interval(self, lease_ms: int) -> float:
        """Seconds between checks: a third of a lease, so loss is seen before a takeover."""
        return max(lease_ms / 3000, 0.1)

    def idle_interval(self, lease_ms: int) -> float:
        """Seconds between checks of a process without work (it holds no lease to lose)."""
        return IDLE_FACTOR * self.watch_interval(lease_ms)

    async def _establish(self) -> StoreEpoch:
        epoch, keys = self, self.keys
        found = await epoch._read()
        if all(v is None for v in found):
            await epoch._initialise()
            found = await epoch._read()
        anchor = found[ANCHOR]
        if anchor is None:
            # The anchor is written before any other shard, but on a cluster the read spans
            # nodes in no set order: it may have read the anchor's node before a racing
            # process initialised and the others after. Read once more, now that another
            # shard is seen: only a lost anchor is still missing.
            anchor = found[ANCHOR] = _parse(await self.redis.get(keys.epoch(ANCHOR)))
        if anchor is None:
            present = [s for s, v in enumerate(found) if v is not None]
            raise StoreEpochError(keys.ns, "missing", [ANCHOR], expected=_id(found[present[0]]))
        missing = [s for s, v in enumerate(found) if v is None]
        if missing:
            if now_ms() - int(anchor.get("created_ms", 0)) > INIT_GRACE_MS:
                raise StoreEpochError(keys.ns, "missing", missing, expected=_id(anchor))
            await epoch._fill(anchor, missing)
            found = await epoch._read()
        other = [s for s, v in enumerate(found) if _id(v) != _id(anchor)]
        if other:
            raise StoreEpochError(keys.ns, "mixed", other, expected=_id(anchor),
                                  found=_id(found[other[0]]))
        layout = anchor.get("layout", 1)
        if layout != STORE_LAYOUT:
            raise StoreLayoutError(keys.ns, layout if isinstance(layout, int) else 0,
                                   STORE_LAYOUT)
        epoch.id, epoch.created_ms = _id(anchor), int(anchor.get("created_ms", 0))
        log.info("store_epoch_established", namespace=keys.ns, epoch=epoch.id,
                 created_ms=epoch.created_ms, shards=keys.shards)
        return epoch

    async def verify(self) -> None:
        """Raise StoreEpochError unless every shard still carries the epoch seen at start."""
        found = await self._read()
        missing = [s for s, v in enumerate(found) if v is None]
        if missing:
            self._stop("missing", missing, "")
        changed = [s for s, v in enumerate(found) if _id(v) != self.id]
        if changed:
            self._stop("changed", changed, _id(found[changed[0]]))

    async def watch(self, stopping: asyncio.Event, interval_s: float, *,
                    idle_s: float | None = None, busy: Callable[[], bool] | None = None,
                    woken: asyncio.Event | None = None) -> None:
        """Verify every ``interval_s`` until ``stopping`` is set; raises StoreEpochError.

        With ``busy`` and ``woken`` (set by the process when work arrives), a process that
        is not busy checks only every ``idle_s`` (an idle stack spends almost nothing on it),
        and at once when ``woken`` is set: the work that ends an idle spell is what lost
        state would harm. An unreachable Redis is not lost state: it is checked again once
        it answers.
        """
        while not stopping.is_set():
            try:
                await self.verify()
            except REDIS_ERRORS as exc:
                log.debug("store_epoch_check_skipped", error=str(exc))
            if busy is None or woken is None or idle_s is None:
                await _first(interval_s, stopping)
                continue
            woken.clear()
            if busy():
                await _first(interval_s, stopping)
            else:
                await _first(idle_s, stopping, woken)

    # ------------------------------------------------------------------ internals

    def _stop(self, reason: str, shards: list[int], found: str) -> None:
        err = StoreEpochError(self.keys.ns, reason, shards, expected=self.id, found=found)
        log.error("store_epoch_lost", namespace=self.keys.ns, reason=reason, shards=err.shards,
                  expected=self.id, found=found)
        raise err

    async def _read(self) -> list[dict[str, Any] | None]:
        names = [self.keys.epoch(shard) for shard in range(self.keys.shards)]
        if not is_cluster(self.redis):  # one command; on a Cluster the keys span slots
            found = await self.redis.mget(names)
            if all(raw is not None for raw in found):
                return [_parse(raw) for raw in found]
            # MGET answers nil for a key of another type too: the reads below tell a
            # missing epoch from a wrong-typed key (WRONGTYPE), as they always did
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
        return [_parse(raw) for raw in await pipe.execute()]

    async def _initialise(self) -> None:
        value = json.dumps({"v": 1, "id": uuid.uuid4().hex, "created_ms": now_ms(),
                            "layout": STORE_LAYOUT})
        await self.redis.setnx(self.keys.epoch(ANCHOR), value)  # SETNX: what the ACLs grant
        anchor = _parse(await self.redis.get(self.keys.epoch(ANCHOR)))
        if anchor is not None:
            await self._fill(anchor, [s for s in range(self.keys.shards) if s != ANCHOR])
            log.info("store_epoch_created", namespace=self.keys.ns, epoch=_id(anchor))

    async def _fill(self, anchor: dict[str, Any], shards: list[int]) -> list[int]:
        """Write ``anchor`` to these shards where they have none (SETNX); the shards
        written."""
        value = json.dumps(anchor)
        pipe = self.redis.pipeline(transaction=False)
        for shard in shards:
            pipe.setnx(self.keys.epoch(shard), value)
        return [shard for shard, set_ in zip(shards, await pipe.execute(), strict=True)
                if set_]

    @classmethod
    async def restore(cls, redis: Any, keys: Keys, survey: EpochSurvey) -> list[int] | None:
        """Accept the loss ``survey`` shows: its epoch written to the shards missing one
        (``baton accept-loss``); the shards written, or None when no shard carries that
        epoch any more (the store changed since the survey)."""
        epoch = cls(redis, keys)
        kept = [v for v in await epoch._read() if v is not None and _id(v) == survey.id]
        if not kept:
            return None
        return await epoch._fill(kept[0], list(survey.missing))


async def _first(seconds: float, *events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set or ``seconds`` passed."""
    if any(e.is_set() for e in events):
        return
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _parse(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"id": f"unreadable:{str(raw)[:32]}"}
    return value if isinstance(value, dict) else {"id": f"unreadable:{str(raw)[:32]}"}


def _id(value: dict[str, Any] | None) -> str:
    return str(value.get("id", "")) if value else ""
