"""The Hands worker: consumes tool messages, executes tools under attempt fences.

Per served tool there is one durable pull consumer, shared by every Hands replica serving
that tool, and one fetch loop here. Per message (:meth:`HandsWorker.handle`):

    decode ToolDispatch ─ bad ─> dead letter, term
    subject's tool == message's tool, served here ─ no ─> dead letter, term (run untouched)
    claim the attempt (Redis fence, mark "accepted"); claim.lua refuses, before any write,
        a run whose committed intent is for another tool ─> dead letter, term
        done -> ack (duplicate)   gone -> dead letter, ack   busy -> nak until the live one ends
    replay policy if an earlier attempt left no result (hands.replay)
    execute with heartbeats: JetStream in_progress + Redis run heartbeat
        taken over (StaleAttemptError) -> cancel the tool, no complete, no ack
        cancelled (the heartbeat answers so) -> cancel the tool (ctx.cancelled), result
        outcome "cancelled"; a claim of a run the Brain stopped completes it so, unexecuted
    complete under the fence (mark "completed" + wake), then ack

JetStream acks are not exclusive, so who may complete a run is decided only by the attempt
fence in Redis; the message layer only brings the work. Deciding and executing a run's
result (replay policy, deadline, heartbeats, output limit) is the job of the
:class:`~baton.hands.execute.ToolExecution` the worker builds once connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import nats.errors
from nats.aio.msg import Msg

from baton.app import App, Tool, load_app
from baton.bus.bus import Bus, Puller
from baton.bus.fallback import is_fallback
from baton.bus.messages import Beats, carrier_of, delivery_count, retry_later, settle
from baton.errors import (
    ArchivedError,
    BatonError,
    ConfigError,
    NatsUnavailable,
    RedisUnavailable,
    StaleAttemptError,
    ToolMismatchError,
    ValidationError,
    from_redis_error,
)
from baton.faults import Faults
from baton.hands import liveness
from baton.hands.execute import CANCEL_GRACE_S, AttemptLost, ToolExecution
from baton.hands.http import http_client
from baton.hands.isolation import harden_worker
from baton.limits import ToolLimit
from baton.models import ToolDispatch, ToolIntent, ToolResult, decode
from baton.observability.canonical import CanonicalLines
from baton.observability.log import bind, bounded, error_text, get_logger
from baton.observability.tracing import consumer, execute, waiting_for_slot
from baton.service import Service, run_until_signalled, tune_collector, wait_either
from baton.settings import Settings
from baton.store.admission import TENANT, weight_of
from baton.store.deadletter import record_dead_letter
from baton.store.epoch import StoreEpoch
from baton.store.limits import Limits
from baton.store.redis_client import REDIS_ERRORS
from baton.store.state import run_status
from baton.store.store import Store

__all__ = ["HandsWorker", "main"]

log = get_logger("baton.hands")

# An idle consumer's long poll: one pull request per this long. A message ends it at once,
# as do shutdown and a reconnect (the server forgets pull requests with the connection, see
# Puller.fetch), so it bounds nothing but how often an idle worker asks: each pull costs
# the NATS server a wake-up.
FETCH_TIMEOUT_S = 30.0
MAX_BATCH = 32  # messages per fetch, at most (and never more than free slots)
RETRY_DELAY_S = 0.5  # redelivery delay after Redis/NATS was unreachable
BUSY_MARGIN_S = 0.1  # after a live attempt's heartbeat would expire
COMPLETE_RETRIES = (0.1, 0.2, 0.4, 0.8, 1.6)  # a fenced complete is safe to retry


class _Slots:
    """The free run slots of one tool: the fetch loop takes all it may use at once (one
    fetch asks for no more messages than it took), each handled message gives its slot back."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._freed = asyncio.Event()

    async def take(self, most: int) -> int:
        """At least one free slot and at most ``most``, waiting while none is free."""
        while self.free == 0:
            self._freed.clear()
            await self._freed.wait()
        taken = min(self.free, most)
        self.free -= taken
        return taken

    def give(self, count: int) -> None:
        if count > 0:
            self.free += count
            self._freed.set()


@dataclass
class Handled:
    """What happened to one message: the fields of the canonical log line."""

    outcome: str = "unhandled"
    recovery: str = "none"
    error: dict[str, str] | None = None  # a result that is not ok: its code and message


class HandsWorker(Service):
    """Executes the tools of an app (all of them, or ``tools``) for any session."""

    role = "hands"

    def __init__(self, settings: Settings, app: App, tools: list[str] | None = None) -> None:
        super().__init__(settings)
        names = list(app.tools) if tools is None else list(dict.fromkeys(tools))
        unknown = [t for t in names if t not in app.tools]
        if unknown:
            raise ConfigError(
                f"cannot serve undeclared tools {', '.join(unknown)}; "
                f"the app declares: {', '.join(app.tools)}"
            )
        if not names and not app.mcp:
            raise ConfigError("a Hands worker needs at least one tool to serve")
        self.app = app
        self.tools: dict[str, Tool] = {n: app.tools[n] for n in names}
        self.faults = Faults(settings.fault)
        self.store: Store | None = None  # these four are set by serve() once connected
        self.http: httpx.AsyncClient | None = None
        self.execution: ToolExecution | None = None
        self.limits: Limits | None = None
        #: Per capped tool, its runs here waiting in line: member -> set when a Hands that
        #: released a slot names the member as one that may take it now.
        self._waiting: dict[str, dict[str, asyncio.Event]] = {}
        # One bound per tool: an idle tool's long poll must not hold slots another needs.
        self._slots = {n: _Slots(settings.hands_concurrency) for n in names}
        # Runs this process is handling now. claim.lua lets a worker of the same name take
        # over its own live attempt (a restart with a stable name); inside one process that
        # would make a duplicate message take over the attempt still running here.
        self._active: set[tuple[str, str]] = set()
        self._lines = CanonicalLines(log, "tool_message_handled", each=settings.log_each_message)
        # JetStream in_progress for every message in hand, from one loop (bus.messages.Beats)
        self._beats = Beats(settings.tool_ack_wait_s / 3,
                            late_after_s=settings.attempt_ttl_ms / 3000,
                            on_late=self._loop_blocked)

    # ------------------------------------------------------------------ lifecycle

    def announcement(self) -> dict[str, object]:
        """The tools served here: ``inspect`` flags tool subjects no live Hands takes and
        shows the fleet-wide limits of capped ones; the declarations of MCP tools, which
        Brains learn from here (baton.mcp.catalog)."""
        out: dict[str, object] = {"tools": list(self.tools)}
        limits = {name: tool.limit.as_dict() for name, tool in self.tools.items()
                  if tool.limit.limited}
        if limits:
            out["limits"] = limits
        if not self.app.mcp:
            return out
        from baton.mcp.catalog import announce
        from baton.mcp.server import MCPTool

        out["mcp"] = announce([t for t in self.tools.values() if isinstance(t, MCPTool)])
        return out

    async def _discover_mcp(self) -> None:
        """List the app's MCP servers' tools (waiting while a server cannot be reached) and
        serve them beside the app's own."""
        from baton.mcp.connection import MCPDiscoveryUnavailable, MCPServerUnavailable
        from baton.mcp.server import MCPTool

        for server in self.app.mcp:
            async def listed(server: Any = server) -> list[Any]:
                try:
                    return list(await server.discover())
                except MCPServerUnavailable as exc:
                    raise MCPDiscoveryUnavailable(str(exc)) from None

            for tool in await self.connect(f"mcp:{server.name}", listed):
                if tool.name in self.tools and not isinstance(self.tools[tool.name], MCPTool):
                    raise ConfigError(f"MCP tool {tool.name} clashes with a declared tool")
                self.app.tools[tool.name] = self.tools[tool.name] = tool
                self._slots[tool.name] = _Slots(self.settings.hands_concurrency)
            log.info("mcp_tools_discovered", server=server.name,
                     tools=[t for t, v in self.tools.items()
                            if getattr(v, "server", None) is server])

    async def serve(self) -> None:
        s = self.settings
        pullers: list[Puller] = []
        self.store = await self.connect("redis", lambda: Store.connect(s))
        store = self.store
        try:
            epoch = await self.connect("redis",
                                       lambda: StoreEpoch.establish(store.redis, store.keys))
            self.bus = await self.connect("nats", lambda: Bus.connect(s, self.name, self.role))
            self.http = http_client(s.connect_timeout_s, max_body_bytes=s.tool_http_max_bytes,
                                    deadline_s=s.tool_http_deadline_s)
            if self.app.mcp:
                await self._discover_mcp()
            self.execution = ToolExecution(s, self.tools, self.store.runs, self.worker, self.http)
            self.limits = Limits(self.store.redis, self.store.keys, slot_ms=s.attempt_ttl_ms)
            await self._listen_for_freed_slots()
            await self.bus.ensure_streams()
            names = self.bus.names
            for tool in self.tools:
                durable = names.tool_durable(tool)
                await self.bus.ensure_consumer(
                    names.tool_stream, durable, names.tool_subject(tool),
                    ack_wait=s.tool_ack_wait_s, max_deliver=s.max_deliver,
                )
                pullers.append(await self.bus.pull(names.tool_stream, durable,
                                                   names.tool_subject(tool)))
            # Peers ask here whether this process still holds its runs (hands.liveness).
            await liveness.answer(self.bus.nc, s.namespace, self.worker.name)
            self.ready.set()
            log.info("hands_ready", worker=self.name, tools=list(self.tools))
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.announce(self.store.redis, self.store.keys))
                tg.create_task(self.watch_epoch(epoch))
                for tool, puller in zip(self.tools, pullers, strict=True):
                    tg.create_task(self._fetch_loop(tool, puller), name=f"fetch:{tool}")
            await self.drain()
        finally:
            for task in list(self._inflight):  # only left when serve itself was cancelled
                task.cancel()
            if self._inflight:
                await asyncio.wait(set(self._inflight), timeout=CANCEL_GRACE_S)
            await self._beats.close()
            for puller in pullers:
                await puller.close()
            if self.http is not None:
                await self.http.aclose()
            for server in self.app.mcp:
                await server.close()
            if self.bus is not None:
                await self.bus.close()  # flushes the acks of the drained messages
            await self.store.close()
            self._lines.flush()
            log.info("hands_stopped", worker=self.name)

    async def _fetch_loop(self, tool: str, puller: Puller) -> None:
        """Fetch no more messages than there are free slots; each runs in its own task."""
        slots = self._slots[tool]
        while not self.stopping.is_set():
            taken = await slots.take(MAX_BATCH)
            msgs: list[Msg] = []
            try:
                if not self.stopping.is_set():
                    msgs = await puller.fetch(taken, timeout=FETCH_TIMEOUT_S, stop=self.stopping)
            except Exception as exc:  # NATS reconnecting or gone: keep serving
                log.warning("fetch_failed", tool=tool, error=error_text(exc))
                await self.wait_stopping(RETRY_DELAY_S)
            finally:
                slots.give(taken - len(msgs))
            for msg in msgs:
                self.spawn(self._handle_in_slot(msg, slots))

    async def _handle_in_slot(self, msg: Msg, slots: _Slots) -> None:
        try:
            await self.handle(msg)
        finally:
            slots.give(1)

    # ------------------------------------------------------------------ one message

    @consumer("hands")  # the CONSUMER span, child of the context in the message's headers
    async def handle(self, msg: Msg) -> None:
        """Handle one tool message; never raises (except cancellation)."""
        started = time.monotonic()
        delivery = delivery_count(msg)
        done = Handled()
        try:
            try:
                dispatch = decode(ToolDispatch, msg.data)
            except ValidationError as exc:
                bind(worker=self.name, delivery=delivery)
                done.outcome = "dead_letter"
                await self._dead_letter(msg, str(exc), delivery)
                await settle(msg.term())
                return
            bind(worker=self.name, delivery=delivery, session_id=dispatch.session_id,
                 run_id=dispatch.run_id, tool=dispatch.tool)  # one bind: it copies the context
            mismatch = self._misaddressed(msg.subject, dispatch)
            if mismatch:
                done.outcome = "dead_letter"
                await self._dead_letter(msg, mismatch, delivery)
                await settle(msg.term())
                return
            async with self._beats.beating(msg):
                await self._process(msg, dispatch, delivery, done)
        except (RedisUnavailable, NatsUnavailable) as exc:  # try again later, keep serving
            log.warning("tool_message_retry", error=bounded(exc))
            done.outcome = await retry_later(msg, delivery, self.settings.max_deliver,
                                             "tool message")
        except asyncio.CancelledError:  # the drain timeout ran out (or a second signal)
            done.outcome = "stopped_by_shutdown"
            raise
        except Exception:
            done.outcome = "crashed"
            log.exception("tool_message_failed")
            await settle(msg.nak(delay=RETRY_DELAY_S))
        finally:  # routine (first delivery, ok, nothing recovered): counted, at DEBUG
            self._lines.line(
                done.outcome == "ok" and done.recovery == "none" and delivery == 1,
                outcome=done.outcome, recovery=done.recovery,
                ms=round((time.monotonic() - started) * 1000, 2), **(done.error or {}),
            )

    def _loop_blocked(self, late_s: float, subjects: list[str]) -> None:
        """The event loop was blocked: most likely by a tool's synchronous code."""
        prefix = f"{self.settings.namespace}.tool."
        log.warning("event_loop_blocked", blocked_ms=round(late_s * 1000),
                    tools=sorted({s.removeprefix(prefix) for s in subjects}),
                    note="a tool blocked this Hands' event loop (time.sleep, a synchronous "
                         "SDK or file call): heartbeats stalled with it, and past "
                         "BATON_ATTEMPT_TTL_MS its runs look abandoned and are taken over; "
                         "run such code with asyncio.to_thread or declare the tool "
                         "isolation='process'")

    def _misaddressed(self, subject: str, dispatch: ToolDispatch) -> str:
        """Why a tool message must not be claimed here, or "" when its addressing agrees.

        The subject decides which consumer (and so which Hands) gets the message; the tool
        it names is what the claim checks against the run. Both must be the same served
        tool, or a message published on another tool's subject could make this Hands
        claim (and end) a run it cannot execute.
        """
        prefix = f"{self.settings.namespace}.tool."
        subject_tool = subject[len(prefix):] if subject.startswith(prefix) else ""
        if subject_tool != dispatch.tool:
            return (f"tool mismatch: subject {bounded(subject)!r} is for tool "
                    f"{bounded(subject_tool)!r}, the message names {dispatch.tool!r}")
        if dispatch.tool not in self.tools:
            return f"tool mismatch: {dispatch.tool!r} is not served here"
        return ""

    async def _process(
        self, msg: Msg, dispatch: ToolDispatch, delivery: int, done: Handled
    ) -> None:
        key = (dispatch.session_id, dispatch.run_id)
        if key in self._active:  # a duplicate of a message being handled here
            done.outcome = "busy"
            await settle(msg.nak(delay=self.settings.attempt_ttl_ms / 1000 + BUSY_MARGIN_S))
            return
        self._active.add(key)
        try:
            limit = self.tools[dispatch.tool].limit
            if not limit.limited:
                await self._claim_execute_complete(msg, dispatch, delivery, done)
                return
            tenant, settled = await self._before_slot(dispatch)
            if settled:  # a duplicate of a run that ended: its claim says so, no place in line
                await self._claim_execute_complete(msg, dispatch, delivery, done)
                return
            async with self._slot(dispatch, limit, tenant) as granted:
                if not granted:  # stopping while it waited: another Hands takes it
                    done.outcome = "stopped_waiting"
                    await settle(msg.nak())
                    return
                await self._claim_execute_complete(msg, dispatch, delivery, done)
        finally:
            self._active.discard(key)

    # ------------------------------------------------------------------ fleet-wide limits

    async def _listen_for_freed_slots(self) -> None:
        """Hear a Hands that released a capped tool's slot name the waiting runs that may
        take it now (one per line; no name: every run waiting here asks again). Only those
        ask Redis again, not the whole line. nats-py subscribes again after a reconnect; a
        message lost meanwhile costs a wait up to the slot's expiry."""
        assert self.bus is not None
        for name, tool in self.tools.items():
            if not tool.limit.limited:
                continue
            waiting = self._waiting[name] = {}

            async def freed(msg: Msg, waiting: dict[str, asyncio.Event] = waiting) -> None:
                named = msg.data.decode(errors="replace").split("\n") if msg.data else []
                for member in named or list(waiting):
                    if (event := waiting.get(member)) is not None:
                        event.set()

            await self.bus.nc.subscribe(self.bus.names.limits_subject(name), cb=freed)

    @contextlib.asynccontextmanager
    async def _slot(self, dispatch: ToolDispatch, limit: ToolLimit,
                    tenant: str) -> AsyncIterator[bool]:
        """Hold one of the tool's fleet-wide slots (and its rate's admission) while the body
        runs; yields False when the worker stops while the run waits in line.

        The run waits in line in Redis (baton.store.limits), keeping its place, woken when
        a Hands announces a slot freed or when its answer says to ask again (a slot's
        expiry, the rate's next admission); its message stays in progress meanwhile. The
        slot is renewed while the run executes, so only a holder that died loses it (after
        ``attempt_ttl_ms``), and released after, announced when runs wait."""
        assert self.limits is not None and self.bus is not None
        limits, tool = self.limits, dispatch.tool
        # One member per handling: a duplicate of the run in another Hands takes a slot of
        # its own for the moment its claim is refused, and releases only its own.
        renewing: asyncio.Task[None] | None = None
        due: asyncio.TimerHandle | None = None
        waited_from = time.monotonic()
        member = ""
        try:
            weight = weight_of(self.settings, tenant or "default")
            # <run>/<hands>/<nonce>/<tenant>: inspect counts slots and places by tenant
            member = (f"{dispatch.run_id}/{self.name}/{uuid.uuid4().hex[:8]}/"
                      f"{tenant or 'default'}")
            admission = await limits.acquire(tool, limit, member, tenant=tenant, weight=weight)
            if not admission.granted:
                log.info("tool_run_waiting", tool=tool, limit=limit.describe(),
                         position=admission.position,
                         waiting_for=f"a {tool} slot" if admission.position
                         else f"the {tool} rate")
                await self._note_wait(dispatch, "waiting", admission.position, 0)
                waiting = self._waiting.setdefault(tool, {})
                told = waiting[member] = asyncio.Event()
                try:
                    async with waiting_for_slot(tool) as place:
                        place(admission.position)
                        while not admission.granted:
                            # as the answer says: its place lasts that long and more
                            wait_s = admission.retry_ms / 1000
                            if await wait_either(self.stopping, told, wait_s):
                                break
                            told.clear()
                            admission = await limits.acquire(tool, limit, member,
                                                             tenant=tenant, weight=weight)
                finally:
                    waiting.pop(member, None)
                waited_ms = round((time.monotonic() - waited_from) * 1000)
                if not admission.granted:  # stopping
                    await self._note_wait(dispatch, "left", 0, waited_ms)
                    yield False
                    return
                log.info("tool_run_admitted", tool=tool, waited_ms=waited_ms)
                await self._note_wait(dispatch, "granted", 0, waited_ms)
            # Most runs end before their slot's first renewal is due: the renewing task
            # starts only when it is (a timer costs a run less than a task it cancels).
            def renew() -> None:
                nonlocal renewing
                renewing = asyncio.create_task(self._renew_slot(tool, limit, member),
                                               name=f"slot:{tool}")

            due = asyncio.get_running_loop().call_later(limits.slot_ms / 3000, renew)
            yield True
        finally:
            if due is not None:
                due.cancel()
            if renewing is not None:
                renewing.cancel()
            try:  # a slot left behind comes back at its expiry; a place, when it reaches the head
                if member and (heads := await limits.release(tool, limit, member)):
                    await self.bus.nc.publish(self.bus.names.limits_subject(tool),
                                              "\n".join(heads).encode())
            except (BatonError, nats.errors.Error) as exc:
                log.warning("tool_slot_release_failed", tool=tool, error=bounded(exc))

    async def _before_slot(self, dispatch: ToolDispatch) -> tuple[str, bool]:
        """What a capped tool's run needs before it takes a place in line, in one round trip:

        - the tenant whose work the session is (its meta's, written when it was opened: see
          baton.store.admission), "" for the default one: tenants with runs waiting take
          turns for the tool's slots;
        - whether the run is settled: it has a result, awaits an approval, was applied or is
          unknown (claim.lua's ``done`` and ``gone``, read as it reads them). A duplicate or a
          redelivery of such a run is settled by its claim at once, without executing; in
          line it would wait for a slot (minutes, under a tight cap) only to hear that.

        A hint, not a decision: the claim, atomic under the run's fence, decides."""
        assert self.store is not None
        store = self.store
        sk, rid = store.keys.session(dispatch.session_id), dispatch.run_id
        try:
            # No MULTI: a role user may not (a Hands' ACL); same slot, one round trip.
            async with store.redis.pipeline(transaction=False) as p:
                p.hget(sk.meta, "tenant")
                p.hmget(sk.intents, [rid, f"{rid}.status"])
                p.hget(sk.runs, f"{rid}.status")
                tenant, (intent, brain), hands = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="hands", namespace=store.keys.ns) from exc
        if isinstance(tenant, bytes):
            tenant = tenant.decode()
        status = run_status(_text(brain), _text(hands))
        settled = intent is None or status in ("completed", "awaiting_approval")
        return (tenant if isinstance(tenant, str) and TENANT.match(tenant) else "", settled)

    async def _note_wait(self, dispatch: ToolDispatch, state: str, position: int,
                         waited_ms: int) -> None:
        """Say in the session's receipts that the run waits for its tool's slot, got it or
        stopped waiting (slot_wait.lua), so that watch, the console and the trace show the
        wait: one receipt when a wait begins, one when it ends; none while the run asks
        again. Best effort: a note Redis refused leaves the wait unshown, the run goes on."""
        assert self.store is not None
        try:
            await self.store.runs.slot_wait(
                dispatch.session_id, dispatch.run_id, dispatch.tool, self.worker, state,
                position=position, waited_ms=waited_ms)
        except BatonError as exc:
            log.warning("tool_slot_note_failed", tool=dispatch.tool, state=state,
                        error=bounded(exc))

    async def _renew_slot(self, tool: str, limit: ToolLimit, member: str) -> None:
        """Renew a held slot now, then every third of its time while the run executes
        (started a third of the slot's time after it was taken, see :meth:`_slot`)."""
        assert self.limits is not None
        while True:
            try:
                if not await self.limits.renew(tool, limit, member):
                    log.warning("tool_slot_lost", tool=tool,
                                note="its time passed unrenewed (this Hands' event loop or "
                                     "Redis stalled): the run goes on, no longer counted")
                    return
            except BatonError as exc:  # Redis away: the next tick tries again
                log.warning("tool_slot_renew_failed", tool=tool, error=bounded(exc))
            await asyncio.sleep(self.limits.slot_ms / 3000)

    async def _claim_execute_complete(
        self, msg: Msg, dispatch: ToolDispatch, delivery: int, done: Handled
    ) -> None:
        """Claim the run's attempt (its fence), execute the tool and complete the run
        under that fence, then ack the message; a duplicate, a busy run or a lost claim
        settles the message without executing."""
        assert self.store is not None and self.execution is not None
        asked = time.monotonic()
        try:
            claim = await self.store.runs.claim(
                dispatch.session_id, dispatch.run_id, self.worker, delivery=delivery,
                carrier=carrier_of(msg),  # the trace names the relay that carried this message
                tool=dispatch.tool,  # claim.lua refuses a run committed for another tool
            )
        except ArchivedError as exc:  # a late message for a session that left Redis
            done.outcome = "dead_letter"
            await self._dead_letter(msg, str(exc), delivery)
            await settle(msg.ack())
            return
        except ToolMismatchError as exc:
            done.outcome = "dead_letter"
            await self._dead_letter(msg, f"tool mismatch: the message names {exc.presented!r}, "
                                         f"the run's committed intent {bounded(exc.committed)!r}",
                                    delivery)
            await settle(msg.term())
            return
        if claim.status == "busy" and await self._holder_gone(claim.holder):
            # The holder's connection is gone (its process died): take over now, not after
            # its heartbeat expires; the fence keeps a holder that was in fact alive harmless.
            log.info("attempt_holder_gone", previous_worker=claim.holder)
            claim = await self.store.runs.claim(
                dispatch.session_id, dispatch.run_id, self.worker, delivery=delivery,
                carrier=carrier_of(msg), tool=dispatch.tool, gone_holder=claim.holder,
            )
        if claim.status == "done":
            done.outcome = "duplicate"
            await settle(msg.ack())
            return
        if claim.status == "gone":
            done.outcome = "dead_letter"
            await self._dead_letter(msg, "unknown run", delivery)
            await settle(msg.ack())
            return
        if claim.status == "busy":  # another live attempt: never take it over
            done.outcome = "busy"
            await settle(msg.nak(delay=claim.remaining_ms / 1000 + BUSY_MARGIN_S))
            return
        self.faults.hit("hands.after_claim")
        assert claim.intent is not None
        intent = claim.intent
        if time.monotonic() - asked > self.settings.attempt_ttl_ms / 3000 and not (
                await self._still_ours(intent, claim.attempt)):
            done.outcome = "taken_over"
            return  # the new owner completes and acks
        bind(attempt=claim.attempt, fence=claim.attempt, task_id=intent.task_id)
        if claim.recovering:
            log.info("attempt_recovering", previous_attempt=claim.previous_attempt,
                     previous_worker=claim.previous_worker, replay=intent.replay)
        try:
            result = await execute(
                intent, claim.attempt, self.execution.result(claim, intent, delivery)
            )
        except AttemptLost as lost:
            done.outcome = "taken_over"
            log.warning("attempt_taken_over", current=lost.err.fields["current"],
                        status=lost.err.fields["status"])
            return  # the new owner completes and acks
        if result is None:  # recovery could not decide now: the next delivery tries again
            done.outcome = "retry"
            await settle(msg.nak(delay=self.settings.attempt_ttl_ms / 1000 + BUSY_MARGIN_S))
            return
        self.faults.hit("hands.after_effect")
        result = self.execution.limit(result)
        done.recovery = result.recovery
        done.outcome = result.outcome
        if not result.ok:  # the line says what went wrong, as the result does
            done.error = {"error_code": result.error_code or "",
                          "error": bounded(result.error or "")}
        if not await self._complete(intent, claim.attempt, result, delivery):
            done.outcome = "complete_refused"
            return  # stale: the attempt that took over completes and acks
        self.faults.hit("hands.after_complete")
        await settle(msg.ack())

    async def _still_ours(self, intent: ToolIntent, attempt: int) -> bool:
        """After a claim whose reply came late (a replica's acknowledgement waited for in a
        failover, a slow Redis), beat the attempt once before acting: it may have lapsed
        and been taken over meanwhile, and its tool must then not run. The beat is fenced:
        it refuses an attempt that is no longer current, and extends one that is. A Redis
        that cannot answer raises (the message is retried later): nothing runs unverified."""
        assert self.store is not None
        try:
            await self.store.runs.heartbeat(intent.session_id, intent.run_id, attempt,
                                            self.worker)
        except StaleAttemptError as err:
            log.warning("attempt_lost_before_start", current=err.fields["current"],
                        status=err.fields["status"])
            return False
        return True

    async def _holder_gone(self, holder: str) -> bool:
        """NATS says ``holder`` (another Hands) has no connection: its process is gone."""
        if not holder or holder == self.worker.name or self.bus is None:
            return False
        return await liveness.is_gone(self.bus.nc, self.settings.namespace, holder)

    # ------------------------------------------------------------------ committing

    async def _complete(
        self, intent: ToolIntent, attempt: int, result: ToolResult, delivery: int
    ) -> bool:
        """Commit the result under the attempt fence; False when a newer attempt owns the run.

        Retried while Redis is unreachable: the fence makes a repeat harmless, and a repeat
        of our own complete whose reply was lost is recognised below.
        """
        assert self.store is not None
        delays = iter(COMPLETE_RETRIES)
        while True:
            try:
                woke = await self.store.runs.complete(
                    intent.session_id, intent, attempt, result, self.worker,
                    force_wake=not result.ok, detail={"delivery": delivery},
                )
            except ArchivedError as err:  # archived meanwhile: refused, nothing written
                log.warning("complete_refused", reason=str(err))
                return False
            except StaleAttemptError as err:
                current, status = err.fields["current"], err.fields["status"]
                if current == attempt and status == "completed":
                    log.info("complete_already_applied")  # our own earlier, reply lost
                    return True
                log.warning("complete_refused", current=current, status=status)
                return False
            except RedisUnavailable:
                delay = next(delays, None)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            log.debug("run_completed", woke=woke)
            return True

    async def _dead_letter(self, msg: Msg, reason: str, delivery: int) -> None:
        """Record a tool message that can never be handled; a copy that came around
        JetStream is not recorded (its stored message is, once delivered)."""
        assert self.store is not None
        if is_fallback(msg):
            return
        log.warning("tool_message_dead_lettered", reason=bounded(reason))
        await record_dead_letter(
            self.store.redis, self.store.keys, role="hands", source="hands", reason=reason,
            payload=msg.data, subject=msg.subject, delivery=delivery, worker=self.name,
        )


async def main(settings: Settings, app_spec: str, tools: list[str] | None = None) -> None:
    """Entry point of ``baton hands``: serve the app's tools until SIGTERM/SIGINT."""
    tune_collector()
    app = load_app(app_spec)
    worker = HandsWorker(settings, app, tools)
    if any(t.isolation == "process" for t in worker.tools.values()):
        harden_worker()  # its isolated children may not read this process's environment
    await run_until_signalled(worker)


def _text(value: object) -> str | None:
    """A reply field as text (a client without decode_responses answers bytes)."""
    return value.decode() if isinstance(value, bytes) else value if isinstance(value, str) else None
