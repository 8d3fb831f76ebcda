"""The JetStream bus: connection, stream and consumer setup, deduplicated publish, pull.

Baton uses two work-queue streams per namespace ``ns`` (``NS`` = upper-cased, ``-`` → ``_``):

    <NS>_WAKE   subjects <ns>.wake.<agent>.<compat>   one durable consumer per (agent, compat)
    <NS>_TOOLS  subjects <ns>.tool.<tool>             one durable consumer per tool

Every publish carries ``Nats-Msg-Id`` (the outbox row id), so a re-publish after a relay crash
is dropped by the stream's duplicate window. Acks are not exclusive (nats-server#4786): who
may act on a message is decided by fences in Redis, never here.

The names live in :mod:`baton.bus.subjects`, one message's helpers (:class:`Outgoing`,
:func:`delivery_count`, :func:`heartbeat`) in :mod:`baton.bus.messages`, credentials and
permission denials in :mod:`baton.bus.nats_auth` and pulling (:class:`Puller`) in
:mod:`baton.bus.pull`; this module re-exports the public ones. nats-py is used through its
public API only (``tests/unit/test_private_apis.py`` checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Self, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    PubAck,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from baton.bus.messages import Outgoing, delivery_count, heartbeat
from baton.bus.nats_auth import _auth_options, _Denials, _Guard, _is_auth_failure
from baton.bus.pull import Puller, _Reconnects
from baton.bus.subjects import BusNames, _token
from baton.errors import (
    CredentialsError,
    ForbiddenError,
    NatsUnavailable,
    PayloadTooLarge,
    ValidationError,
)
from baton.observability.log import bounded, error_text, get_logger
from baton.observability.tracing import publish_span, publish_spans
from baton.settings import Settings

__all__ = ["Bus", "BusNames", "Outgoing", "Puller", "delivery_count", "heartbeat"]

log = get_logger(__name__)
T = TypeVar("T")

_STREAM_NAME_IN_USE = 10058  # JetStream API error: stream exists with another config
_STREAM_NOT_FOUND = 10059
# While connected, keep retrying forever (workers must outlive a NATS restart), this often.
_RECONNECT_WAIT_S = 0.25
_MAX_OUTSTANDING_PINGS = 2
_REQUEST_TIMEOUT_S = 5.0  # JetStream API calls and publish acks
_SETTLE_DELAYS_S = (0.25, 0.5, 1.0, 2.0)  # stream/consumer setup while a cluster settles
# Errors meaning "the server is not reachable right now": retryable for the caller.
_TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    asyncio.TimeoutError,
)



def shown_url(url: str) -> str:
    """``url`` (one NATS URL or a comma-separated list) fit for messages and logs: a user
    kept, a password dropped, and a bare token (``nats://TOKEN@host``) dropped whole."""
    shown = []
    for one in url.split(","):
        scheme, sep, rest = one.strip().partition("://")
        userinfo, at, hosts = rest.rpartition("@")
        if not sep or not at:
            shown.append(one.strip())
            continue
        user, colon, _ = userinfo.partition(":")
        shown.append(f"{scheme}://{user}@{hosts}" if colon and user else f"{scheme}://{hosts}")
    return ",".join(shown)


def _same_consumer(have: ConsumerConfig, filter_subject: str | None, ack_wait: float | None,
                   max_deliver: int | None, max_ack_pending: int | None) -> bool:
    """Whether a consumer's config is the one wanted (the fields Baton sets)."""
    return (have.filter_subject == filter_subject
            and abs((have.ack_wait or 0) - (ack_wait or 0)) < 1e-3
            and have.max_deliver == max_deliver
            and have.max_ack_pending == max_ack_pending)

class Bus:
    """A NATS connection with Baton's JetStream layout. Create with :meth:`connect`."""

    def __init__(
        self, nc: Client, settings: Settings, denials: _Denials | None = None, user: str = "",
        reconnects: _Reconnects | None = None,
    ) -> None:
        self._nc = nc
        self._reconnects = reconnects or _Reconnects()
        self._js = nc.jetstream(timeout=_REQUEST_TIMEOUT_S)
        self.settings = settings
        self.names = BusNames(settings.namespace)
        self.user = user or settings.nats_user
        self._denials = denials or _Denials()
        self._guard = _Guard(self._denials, self.user)
        #: The role ("brain", "hands") whose consumers a relay makes, "" to make them here.
        self.asks_relay = ""

    @classmethod
    async def connect(cls, settings: Settings, name: str, role: str = "") -> Bus:
        """Connect within ``settings.connect_timeout_s`` or raise :class:`NatsUnavailable`.

        nats-py retries the first connect for minutes with its defaults (and forever with
        ``max_reconnect_attempts=0``): the deadline here bounds it. Once connected, the client
        reconnects forever, so a worker survives a NATS restart (or the loss of one node of
        a cluster: ``nats_url`` may list several servers, and the servers announce the rest).

        ``role`` gives the connection its own reply inbox, ``_INBOX.<role>.>``, so a role's
        NATS user may be allowed to subscribe to its own replies only. Wrong credentials
        raise :class:`CredentialsError`.
        """
        nc = Client()
        last_error: list[BaseException] = []
        denials = _Denials()
        reconnects = _Reconnects()
        user = settings.nats_user or role
        auth = _auth_options(settings)
        if role:
            auth["inbox_prefix"] = f"_INBOX.{_token('role', role)}"

        async def on_error(exc: Exception) -> None:
            if denials.report(str(exc)):
                log.error("nats_permission_denied", connection=name, user=user, error=bounded(exc))
                return
            if not (last_error and _is_auth_failure(last_error[0])):  # keep the telling one
                last_error[:] = [exc]
            if nc.is_connected or nc.is_reconnecting:
                log.warning("nats_error", connection=name, error=error_text(exc))

        async def on_disconnected() -> None:
            if not nc.is_closed:  # our own close() also reports a disconnect
                log.warning("nats_disconnected", connection=name)

        async def on_reconnected() -> None:
            log.info("nats_reconnected", connection=name)
            reconnects.fire()

        try:
            async with asyncio.timeout(settings.connect_timeout_s):
                await nc.connect(
                    [u.strip() for u in settings.nats_url.split(",") if u.strip()],
                    name=name,
                    connect_timeout=settings.connect_timeout_s,  # type: ignore[arg-type]
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=_RECONNECT_WAIT_S,  # type: ignore[arg-type]
                    # A silent (partitioned) server is found by pings, not by a reset.
                    ping_interval=settings.nats_ping_interval_s,  # type: ignore[arg-type]
                    max_outstanding_pings=_MAX_OUTSTANDING_PINGS,
                    error_cb=on_error,
                    disconnected_cb=on_disconnected,
                    reconnected_cb=on_reconnected,
                    **auth,
                )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            cause = last_error[0] if last_error else exc
            if _is_auth_failure(cause) or _is_auth_failure(exc):
                raise CredentialsError(
                    f"NATS at {shown_url(settings.nats_url)}", user,
                    str(cause) or type(cause).__name__
                ) from None
            raise NatsUnavailable(
                f"cannot connect to NATS at {shown_url(settings.nats_url)} within "
                f"{settings.connect_timeout_s}s: {cause!r}",
                url=shown_url(settings.nats_url),
            ) from None
        bus = cls(nc, settings, denials, user, reconnects)
        # A worker logging in as its role may not create consumers: a relay makes them
        # (baton.bus.consumers). Without credentials there is no such user to confine.
        logged_in = bool(auth.get("user") or auth.get("user_credentials")
                         or any("@" in u for u in settings.nats_url.split(",")))
        bus.asks_relay = role if role in ("brain", "hands") and logged_in else ""
        return bus

    async def guarded(self, action: str, subject: str, call: Awaitable[T]) -> T:
        """Await ``call``; raise :class:`ForbiddenError` at once if the server refuses
        ``subject`` (a prefix) to this user meanwhile, instead of waiting for a timeout."""
        return await self._guard(action, subject, call)

    async def close(self) -> None:
        """Flush and close the connection (no drain: workers drain their own loops). Idempotent."""
        if not self._nc.is_closed:
            await self._nc.close()  # flushes buffered acks and publishes first

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def nc(self) -> Client:
        return self._nc

    @property
    def reconnected(self) -> asyncio.Event:
        """Set at the next reconnect of this connection (a new event after each)."""
        return self._reconnects.event

    # -- names ------------------------------------------------------------------------------
    def wake_subject(self, agent: str, compat: str | int) -> str:
        return self.names.wake_subject(agent, compat)

    def tool_subject(self, tool: str) -> str:
        return self.names.tool_subject(tool)

    # -- topology ---------------------------------------------------------------------------
    def _stream_config(self, name: str, subjects: list[str]) -> StreamConfig:
        s = self.settings
        return StreamConfig(
            name=name,
            subjects=subjects,
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType(s.stream_storage),
            num_replicas=s.stream_replicas,
            duplicate_window=s.duplicate_window_s,
            max_msg_size=s.max_payload_bytes,
            # Bounded, refusing new messages when full: the relay keeps them in the outbox.
            max_msgs=s.stream_max_msgs,
            max_bytes=s.stream_max_bytes or -1,
            max_age=s.stream_max_age_s,
            discard=DiscardPolicy.NEW,
            # Every replica answers direct gets: workers read a consumer's subject this way
            # while the consumer has no leader (baton.bus.fallback).
            allow_direct=True,
        )

    async def ensure_streams(self) -> None:
        """Create or update the wake and tool streams. Idempotent.

        Looks first (``STREAM.INFO``) and writes only when a stream is missing or differs,
        so a role whose NATS user may only read stream info (Brain, Hands) starts fine once
        the relay (which may create and update them) has set them up.
        """
        ns = self.settings.namespace
        for config in (
            self._stream_config(self.names.wake_stream, [f"{ns}.wake.>"]),
            self._stream_config(self.names.tool_stream, [f"{ns}.tool.>"]),
        ):
            await self._settling(functools.partial(self._guarded_stream, config))

    async def _guarded_stream(self, config: StreamConfig) -> None:
        await self.guarded("manage the stream", "$JS.API.STREAM.", self._ensure_stream(config))

    async def _settling(self, call: Callable[[], Awaitable[T]]) -> T:
        """Retry a JetStream API call while the cluster settles (a leader election, a
        consumer being created by another replica at the same moment): a timeout or "not
        available" is retried a few times before it is raised as :class:`NatsUnavailable`."""
        for delay in (*_SETTLE_DELAYS_S, None):
            try:
                return await call()
            except (*_TRANSIENT, nats.js.errors.ServiceUnavailableError) as exc:
                if self._denials.inbox:  # no answer can come: not a server that settles
                    raise ForbiddenError(
                        self.user, "subscribe to", self._denials.inbox,
                        "its reply inbox, where JetStream answers: is this process running "
                        "with another role's NATS user (BATON_NATS_USER)?") from exc
                if delay is None:
                    raise NatsUnavailable(f"JetStream API not answering: {exc!r}") from exc
                log.info("jetstream_api_retry", error=error_text(exc), delay_s=delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _ensure_stream(self, config: StreamConfig) -> None:
        jsm = self._js
        try:
            have = (await jsm.stream_info(str(config.name))).config
        except nats.js.errors.NotFoundError:
            have = None
        if have is not None and _same_stream(have, config):
            return
        try:
            await jsm.add_stream(config)  # same config again is a no-op on the server
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
            await jsm.update_stream(config)
            log.info("stream_updated", stream=config.name)

    async def ensure_consumer(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        *,
        ack_wait: float | None = None,
        max_deliver: int | None = None,
        max_ack_pending: int = 1000,
    ) -> ConsumerInfo:
        """Create the durable pull consumer, or update it when its config differs.

        ``pull_subscribe`` would silently keep an existing consumer's old config, so the
        comparison and update are explicit here.
        """
        _token("durable", durable)
        if self.asks_relay:
            return await self._consumer_from_relay(stream, durable, filter_subject, ack_wait,
                                                   max_deliver, max_ack_pending)
        want = ConsumerConfig(
            name=durable,
            durable_name=durable,
            filter_subject=filter_subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_s if ack_wait is None else ack_wait,
            max_deliver=self.settings.max_deliver if max_deliver is None else max_deliver,
            max_ack_pending=max_ack_pending,
        )
        return await self._settling(lambda: self.guarded(
            "manage the consumer", "$JS.API.CONSUMER.", self._ensure_consumer(stream, want)
        ))

    async def _consumer_from_relay(self, stream: str, durable: str, filter_subject: str,
                                   ack_wait: float | None, max_deliver: int | None,
                                   max_ack_pending: int) -> ConsumerInfo:
        """Ask a relay for the consumer (see :mod:`baton.bus.consumers`) unless it is there
        already as wanted; the consumer's info once it is."""
        from baton.bus.consumers import ConsumerRequest, request_consumer

        request = ConsumerRequest(
            durable=durable, filter_subject=filter_subject,
            ack_wait_s=self.settings.ack_wait_s if ack_wait is None else ack_wait,
            max_deliver=self.settings.max_deliver if max_deliver is None else max_deliver,
            max_ack_pending=max_ack_pending)
        info = await self._consumer_info(stream, durable)
        if info is None or not _same_consumer(info.config, request.filter_subject,
                                              request.ack_wait_s, request.max_deliver,
                                              request.max_ack_pending):
            await request_consumer(self, "brain" if self.asks_relay == "brain" else "hands",
                                   request, self.settings.consumer_wait_s)
            info = await self._consumer_info(stream, durable)
        if info is None:
            raise NatsUnavailable(f"consumer {durable} of {stream} is gone again")
        return info

    async def _consumer_info(self, stream: str, durable: str) -> ConsumerInfo | None:
        async def look() -> ConsumerInfo | None:
            try:
                return await self._js.consumer_info(stream, durable)
            except nats.js.errors.NotFoundError:
                return None
        return await self._settling(lambda: self.guarded(
            "read the consumer", f"$JS.API.CONSUMER.INFO.{stream}", look()))

    async def _ensure_consumer(self, stream: str, want: ConsumerConfig) -> ConsumerInfo:
        durable = str(want.durable_name)
        try:
            info = await self._js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            return await self._js.add_consumer(stream, want)
        if _same_consumer(info.config, want.filter_subject, want.ack_wait, want.max_deliver,
                          want.max_ack_pending):
            return info
        log.info("consumer_updated", stream=stream, durable=durable)
        return await self._js.add_consumer(stream, want)  # create-or-update on the server

    async def pull(self, stream: str, durable: str, subject: str = "") -> Puller:
        """A new Puller (its own reply inbox) on an existing durable consumer. With the
        consumer's filter ``subject``, it delivers around the consumer or the stream while
        either has lost its leader (:mod:`baton.bus.fallback`)."""
        fallback = self.names.fallback_subject(subject) if subject else ""
        s = self.settings
        # one replica: the stream's node lost is the connection lost, which ends a fetch
        beat = s.consumer_heartbeat_s if subject and s.stream_replicas > 1 else 0.0
        return await Puller.subscribe(self._nc, stream, durable, self._guard, self._reconnects,
                                      subject, fallback, beat)

    # -- publish ----------------------------------------------------------------------------
    def _headers(self, data: bytes, msg_id: str, headers: dict[str, str] | None) -> dict[str, str]:
        # The stream's max_msg_size counts headers too ("NATS/1.0" line, "k: v" lines, CRLFs).
        size = len(data) + 12 + len(msg_id) + 15 + sum(
            len(k) + len(v) + 4 for k, v in (headers or {}).items()
        )
        if size > self.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"message of {size} bytes (with headers) exceeds {self.settings.max_payload_bytes}",
                size=size, limit=self.settings.max_payload_bytes,
            )
        if not msg_id:
            raise ValidationError("publish needs a non-empty msg_id (deduplication key)")
        return {**(headers or {}), "Nats-Msg-Id": msg_id}

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> bool:
        """Publish and wait for the stream's ack.

        Returns True if the stream stored a new message, False if ``msg_id`` was a duplicate
        within the duplicate window (the message is already stored: success for the caller).
        """
        with publish_span(subject, msg_id, headers) as headers:
            hdrs = self._headers(data, msg_id, headers)
            try:
                ack = await self.guarded(
                    "publish to", subject, self._js.publish(subject, data, headers=hdrs)
                )
            except _TRANSIENT as exc:
                raise NatsUnavailable(
                    f"publish to {subject} failed: {exc!r}", subject=subject
                ) from exc
        return not ack.duplicate

    async def publish_many(self, items: Iterable[Outgoing]) -> list[bool]:
        """Publish all concurrently; per item, True if stored new, False if a duplicate.

        Raises if any publish fails (then nothing may be assumed published: keep the rows).
        """
        with publish_spans(list(items)) as batch:  # one PRODUCER span per message
            return await self._publish_many(batch)

    async def _publish_many(self, batch: Sequence[Outgoing]) -> list[bool]:
        headers = [self._headers(i.data, i.msg_id, i.headers) for i in batch]
        if not batch:
            return []
        acks: list[asyncio.Future[PubAck]] = []
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT_S):  # the acks have no deadline
                for item, hdrs in zip(batch, headers, strict=True):
                    acks.append(await self._js.publish_async(item.subject, item.data,
                                                             headers=hdrs))
                # A refusal of any of the batch's subjects (all in the namespace) fails it
                # at once; so does the first publish the stream refuses.
                done = await self.guarded("publish to", f"{self.settings.namespace}.",
                                          asyncio.gather(*acks))
        except _TRANSIENT as exc:
            raise NatsUnavailable(f"publish of {len(batch)} messages failed: {exc!r}") from exc
        finally:
            for ack in acks:  # one not in yet gives back its place in publish_async's window
                ack.cancel()
        return [not ack.duplicate for ack in done]


def _same_stream(have: StreamConfig, want: StreamConfig) -> bool:
    return (
        sorted(have.subjects or []) == sorted(want.subjects or [])
        and have.retention == want.retention
        and have.storage == want.storage
        and (have.num_replicas or 1) == (want.num_replicas or 1)
        and abs((have.duplicate_window or 0) - (want.duplicate_window or 0)) < 1e-3
        and have.max_msg_size == want.max_msg_size
        and have.max_msgs == want.max_msgs
        and have.max_bytes == want.max_bytes
        and abs((have.max_age or 0) - (want.max_age or 0)) < 1e-3
        and have.discard == want.discard
        and bool(have.allow_direct) == bool(want.allow_direct)
    )
