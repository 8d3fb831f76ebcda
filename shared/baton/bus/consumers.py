"""Durable consumers made by the relay at a worker's request: Brains and Hands create none.

A consumer's configuration says where JetStream delivers: the right to create one is the
right to route a stream's messages anywhere (a push consumer of the tool stream delivering
onto ``<ns>.wake.*``), and to change the shared durable consumers every replica pulls from.
So a Brain's or Hands' NATS user may only read consumer info, pull (``MSG.NEXT``) and ack
(:func:`baton.auth.nats_permissions`); the relay, which creates the streams, creates the
consumers too.

A worker that logs in with credentials asks for the pull consumer it needs: it publishes a
:class:`ConsumerRequest` (durable name, the subject it filters, ack wait, deliveries, pending
acks) on ``<ns>.consumers.<role>``, a subject only that role may publish on, and waits for
a relay's :class:`ConsumerReply` (:func:`request_consumer`; retried while no relay answers,
as at a fresh deploy where the workers come up first). The relay (:class:`ConsumerMaker`)
checks it against the role the subject names: a pull consumer of that role's stream only
(the wake stream for Brains, the tool stream for Hands), filtering one subject of it, with
bounded numbers; it never sets a deliver subject. Then it creates or updates the consumer
with its own permissions. Without credentials (a development server with no users) a
worker creates its consumer itself, as before.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import nats.errors
from nats.aio.msg import Msg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from baton.bus.subjects import BusNames
from baton.errors import BatonError, NatsUnavailable
from baton.observability.log import bounded, error_text, get_logger

if TYPE_CHECKING:
    from baton.bus.bus import Bus

__all__ = ["ConsumerMaker", "ConsumerReply", "ConsumerRequest", "request_consumer"]

log = get_logger(__name__)

Role = Literal["brain", "hands"]
#: How long a worker waits for one relay's answer before asking again.
ANSWER_WAIT_S = 2.0
_SUBJECT_TOKEN = r"[A-Za-z0-9_-]{1,64}"


class ConsumerRequest(BaseModel):
    """A worker's request for the durable pull consumer it consumes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    durable: str = Field(pattern=r"^[A-Za-z0-9_-]{1,200}$")
    filter_subject: str = Field(max_length=300)
    ack_wait_s: float = Field(gt=0, le=86_400)
    max_deliver: int = Field(ge=-1, le=1_000_000)
    max_ack_pending: int = Field(ge=1, le=1_000_000)


class ConsumerReply(BaseModel):
    """The relay's answer: ``ok``, or why it refused (one sentence)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    ok: bool
    error: str = ""
    retry: bool = False  # refused for now (the stream not there yet, NATS settling): ask again


def _stream_and_subjects(names: BusNames, role: Role) -> tuple[str, re.Pattern[str]]:
    """The stream a role consumes and the subjects a consumer of it may filter."""
    ns = re.escape(names.namespace)
    if role == "brain":  # <ns>.wake.<agent>.<compat>
        return names.wake_stream, re.compile(rf"^{ns}\.wake\.{_SUBJECT_TOKEN}\.{_SUBJECT_TOKEN}$")
    return names.tool_stream, re.compile(rf"^{ns}\.tool\.{_SUBJECT_TOKEN}$")  # <ns>.tool.<t>


async def request_consumer(bus: Bus, role: Role, request: ConsumerRequest,
                           wait_s: float) -> None:
    """Ask the relays for ``request``'s consumer until one has made it (or refused it:
    :class:`NatsUnavailable` with its reason), for at most ``wait_s`` seconds."""
    subject = bus.names.consumers_subject(role)
    payload = request.model_dump_json().encode()
    deadline = time.monotonic() + wait_s
    warned = False
    while True:
        try:
            msg = await bus.guarded("ask for a consumer on", subject,
                                    bus.nc.request(subject, payload, timeout=ANSWER_WAIT_S))
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                nats.errors.ConnectionReconnectingError) as exc:
            if time.monotonic() >= deadline:
                raise NatsUnavailable(
                    f"no relay made consumer {request.durable} within {wait_s:g} s "
                    f"({error_text(exc)}): a relay creates the consumers of Brains and "
                    "Hands that log in as their role; is one running?") from None
            if not warned:
                log.warning("consumer_waiting_for_relay", durable=request.durable)
                warned = True
            await asyncio.sleep(0.5)
            continue
        reply = ConsumerReply.model_validate_json(msg.data)
        if reply.ok:
            return
        if not reply.retry or time.monotonic() >= deadline:
            raise NatsUnavailable(f"the relay refused consumer {request.durable}: "
                                  f"{reply.error}")
        log.info("consumer_retry", durable=request.durable, error=reply.error)
        await asyncio.sleep(0.5)


class ConsumerMaker:
    """The relay's side: answers the requests of both roles (see the module)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.made = 0

    async def listen(self) -> None:
        """Subscribe to both roles' request subjects (nats-py re-subscribes on reconnect)."""
        for role in ("brain", "hands"):
            await self.bus.nc.subscribe(self.bus.names.consumers_subject(role),
                                        cb=self._handler(role))

    def _handler(self, role: Role) -> Callable[[Msg], Awaitable[None]]:
        async def handle(msg: Msg) -> None:
            reply = await self.make(role, msg.data)
            if msg.reply:
                try:
                    await msg.respond(reply.model_dump_json().encode())
                except nats.errors.Error as exc:  # the worker asks again
                    log.debug("consumer_reply_failed", error=error_text(exc))
        return handle

    async def make(self, role: Role, data: bytes) -> ConsumerReply:
        """Check a request from ``role`` and create or update its consumer."""
        try:
            req = ConsumerRequest.model_validate_json(data)
        except ValidationError as exc:
            return ConsumerReply(ok=False, error=f"not a consumer request: {bounded(exc)}")
        stream, subjects = _stream_and_subjects(self.bus.names, role)
        if not subjects.match(req.filter_subject):
            return ConsumerReply(ok=False, error=(
                f"a {role} consumes {stream} only; {req.filter_subject!r} is not one of its "
                "subjects"))
        try:
            await self.bus.ensure_consumer(
                stream, req.durable, req.filter_subject, ack_wait=req.ack_wait_s,
                max_deliver=req.max_deliver, max_ack_pending=req.max_ack_pending)
        except (BatonError, nats.errors.Error) as exc:  # answered: the worker asks again
            log.warning("consumer_not_made", role=role, durable=req.durable,
                        error=error_text(exc))
            return ConsumerReply(ok=False, error=error_text(exc), retry=True)
        self.made += 1
        log.info("consumer_made", role=role, durable=req.durable, stream=stream)
        return ConsumerReply(ok=True)
