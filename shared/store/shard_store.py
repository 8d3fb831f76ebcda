"""The relay's shard work beside the rows: relay leases, timers, requests waiting in inboxes.

Live relays divide the shards by fenced leases (``relay_lease.lua``): a relay fires timers
(``fire_timers.lua``) and arms the deadlines of requests still waiting in an inbox
(``arm_requests.lua``) only on the shards it holds, each script refusing a holder whose
fence is no longer the shard's. :class:`ShardStore` owns these keys and scripts and the
backlog gauge's reads; :class:`~baton.store.outbox.Outbox` adds the outbox and wakes
streams' rows to it (see there for how they are read and acknowledged).

With a :class:`~baton.store.replication.ReplicatedWrites` (a cluster, ``min_replicas`` > 0)
a shard script's writes (a timer firing, a relay ack) are acknowledged only once a replica
has them; the scripts are idempotent, so a write in doubt is simply retried.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from baton.errors import ValidationError
from baton.store.keys import Keys
from baton.store.redis_client import REDIS_ERRORS, is_cluster, run_batch
from baton.store.replication import ReplicatedWrites
from baton.store.scripts import Scripts

__all__ = ["Backlog", "LeaseAnswer", "ShardStore"]

# A session's inbox key, "<ns>:{<ns>-<shard>}:s:<session id>:inbox" (checked against the
# session's own key, so a key of another shard or namespace is skipped).
_INBOX_KEY = re.compile(r"^[^{]*\{[^}]*\}:s:(.+):inbox$")


@dataclass(frozen=True, slots=True)
class Backlog:
    shard: int
    rows: int
    oldest_ms: int | None
    pending: int


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """A relay lease script's answer: ``ok`` with this relay's ``fence``, or the holder.

    ``holder`` of an acquisition that succeeded: the relay whose lease had lapsed ('' when
    the shard was free or ours)."""

    ok: bool
    fence: int = 0
    holder: str = ""


class ShardStore:
    """Relay-lease, timer and waiting-request operations over the shards of a namespace."""

    def __init__(self, redis: Redis, keys: Keys, *,
                 writes: ReplicatedWrites | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = Scripts(redis)
        #: Replica acknowledgement of acks and timer firings (None: a primary's reply is enough).
        self.writes = writes if writes is not None and writes.min_replicas > 0 else None
        self.cluster = is_cluster(redis)

    def _streams(self, shard: int) -> list[str]:
        """A shard's streams of rows to publish: its outbox and its wakes."""
        return [self.keys.outbox(shard), self.keys.wakes(shard)]

    async def lease(self, op: str, shard: int, holder: str, ttl_ms: int,
                    fence: int = 0) -> LeaseAnswer:
        """Acquire, renew or release the relay lease of a shard (see relay_lease.lua)."""
        reply = await self.scripts.relay_lease(
            keys=[self.keys.relay_lease(shard)], args=[op, holder, ttl_ms, fence])
        if int(reply[0]) == 1:  # an acquire names the relay whose lease had lapsed, if any
            return LeaseAnswer(True, int(reply[1]), str(reply[2]) if len(reply) > 2 else "")
        return LeaseAnswer(False, int(reply[2]) if op != "acquire" else 0, str(reply[1]))

    async def renew_all(self, held: dict[int, int], holder: str, ttl_ms: int,
                        failed: dict[int, Exception] | None = None) -> dict[int, LeaseAnswer]:
        """Renew the leases of every held shard (``shard -> fence``): one script call for
        all of them on a single server (relay_lease.lua takes several keys there), one
        call per shard on a Redis Cluster, where a script's keys share one slot.

        With ``failed``, a shard whose call fails on a cluster (its primary down or
        refusing writes) is left out of the answer and its error put there, so the shards
        of the healthy primaries are still renewed; without it, the first error raises."""
        if self.cluster or len(held) < 2:
            out: dict[int, LeaseAnswer] = {}
            for shard, fence in held.items():
                try:
                    out[shard] = await self.lease("renew", shard, holder, ttl_ms, fence)
                except REDIS_ERRORS as exc:
                    if failed is None:
                        raise
                    failed[shard] = exc
            return out
        replies = await self.scripts.relay_lease(
            keys=[self.keys.relay_lease(shard) for shard in held],
            args=["renew", holder, ttl_ms, *held.values()])
        return {shard: LeaseAnswer(True, int(r[1])) if int(r[0]) == 1
                else LeaseAnswer(False, int(r[2]), str(r[1]))
                for shard, r in zip(held, replies, strict=True)}

    async def look(self, shards: list[int]) -> dict[int, tuple[str, int]] | None:
        """Each shard's lease holder and the ms it has left (``''``/0 when free), in one
        read-only call; None on a Redis Cluster, where it would take a call per shard."""
        if self.cluster or not shards:
            return None
        replies = await self.scripts.relay_lease(
            keys=[self.keys.relay_lease(shard) for shard in shards], args=["look", "", 0])
        return {shard: (str(r[0]), int(r[1])) for shard, r in zip(shards, replies, strict=True)}

    async def fire_timers(self, shard: int, limit: int, rearm_ms: int, holder: str,
                          fence: int) -> int:
        """Turn due timers of a shard into outbox wake rows; returns how many fired, or -1
        when ``holder`` no longer holds the shard's lease with ``fence``.

        The shard's ``limit`` earliest timers are read first, so the script can declare
        the keys of their sessions (see fire_timers.lua): one more round trip, made only
        when a timer is due (the relay's timer loop reads each shard's earliest first)."""
        prefix = f"{self.keys.ns}:{self.keys.tag(shard)}:s:"
        due = await self.redis.zrange(self.keys.timers(shard), 0, limit - 1)
        sessions: dict[str, None] = {}
        for member in due:
            parts = (member.decode() if isinstance(member, bytes) else str(member)).split("|")
            if len(parts) >= 4:
                sessions[parts[1]] = None
        return int(await self._write(
            "fire_timers",
            [self.keys.timers(shard), self.keys.outbox(shard), self.keys.relay_lease(shard),
             *(f"{prefix}{sid}:{k}" for sid in sessions for k in ("meta", "inbox", "nudge"))],
            [limit, rearm_ms, prefix, holder, fence]))

    async def waiting_requests(self, shards: list[int]) -> dict[int, list[str]]:
        """The sessions of ``shards`` whose inbox holds requests (shard -> session ids), by
        one ``SCAN`` of the keyspace (of every primary, on a cluster): the inbox is the one
        key a client's request writes, so this finds a request whatever became of its wake."""
        wanted, found = set(shards), dict[int, list[str]]()
        pattern = f"{self.keys.ns}:{{{self.keys.ns}-*}}:s:*:inbox"
        async for key in self.redis.scan_iter(match=pattern, count=1000, _type="hash"):
            key = key.decode() if isinstance(key, bytes) else key
            m = _INBOX_KEY.match(key)
            try:
                sk = self.keys.session(m.group(1)) if m else None
            except ValidationError:
                continue
            if sk is not None and sk.inbox == key and sk.shard in wanted:
                found.setdefault(sk.shard, []).append(sk.session_id)
        return found

    async def requested(self, shards: list[int], limit: int) -> dict[int, list[str]]:
        """The sessions of ``shards`` whose request wakes were published since the last sweep
        (the ``requested`` set the relay writes with its acks, see ``Outbox.requests``), at
        most ``limit`` per shard, oldest first: shard -> session ids, in one round trip (a
        read per shard on a cluster). What the sweep costs grows with the requests since,
        not with the sessions kept."""
        if not shards:
            return {}
        replies = await run_batch(self.redis, [
            ("ZRANGE", self.keys.requested(shard), 0, limit - 1) for shard in shards])
        found: dict[int, list[str]] = {}
        for shard, reply in zip(shards, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply:
                found[shard] = [m.decode() if isinstance(m, bytes) else str(m) for m in reply]
        return found

    async def arm_requests(self, shard: int, session_ids: list[str], holder: str,
                           fence: int, deadline_ms: int) -> int:
        """Arm, due ``deadline_ms`` from now, the progress deadline of each session whose
        inbox still holds requests, and drop the sessions from the shard's ``requested``
        set (``arm_requests.lua``); returns how many were armed, or -1 when ``holder`` no
        longer holds the shard's lease with ``fence``."""
        prefix = f"{self.keys.ns}:{self.keys.tag(shard)}:s:"
        return int(await self._write(
            "arm_requests", [self.keys.timers(shard), self.keys.relay_lease(shard),
                             self.keys.sessions(shard), self.keys.requested(shard),
                             *(f"{prefix}{sid}:{k}" for sid in session_ids
                               for k in ("inbox", "poison", "meta"))],
            [holder, fence, prefix, deadline_ms, *session_ids]))

    async def _write(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a shard script; with :attr:`writes`, answered once a replica has its writes.

        The commit id only names the attempt in logs: both scripts are idempotent (an ack of
        deleted rows acks nothing, a fired timer is gone or re-armed), so they need no
        applied-reply record.
        """
        script = getattr(self.scripts, name)
        if self.writes is None:
            return await script(keys=keys, args=args)
        reply, _ = await self.writes.run(script, keys, args, commit_id=uuid.uuid4().hex,
                                         what=name)
        return reply

    async def timer_heads(self, shards: list[int]) -> tuple[int, dict[int, int]]:
        """Redis' clock (ms) and each shard's earliest timer.

        One round trip on a single server; on a cluster TIME cannot ride in a pipeline
        (it has no key to route by), so the clock is one more call, to any node: the
        scripts compare due times with their own node's clock, this only sizes the sleep.
        """
        async with self.redis.pipeline(transaction=False) as p:
            if not self.cluster:
                p.time()
            for shard in shards:
                p.zrange(self.keys.timers(shard), 0, 0, withscores=True)
            replies = await p.execute()
        clock = await self.redis.time() if self.cluster else replies.pop(0)
        sec, usec = clock
        heads = {s: int(r[0][1]) for s, r in zip(shards, replies, strict=True) if r}
        return int(sec) * 1000 + int(usec) // 1000, heads

    async def backlog(self) -> list[Backlog]:
        async with self.redis.pipeline(transaction=False) as p:
            for s in range(self.keys.shards):
                for key in self._streams(s):
                    p.xlen(key)
                    p.xrange(key, "-", "+", count=1)
            replies = await p.execute()
        out = []
        for s in range(self.keys.shards):
            n, first, wn, wfirst = replies[4 * s:4 * s + 4]
            heads = [int(f[0][0].split("-")[0]) for f in (first, wfirst) if f]
            out.append(Backlog(shard=s, rows=int(n) + int(wn),
                               oldest_ms=min(heads) if heads else None, pending=0))
        return out
