"""The one place outbox rows become NATS messages: check, publish, dead-letter, settle.

:class:`Publisher` publishes a batch of rows with ``Nats-Msg-Id`` = row id, dead-letters the
rows NATS could never accept (subject outside the namespace's streams, payload over the
limit, malformed headers, a Hands' wake row for another session), and, once the batch's
acknowledgement is in (:meth:`~baton.store.outbox.Outbox.ack`), counts it in the relay's
:class:`Counts`. It raises, and the rows stay pending, when NATS or Redis is unavailable
(:mod:`baton.relay.failures`); the relay's loops retry.

While a stream has no leader (503 at once: the node leading it died, and the survivors
elect another after 4 to 9 s), the rows it refuses are also sent around it as core NATS
copies on their fallback subjects, again with each try until a worker took the copy
(:meth:`Publisher.around`, :mod:`baton.bus.fallback`): a worker acts on the copy now, and
on the stored message, a duplicate its fences turn away, once the stream takes it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

import nats.errors
import nats.js.errors
from redis.asyncio import Redis

from baton.bus.bus import Bus
from baton.bus.messages import Outgoing, carrier_headers
from baton.errors import NatsUnavailable, ValidationError
from baton.faults import Faults
from baton.models import OutboxRow
from baton.observability.log import bounded, get_logger
from baton.observability.propagation import trace_id_of
from baton.settings import Settings
from baton.store.deadletter import record_dead_letter
from baton.store.keys import Keys
from baton.store.outbox import Outbox

from .failures import NATS_DOWN
from .leases import ShardLeases

__all__ = ["Counts", "Publisher", "Sent"]

log = get_logger("baton.relay")

_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # printable ASCII without ':'
# Errors meaning "this message will never be accepted": dead-letter it, do not retry.
_REFUSED = (ValidationError, nats.errors.MaxPayloadError, nats.errors.BadSubjectError,
            nats.errors.BadHeaderError, nats.js.errors.BadRequestError)
# Errors of a publish meaning "the stream has no leader now" (no server answers for it).
_LEADERLESS = (nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError,
               nats.errors.NoRespondersError)
#: Row ids whose copy a worker took, remembered so a retry does not send them again.
_AROUND_KEPT = 100_000
#: How long a copy's sender waits for the worker's answer (it answers on receipt).
_AROUND_ANSWER_S = 0.5


def leaderless(exc: BaseException) -> bool:
    """Whether a failed publish says its stream has no leader (an election under way)."""
    return isinstance(exc, _LEADERLESS) or isinstance(exc.__cause__, _LEADERLESS)


@dataclass
class Counts:
    """A relay's counters, for tests, benchmarks, inspect and its last log line."""

    published: int = 0  # rows newly stored by JetStream
    duplicates: int = 0  # rows JetStream already had (re-publish after a crash/takeover)
    claimed: int = 0
    timers_fired: int = 0
    dead_lettered: int = 0
    retries: int = 0
    acks_refused: int = 0  # batches whose shard lease was lost before their ack
    sent_around: int = 0  # rows whose core NATS copy a worker took while their stream had no leader

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Sent:
    """A published batch awaiting its acknowledgement."""

    rows: list[OutboxRow]
    requests: list[OutboxRow]  # published clients' requests, indexed with the ack
    flags: list[bool]  # per published row: stored new (True) or a duplicate
    dead: int  # rows dead-lettered
    via: str
    started: float


class Publisher:
    """Publishes a relay's batches; :meth:`attach` gives it the connections once they are up."""

    def __init__(self, settings: Settings, name: str, keys: Keys, faults: Faults,
                 counts: Counts) -> None:
        self.settings = settings
        self.name = name
        self.keys = keys
        self.faults = faults
        self.counts = counts
        self._subject = re.compile(
            rf"^{re.escape(settings.namespace)}\.(wake|tool)(\.[A-Za-z0-9_-]{{1,64}})+$"
        )
        self._bus: Bus | None = None
        self._redis: Redis | None = None
        self._leases: ShardLeases | None = None
        self._probe = False  # after a failed batch: publish row by row to isolate a refusal
        #: The last publish failed for want of a stream leader: the relay's retry sends the
        #: rows committed meanwhile around the stream (see Relay._retry).
        self.going_around = False
        self._sent_around: OrderedDict[str, None] = OrderedDict()

    def attach(self, bus: Bus, redis: Redis, leases: ShardLeases) -> None:
        self._bus, self._redis, self._leases = bus, redis, leases

    async def deliver(self, rows: list[OutboxRow], box: Outbox, via: str) -> None:
        """Publish rows, dead-letter the refused ones, then acknowledge and delete all.

        Raises (rows stay pending) when NATS or Redis is unavailable.
        """
        sent = await self.publish(rows, box, via)
        assert self._leases is not None
        self.settle(sent, await box.ack(rows, self.name, dict(self._leases.held), sent.requests))

    async def publish(self, rows: list[OutboxRow], box: Outbox, via: str) -> Sent:
        """Publish rows and dead-letter the refused ones: all of them are then to be
        acknowledged (:meth:`settle` once they are), with the sessions of the clients'
        requests among them (``Sent.requests``) indexed in the same round trip. Raises (rows
        stay pending) when NATS or Redis is unavailable."""
        bus = self._bus
        assert bus is not None and self._redis is not None
        started = time.perf_counter()
        good, refused = await self._screen(rows, box)
        flags: list[bool] = []
        if good:
            if not bus.nc.is_connected:  # fail fast; publishes would only be buffered
                raise NatsUnavailable("NATS is not connected")
            try:
                if self._probe:
                    flags = await self._publish_each(good, refused)
                    self._probe = False
                else:
                    try:
                        flags = await bus.publish_many(self.outgoing(r) for r in good)
                    except ValidationError:  # the bus refused a row before sending: isolate it
                        flags = await self._publish_each(good, refused)
                    except NATS_DOWN:
                        # nats-py reports a refused async publish as a timeout: if the server
                        # is still there, the retry goes row by row to find the refused row.
                        self._probe = bus.nc.is_connected
                        raise
            except NATS_DOWN as exc:
                self.going_around = leaderless(exc)
                if self.going_around:
                    await self._send_around(good)
                raise
            self.going_around = False
        self.faults.hit("relay.after_publish", rows=len(rows))
        for row, reason in refused:
            await record_dead_letter(
                self._redis, self.keys, role="relay", source="relay", reason=reason,
                payload=row.data, row_id=row.id, subject=row.subject, session_id=row.session_id,
                stream_id=row.stream_id,
            )
            log.error("outbox_row_dead_lettered", row_id=row.id, reason=bounded(reason),
                      session_id=row.session_id, trace_id=trace_id_of(row.headers))
        return Sent(rows, box.requests(good), flags, len(refused), via, started)

    async def _screen(self, rows: list[OutboxRow],
                      box: Outbox) -> tuple[list[OutboxRow], list[tuple[OutboxRow, str]]]:
        """The rows that may go out, and the refused ones with the reason."""
        good: list[OutboxRow] = []
        refused: list[tuple[OutboxRow, str]] = []
        wakes = await box.wake_subjects(rows)
        for row in rows:
            reason = self.refusal(row)
            if reason is None and row.stream_id in wakes:
                reason = wake_refusal(row, wakes[row.stream_id])
            if reason is None:
                good.append(row)
            else:
                refused.append((row, reason))
        return good, refused

    async def around(self, rows: list[OutboxRow], box: Outbox) -> None:
        """Send rows read while their stream has no leader around it (the ones that may go
        out, until a worker took each); they stay pending, for the stream once it takes them
        again."""
        good, _ = await self._screen(rows, box)  # the refused are dead-lettered on publish
        await self._send_around(good)

    async def _send_around(self, rows: list[OutboxRow]) -> None:
        """Send core NATS copies of ``rows`` on their fallback subjects, each as a request
        that the worker of the consumer's queue group who takes it answers at once. A row
        whose copy was taken is not sent again; one nobody took (no worker subscribed at
        that moment: reconnecting after the same node's loss, say) or whose answer did not
        come goes again with the next try. Best effort: the stored message is the record."""
        bus = self._bus
        assert bus is not None
        taken = self._sent_around
        fresh = [row for row in rows if row.id not in taken]
        if not fresh or not bus.nc.is_connected:
            return

        async def send(row: OutboxRow) -> bool:
            item = self.outgoing(row)
            try:
                await bus.nc.request(bus.names.fallback_subject(item.subject), item.data,
                                     timeout=_AROUND_ANSWER_S,
                                     headers={**(item.headers or {}), "Nats-Msg-Id": row.id})
            except (nats.errors.Error, TimeoutError, ValidationError) as exc:
                log.debug("outbox_row_around_untaken", row_id=row.id, error=bounded(exc))
                return False
            return True

        done = await asyncio.gather(*(send(row) for row in fresh))
        for row, ok in zip(fresh, done, strict=True):
            if ok:
                taken[row.id] = None
        while len(taken) > _AROUND_KEPT:
            taken.popitem(last=False)
        self.counts.sent_around += sum(done)
        log.info("outbox_rows_sent_around", rows=sum(done), untaken=len(fresh) - sum(done),
                 note="their stream has no leader: copies go to the workers now, the rows "
                      "stay pending until the stream takes them")

    def settle(self, sent: Sent, lost: dict[int, str]) -> None:
        """Count a published batch whose acknowledgement is in (``lost``: the shards whose
        lease was no longer ours, see :meth:`Outbox.ack`)."""
        assert self._leases is not None
        counts = self.counts
        for shard, holder in lost.items():
            # Published, but the shard is another relay's now: it re-sends these rows under
            # the same Nats-Msg-Id (dropped by JetStream's dedupe) and acknowledges them.
            counts.acks_refused += 1
            log.warning("outbox_ack_refused", shard=shard, holder=holder)
            self._leases.lost(shard, holder)
        flags = sent.flags
        new = sum(flags)
        counts.published += new
        counts.duplicates += len(flags) - new
        counts.dead_lettered += sent.dead
        log.debug("outbox_published", rows=len(sent.rows), new=new,
                  duplicates=len(flags) - new, dead=sent.dead, via=sent.via,
                  ms=round((time.perf_counter() - sent.started) * 1e3, 3))

    def refusal(self, row: OutboxRow) -> str | None:
        """Why NATS could never accept this row, or None. Mirrors the server's checks."""
        if not row.subject:
            return "malformed outbox row: a field is missing or unreadable"
        if not self._subject.match(row.subject):
            return (f"invalid subject {row.subject[:200]!r}: not a wake or tool subject "
                    f"of namespace {self.settings.namespace!r}")
        if not row.id:
            return "row has no id (needed as Nats-Msg-Id)"
        size = len(row.data.encode()) + len(b"NATS/1.0\r\n\r\nNats-Msg-Id: \r\n") + len(row.id)
        for name, value in row.headers.items():
            if not _HEADER_NAME.match(name) or "\r" in value or "\n" in value:
                return f"invalid header {name[:100]!r}"
            size += len(name) + len(value) + 4
        if size > self.settings.max_payload_bytes:  # the stream's limit counts headers too
            return f"message of {size} bytes exceeds {self.settings.max_payload_bytes}"
        return None

    def outgoing(self, row: OutboxRow) -> Outgoing:
        """The message for ``row``, with the carrier headers naming this relay and the time.

        Consumers record them in the receipt they commit (the claim, the lease), so the
        trace names the relay of every hop without the relay writing session state. A row
        the headers would push over the size limit goes without them: they are an
        observation, never a reason to refuse a row.
        """
        data = row.data.encode()
        carrier = carrier_headers(self.name, int(time.time() * 1000))
        headers = {**row.headers, **carrier}
        size = len(data) + 27 + len(row.id) + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if size > self.settings.max_payload_bytes:
            headers = row.headers
        return Outgoing(row.subject, data, msg_id=row.id, headers=headers or None)

    async def _publish_each(
        self, rows: list[OutboxRow], refused: list[tuple[OutboxRow, str]]
    ) -> list[bool]:
        """Publish one at a time (each waits for its ack); collect the refused rows."""
        assert self._bus is not None
        flags = []
        for row in rows:
            item = self.outgoing(row)
            try:
                flags.append(await self._bus.publish(
                    item.subject, item.data, msg_id=item.msg_id, headers=item.headers
                ))
            except _REFUSED as exc:
                refused.append((row, _describe(exc)))
        return flags


def wake_refusal(row: OutboxRow, committed: str | None) -> str | None:
    """Why a row of a wakes stream (written by Hands) may not go out, or None: it may only
    wake its own session, on the wake subject that session committed."""
    if committed is None:
        return f"wake row for unknown session {row.session_id[:128]!r}"
    if row.subject != committed:
        return (f"wake row on subject {row.subject[:200]!r}: session {row.session_id[:128]!r} "
                f"wakes on {committed[:200]!r}")
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, nats.js.errors.APIError):  # its repr() shows none of the facts
        return (f"refused by NATS: {exc.description} "
                f"(code {exc.code}, err_code {exc.err_code})")
    return f"refused by NATS: {exc}"
