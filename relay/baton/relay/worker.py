"""The relay: moves committed outbox rows to JetStream and fires due timers.

Live relays divide the shards by fenced leases (:mod:`baton.relay.leases`); a relay works
only on the shards it holds. Loops of one :class:`Relay`, children of one task group:

* **leases**: renew the held shards' leases and rebalance (take free or expired shards,
  hand on a surplus when another relay joins): every third of the lease time, every half
  of it while this relay holds every shard.
* **read**: one blocking ``XREADGROUP`` per read group of the held shards (all of them on
  one server; one per shard on a Redis Cluster, where a multi-key read cannot span slots),
  each on its own connection; it wakes as soon as a commit adds a row. The batch goes out
  in one concurrent publish with ``Nats-Msg-Id`` = row id, then each shard's rows are
  acknowledged and deleted by one script that checks the shard's lease fence. A row is
  removed only after NATS acknowledged it, so delivery is at least once; a re-publish
  within the stream's duplicate window is dropped by NATS.
* **claim**: rows another relay read but never acknowledged (it died, or lost the shard)
  are claimed after ``relay_claim_idle_ms`` and published here.
* **timers** (:class:`~baton.relay.timers.TimerLoop`): due timers of the held shards
  become wake rows (``fire_timers.lua``, also fenced by the lease), which the read loop
  sends on; the held shards' inboxes are swept for requests no Brain took up. Moved rows
  and Brains' timer notifications make it look often for a while; idle, it sleeps until its earliest
  timer is due.
* **announce**: the liveness record ``inspect`` shows and the relays count each other by,
  written on the lease loop's ticks (every second or third: about every
  ``ANNOUNCE_EVERY_S``, never later), so an idle relay wakes once for both.

Reading, claiming and acknowledging rows and reading the timer heads go through
:class:`~baton.store.outbox.Outbox`, which owns the outbox's key layout and reply shapes;
the relay owns the loops; :class:`~baton.relay.publisher.Publisher` the publish (the one place
rows become messages) and dead-lettering; :mod:`baton.relay.failures` what is retried, and
the backoff.

Failures: a row NATS can never accept (subject outside the namespace's streams, payload
over the limit, malformed headers or row) is recorded as a dead letter and acknowledged, so
it never blocks the rows behind it. When NATS is unreachable the rows stay pending in the
outbox and are re-sent with a capped backoff until it is back (streams are re-ensured, in
case the server came back without them); Redis errors are retried the same way, and after a
Redis restart the consumer groups are recreated by :class:`~baton.store.outbox.Outbox`.
While a stream has no leader (its node died; the survivors elect another in 4 to 9 s) the
rows it refuses, and the rows committed meanwhile, read at once, go around it as core NATS
copies (:mod:`baton.bus.fallback`); they stay pending until the stream takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from baton.bus.bus import Bus
from baton.bus.consumers import ConsumerMaker
from baton.errors import ForbiddenError
from baton.faults import Faults
from baton.observability.log import bounded, error_text, get_logger
from baton.observability.tracing import sample_backlog, work_backlog
from baton.service import Service, run_until_signalled, tune_collector, wait_either
from baton.settings import Settings
from baton.store.admission import AdmissionQueue
from baton.store.capacity import mark_bus_full, stream_full
from baton.store.epoch import StoreEpoch
from baton.store.keys import Keys
from baton.store.outbox import Outbox
from baton.store.redis_client import connect_redis
from baton.store.replication import ReplicatedWrites
from baton.store.workers import ANNOUNCE_EVERY_S

from .failures import NATS_DOWN, REDIS_DOWN, Backoff, reraise_cancel
from .leases import ShardLeases
from .publisher import Counts, Publisher, Sent
from .timers import TimerLoop

__all__ = ["Relay", "main"]

log = get_logger("baton.relay")

# A blocked XREADGROUP returns at once when a row arrives, so the block time only bounds how
# long an idle reader sits in one call; shutdown and regrouping cancel a blocked reader.
# Each empty return wakes the relay and Redis to send the read again. The reader's socket
# timeout is the block time plus 5 s: 10 s, as every other connection's, to notice a
# connection gone silent (a dead connection that is closed or reset fails at once).
_BLOCK_MS = 5_000
#: How long a failed publish's retry looks for the streams (see Relay._retry).
_STREAMS_LOOK_S = 1.0
#: A read while a stream has no leader blocks this long at most, so the reader sees its
#: end (regrouping, stopping) soon (see Relay._read_around).
_AROUND_BLOCK_S = 0.25
# An idle relay whose last look found no pending rows looks this many times less often.
_CLAIM_QUIET_FACTOR = 10


class Relay(Service):
    """Outbox relay and timer service; run with :meth:`serve`, stop with :meth:`shutdown`."""

    role = "relay"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.keys = Keys(settings.namespace, settings.shards)
        self.faults = Faults(settings.fault)
        self._redis: Redis | None = None
        self._reader: Redis | None = None  # only for the blocking reads and their acks
        self.leases: ShardLeases | None = None
        # Held while rows are in hand, so the claim loop never takes (and re-sends) rows a
        # read loop is still publishing: XAUTOCLAIM does not skip our own consumer.
        self._in_hand = asyncio.Lock()
        self.counts = Counts()
        self.publisher = Publisher(settings, self.name, self.keys, self.faults, self.counts)
        self.timers = TimerLoop(settings, self.name, self.counts, self.stopping)
        self._claim_woken = asyncio.Event()  # rows moved or shards taken: rows may go stale

    @property
    def shards(self) -> list[int]:
        """The shards this relay holds now."""
        return self.leases.held_shards() if self.leases is not None else []

    # ------------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        s = self.settings
        self._redis = connect_redis(s)
        self._reader = connect_redis(s, socket_timeout=_BLOCK_MS / 1000 + 5.0)
        # Acks and timer firings wait for a replica, as commits do (see baton.store.outbox).
        box, reader_box = (
            Outbox(r, self.keys, writes=ReplicatedWrites(
                r, min_replicas=s.min_replicas(), timeout_ms=s.redis_replica_timeout_ms,
                retry_ms=s.redis_in_doubt_retry_ms))
            for r in (self._redis, self._reader))
        self.leases = ShardLeases(box, self.name, s.shards, s.lease_ms)
        try:
            if not await self._connect(box):
                return
            assert self.bus is not None
            self.publisher.attach(self.bus, self._redis, self.leases)
            redis = self._redis
            epoch = await self.connect("redis", lambda: StoreEpoch.establish(redis, self.keys))
            await self._listen_for_timer_notifications()
            # Brains and Hands logging in as their roles ask a relay for their consumers.
            await ConsumerMaker(self.bus).listen()
            self.ready.set()
            log.info("relay_started", worker=self.name, shards=s.shards)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._lease_loop(), name="relay-leases")
                tg.create_task(self._read_loop(reader_box), name="relay-read")
                tg.create_task(self._claim_loop(box), name="relay-claim")
                tg.create_task(self.timers.run(box, self.leases), name="relay-timers")
                tg.create_task(self.watch_epoch(epoch), name="relay-epoch")
                # The backlog gauges (a no-op without telemetry metrics): the outbox, and the
                # work waiting for Brains and Hands that the autoscalers read.
                tg.create_task(sample_backlog(box, self.wait_stopping, work=self._work_backlog),
                               name="relay-backlog")
        finally:
            with contextlib.suppress(*REDIS_DOWN):  # a graceful stop hands the shards on
                await self.leases.release_all()
            if self.ready.is_set():
                await self.withdraw(self._redis, self.keys)
            if self.bus is not None:
                with contextlib.suppress(Exception):
                    await self.bus.close()
            await self._reader.aclose()
            await self._redis.aclose()
            log.info("relay_stopped", worker=self.name, **self.counters())

    def counters(self) -> dict[str, int]:
        return self.counts.as_dict()

    async def _work_backlog(self) -> dict[tuple[str, str, str], int]:
        """The work waiting for Brains and Hands (the ``baton.backlog`` gauge)."""
        assert self.bus is not None and self._redis is not None
        return await work_backlog(self.bus.nc.jetstream(), self.bus.names,
                                  AdmissionQueue(self._redis, self.keys, self.settings))

    async def _connect(self, box: Outbox) -> bool:
        """Reach both servers and set up streams and groups; retry until up or stopping."""
        assert self._redis is not None
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                await self._redis.ping()
                if self.bus is None:
                    self.bus = await Bus.connect(self.settings, self.name, self.role)
                await self.bus.ensure_streams()
                deferred: dict[int, Exception] = {}
                # On a Redis Cluster one primary refusing writes (its replica gone) defers
                # its shards' groups, not the relay: it serves the others meanwhile.
                await box.ensure_groups(failed=deferred if box.cluster else None)
                if deferred and len(deferred) == self.settings.shards:
                    raise next(iter(deferred.values()))
                if deferred:
                    log.warning("relay_groups_deferred", shards=sorted(deferred),
                                error=error_text(next(iter(deferred.values()))))
                return True
            except (*REDIS_DOWN, *NATS_DOWN) as exc:
                delay = backoff.next()
                log.warning("relay_connect_retry", error=error_text(exc), delay_s=delay)
                await self.wait_stopping(delay)
        return False

    async def _listen_for_timer_notifications(self) -> None:
        """Brains' timer notifications wake the timer loop (nats-py re-subscribes on
        reconnect)."""
        assert self.bus is not None

        async def notified(_msg: object) -> None:
            self._mark_active()

        await self.bus.nc.subscribe(self.bus.names.timers_subject, cb=notified)

    # ------------------------------------------------------------------ loops

    async def _lease_loop(self) -> None:
        """Hold a fair share of the shards (see :mod:`baton.relay.leases`), and announce
        this relay on the same wake-ups: at a tick, when the announcement falls due before
        the next tick (early, never late); between ticks only when they are further apart
        than ``ANNOUNCE_EVERY_S`` (a long lease)."""
        assert self.leases is not None and self._redis is not None
        backoff = Backoff()
        now = time.monotonic()
        next_tick = next_announce = now
        while True:
            if now >= next_tick:
                before = set(self.leases.held)
                try:
                    await self.leases.tick(int(time.time() * 1000))
                    if not before.issuperset(self.leases.held):
                        # Shards taken: look at their timers and for stale rows once, now.
                        self.timers.look_now()
                        self._claim_woken.set()
                    backoff.reset()
                    # From the tick's start: a renewal's new expiry counts from before it
                    # was sent.
                    next_tick = now + self.leases.next_tick_s()
                except REDIS_DOWN as exc:
                    reraise_cancel()
                    delay = min(backoff.next(), self.leases.tick_s)
                    log.warning("relay_leases_failed", error=error_text(exc), delay_s=delay)
                    next_tick = time.monotonic() + delay
            if next_tick > next_announce:  # due before the next tick: now
                next_announce = now + ANNOUNCE_EVERY_S
                try:  # bounded: a stalled write must not hold the next renewal back
                    async with asyncio.timeout(self.leases.tick_s / 2):
                        await self.announce_once(self._redis, self.keys)
                except TimeoutError:
                    self.redis_reachable = False
                if not self.redis_reachable:
                    next_announce = next_tick  # not written: again at the next tick
            if await self.wait_stopping(max(0.0, min(next_tick, next_announce)
                                            - time.monotonic())):
                return
            now = time.monotonic()

    async def _read_loop(self, box: Outbox) -> None:
        """One blocking reader per read group of the held shards; regrouped whenever the
        leases change. A reader blocked in XREADGROUP is cancelled (rows the server handed
        it stay pending and are claimed again); one with rows in hand finishes them."""
        assert self.leases is not None
        leases = self.leases
        while not self.stopping.is_set():
            leases.changed.clear()
            done = asyncio.Event()
            readers = [asyncio.create_task(self._reader_loop(box, group, done),
                                           name=f"relay-read-{group[0]}")
                       for group in box.groups(leases.held_shards())]
            stop = asyncio.create_task(wait_either(self.stopping, leases.changed, None))
            try:
                await asyncio.wait([stop, *readers], return_when=asyncio.FIRST_COMPLETED)
            finally:
                done.set()
                stop.cancel()
                for task in readers:
                    if getattr(task, "blocked", False):
                        task.cancel()
                results = await asyncio.gather(*readers, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                        result, asyncio.CancelledError):
                    raise result

    async def _reader_loop(self, box: Outbox, shards: list[int], done: asyncio.Event) -> None:
        """Publish the rows of ``shards``: first this relay's own pending rows, then new ones
        as they arrive (a blocking XREADGROUP on its own connection).

        A batch read and published is acknowledged in the same round trip as the read of
        the next (:meth:`Outbox.ack_and_read`); its rows count as in hand until then. The
        reader may be cancelled only while blocked in a read, after the acks' replies.
        """
        me = asyncio.current_task()
        assert self.leases is not None
        leases = self.leases
        backoff = Backoff()
        resend = True  # our own pending rows first: a restart under a stable name
        sent: Sent | None = None  # published, not acknowledged yet: _in_hand is held

        def drop_sent() -> None:  # the rows stay pending: resent (deduplicated) if not acked
            nonlocal sent
            if sent is not None:
                sent = None
                self._in_hand.release()

        def acked(lost: dict[int, str]) -> None:
            if sent is not None:
                self.publisher.settle(sent, lost)
                drop_sent()
            if done.is_set():  # stopping or regrouping meanwhile: the read is not waited for
                raise _ReaderDone
            me.blocked = True  # type: ignore[union-attr]

        try:
            while not done.is_set():
                try:
                    if resend:
                        async with self._in_hand:
                            rows, resend = await box.read_pending(
                                shards, self.name, self.settings.relay_batch)
                            if rows:
                                await self.publisher.deliver(rows, box, "pending")
                    else:
                        try:
                            if sent is None:
                                me.blocked = True  # type: ignore[union-attr]
                                rows = await box.read(shards, self.name,
                                                      self.settings.relay_batch, _BLOCK_MS)
                            else:
                                rows = await box.ack_and_read(
                                    sent.rows, self.name, dict(leases.held), shards,
                                    self.settings.relay_batch, _BLOCK_MS, acked, sent.requests)
                        finally:
                            me.blocked = False  # type: ignore[union-attr]
                        if rows:
                            self._mark_active()
                            await self._in_hand.acquire()
                            try:
                                sent = await self.publisher.publish(rows, box, "read")
                            finally:
                                if sent is None:
                                    self._in_hand.release()
                    backoff.reset()
                except _ReaderDone:  # rows the abandoned read took are pending: resent
                    break
                except NATS_DOWN as exc:
                    drop_sent()
                    resend = True  # the rows in hand are in our pending list
                    await self._retry("nats", exc, backoff, around=(box, shards, done))
                except ForbiddenError as exc:
                    # The deployment's permissions, not the rows, are wrong: keep them, retry.
                    drop_sent()
                    resend = True
                    log.error("outbox_publish_forbidden", error=bounded(exc))
                    await self._retry("nats", exc, backoff)
                except REDIS_DOWN as exc:
                    drop_sent()
                    resend = True
                    await self._retry("redis", exc, backoff)
        finally:
            if sent is not None:  # stopping or regrouping: the last batch's ack, now
                try:
                    with contextlib.suppress(*REDIS_DOWN):
                        self.publisher.settle(sent, await box.ack(
                            sent.rows, self.name, dict(leases.held), sent.requests))
                finally:
                    drop_sent()

    async def _claim_loop(self, box: Outbox) -> None:
        idle = self.settings.relay_claim_idle_ms
        quiet = False  # the last look found nothing pending
        while True:
            if quiet and not self.busy():
                # Rows become pending only by a read (rows moving) or with a shard taken
                # from another relay, and both wake this loop: an idle relay looks rarely.
                stopping = await wait_either(self.stopping, self._claim_woken,
                                             _CLAIM_QUIET_FACTOR * idle / 2000)
            else:
                stopping = await self.wait_stopping(idle / 2000)
            if stopping:
                return
            self._claim_woken.clear()
            try:  # one round trip tells which shards have rows read but not acknowledged
                pending = await box.pending_counts(list(self.shards))
            except REDIS_DOWN as exc:
                reraise_cancel()
                quiet = False
                log.warning("outbox_claim_failed", server="redis", error=error_text(exc))
                continue
            quiet = not any(pending.values())
            for shard in [s for s, n in pending.items() if n]:
                if self.stopping.is_set():
                    return
                try:
                    async with self._in_hand:
                        rows = await box.claim_stale(
                            shard, self.name, idle, self.settings.relay_batch
                        )
                        if not rows:
                            continue
                        self.counts.claimed += len(rows)
                        log.info("outbox_rows_claimed", shard=shard, rows=len(rows))
                        await self.publisher.deliver(rows, box, "claim")
                except (*NATS_DOWN, ForbiddenError) as exc:
                    reraise_cancel()
                    # Claimed rows are ours now: the next claim round (our own idle rows)
                    # or the shard's reader (its pending read) sends them again.
                    log.warning("outbox_claim_failed", server="nats", error=error_text(exc))
                    break
                except REDIS_DOWN as exc:
                    reraise_cancel()
                    log.warning("outbox_claim_failed", server="redis", error=error_text(exc))
                    break

    def _mark_active(self) -> None:
        """Rows moved (or a timer notification): timers tick fast for a while (woken now if
        they were idle), and the claim loop looks for stale rows again."""
        self._claim_woken.set()
        if not self.busy():
            self.woken.set()
        self.timers.wake()

    def busy(self) -> bool:
        """Rows moved within the last few seconds."""
        return self.timers.busy()

    @property
    def timer_wait_s(self) -> float:
        """How long the timer loop's current wait may last (0 before its first look)."""
        return self.timers.wait_s

    # ------------------------------------------------------------------ steps

    async def _retry(self, server: str, exc: BaseException, backoff: Backoff,
                     around: tuple[Outbox, list[int], asyncio.Event] | None = None) -> None:
        """Wait before a failed publish or Redis call is tried again. With ``around`` (a
        reader's outbox, shards and end), while the stream has no leader, the wait reads the
        rows committed meanwhile and sends them around the stream (:meth:`_read_around`)."""
        reraise_cancel()
        self.counts.retries += 1
        delay = backoff.next()
        full = stream_full(exc) if server == "nats" else ""
        if full:  # clients refuse new input while JetStream has no room (store.capacity)
            try:
                await mark_bus_full(self._redis, self.keys, full)
            except REDIS_DOWN as err:
                log.warning("bus_full_unannounced", error=error_text(err))
        log.warning("outbox_publish_retry", server=server, error=error_text(exc), delay_s=delay)
        # The reader's idle connections went down with the one that failed (a server
        # restart): dropped, so the retry connects afresh instead of failing on each. A
        # Redis Cluster client has no one pool: it drops a failed node's connections itself.
        pool = getattr(self._reader, "connection_pool", None)
        if isinstance(exc, RedisConnectionError) and pool is not None:
            with contextlib.suppress(*REDIS_DOWN):
                await pool.disconnect(inuse_connections=False)
        bus = self.bus
        looking = server == "nats" and bus is not None and bus.nc.is_connected
        if around is not None and self.publisher.going_around:
            # the look runs beside the reads: rows committed meanwhile go around at once
            look = asyncio.create_task(self._look_for_streams()) if looking else None
            try:
                await self._read_around(*around, delay, look)
            finally:
                if look is not None and not look.done():
                    look.cancel()
            return
        if await self.wait_stopping(delay):
            return
        if looking:
            await self._look_for_streams()

    async def _look_for_streams(self) -> None:
        """After a failed publish, with NATS reachable: the server may have come back
        without our streams, so look (and make them).

        A look, not a wait: a stream whose leader died answers nothing until the survivors
        elect another (4 to 9 s in nats-server), and each unanswered JetStream call waits
        out its timeout (5 s) before the settling retries; a reader blocked here publishes
        nothing for seconds after the election. A missing stream answers at once (404), and
        is created well within the bound."""
        assert self.bus is not None
        try:
            async with asyncio.timeout(_STREAMS_LOOK_S):
                await self.bus.ensure_streams()
        except TimeoutError:
            log.info("streams_unanswered", note="a stream without a leader (an "
                     "election under way?): the next retry looks again")
        except Exception as err:
            log.warning("streams_ensure_failed", error=error_text(err))

    async def _read_around(self, box: Outbox, shards: list[int], done: asyncio.Event,
                           delay: float, look: asyncio.Task[None] | None) -> None:
        """For ``delay`` s, and until ``look`` ended, read the rows committed to ``shards``
        and send them around their leaderless stream at once (they join this relay's
        pending rows, which the next try publishes to the stream), rather than only wait:
        one session's hops then take milliseconds, not a retry delay each; until the relay
        stops or the reader ends."""
        end = time.monotonic() + delay
        while not (self.stopping.is_set() or done.is_set()):
            left = end - time.monotonic()
            if look is not None and not look.done():
                left = max(left, _AROUND_BLOCK_S)
            elif left <= 0:
                break
            try:
                rows = await box.read(shards, self.name, self.settings.relay_batch,
                                      max(1, int(min(left, _AROUND_BLOCK_S) * 1000)))
                if rows:
                    self._mark_active()
                    await self.publisher.around(rows, box)
            except REDIS_DOWN as exc:
                reraise_cancel()
                log.warning("outbox_read_around_failed", error=error_text(exc))
                await self.wait_stopping(max(0.0, end - time.monotonic()))
                return


class _ReaderDone(Exception):
    """A reader told to end (``done``) while its acks and next read were in flight."""


async def main(settings: Settings) -> None:
    """Entry point of ``baton relay``: serve until SIGTERM/SIGINT (logging set by the CLI)."""
    tune_collector()
    await run_until_signalled(Relay(settings))
