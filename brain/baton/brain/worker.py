"""The Brain service: consumes wakes and runs sessions' tasks under their leases.

One durable pull consumer per (agent, compat level) the app serves: each agent's own level
and the older levels it ``migrates_from`` (brain.versions), shared by all Brain replicas
of that level, old and new. The served levels are part of the Brain's announcement, so
``inspect`` can tell sessions at a level no live Brain serves. A wake is acknowledged only
after its session was processed; while it is being processed, JetStream is told so
(``in_progress``), so a Brain that dies mid-session has its wake redelivered to another
replica, which takes over once the lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from nats.aio.msg import Msg

from baton.app import App, load_app
from baton.archive import Archive
from baton.brain.budget import ModelGate
from baton.brain.held import Holds
from baton.brain.model import model_client
from baton.brain.registry import Registry
from baton.brain.session import BrainContext, SessionPass
from baton.budgets import parse_budgets
from baton.bus.bus import Bus
from baton.bus.fallback import is_fallback
from baton.bus.messages import carrier_of, delivery_count, heartbeat, retry_later, settle
from baton.bus.subjects import BusNames
from baton.bus.timer_notify import TimerNotifier
from baton.errors import (
    ArchivedError,
    BatonError,
    ConfigError,
    CorruptStateError,
    LeaseBusyError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
    ValidationError,
)
from baton.faults import Faults
from baton.models import Wake, decode
from baton.observability import log as logs
from baton.observability.canonical import CanonicalLines
from baton.observability.log import get_logger
from baton.observability.tracing import consumer, traced_model
from baton.service import Service, run_until_signalled, tune_collector
from baton.settings import Settings
from baton.store import quarantine
from baton.store.admission import AdmissionQueue
from baton.store.budgets import Budgets
from baton.store.clock import StoreClock
from baton.store.deadletter import record_dead_letter
from baton.store.entry_cache import EntryCache
from baton.store.epoch import StoreEpoch
from baton.store.store import Store

log = get_logger("baton.brain")

# An idle consumer's long poll: one pull request per this long. A message ends it at once,
# as do shutdown and a reconnect (the server forgets pull requests with the connection, see
# Puller.fetch), so it bounds nothing but how often an idle worker asks: each pull costs
# the NATS server a wake-up.
FETCH_TIMEOUT_S = 30.0



class BrainWorker(Service):
    role = "brain"

    def __init__(self, settings: Settings, app: App, *,
                 clock: StoreClock | None = None) -> None:
        super().__init__(settings)
        # Redis' clock as this Brain measures it: its tasks' timers are due on it.
        # Injectable: a test runs a Brain whose host clock is skewed.
        self.clock = clock or StoreClock()
        if not app.agents:  # it would consume no wakes: serve nothing, silently
            raise ConfigError("a Brain worker needs at least one agent to serve (App(agents="
                              "[...]); a custom task runs under an agent, by default the one "
                              "named as its kind)")
        self.app = app.with_model(settings.agent_model) if settings.agent_model else app
        # Every agent's model client is built now: an unknown model name or a missing key
        # stops the start with its reason, not each session with a model_error later
        self._models = {
            agent.model: traced_model(agent.model, model_client(agent.model, settings))
            for agent in self.app.agents.values() if agent.model not in self.app.models}
        # The models' fleet-wide budgets: the App's, then BATON_MODEL_BUDGETS' (brain.budget)
        self.budgets = {**self.app.model_budgets, **parse_budgets(settings.model_budgets)}
        self.names = BusNames(settings.namespace)
        self.faults = Faults(settings.fault)
        self.handlers = Registry.from_app(self.app)
        self.active: dict[str, SessionPass] = {}
        self.slot_freed = asyncio.Event()
        self.context: BrainContext | None = None  # what the passes share, once connected
        self.holds: Holds | None = None  # the hold channels, once connected
        self.admission: AdmissionQueue | None = None  # fair admission, once connected
        self.handled = 0
        self._lines = CanonicalLines(log, "wake_handled", each=settings.log_each_message)

    async def serve(self) -> None:
        cache_bytes = self.settings.entry_cache_bytes
        store = await self.connect("redis", lambda: Store.connect(
            self.settings, entry_cache=EntryCache(cache_bytes) if cache_bytes else None))
        store.clock = self.clock
        await self.connect("redis", lambda: self.clock.sync(store.redis))
        self.admission = AdmissionQueue(store.redis, store.keys, self.settings)
        holds = self.holds = Holds(
            store.redis, store.keys, self.name, self.settings.shards,
            hold_ms=self.settings.brain_hold_ms, limit=self.settings.brain_concurrency,
            stopping=self.stopping)
        holds.on_hold = self.slot_freed.set  # a held pass frees its slot (see _consume)
        gate = ModelGate(self.budgets, Budgets(store.redis, store.keys,
                                               slot_ms=self.settings.lease_ms),
                         None, worker=self.name, max_output=self.settings.model_max_tokens,
                         weights=self.settings.tenant_weights) if self.budgets else None
        self.context = BrainContext(
            store=store, settings=self.settings, worker=self.worker, app=self.app,
            names=self.names, faults=self.faults, handlers=self.handlers, holds=holds,
            models=self._models, archive=Archive.from_url(self.settings.archive_location()),
            budgets=gate,
        )
        try:
            epoch = await self.connect(
                "redis", lambda: StoreEpoch.establish(store.redis, store.keys)
            )
            bus = self.bus = await self.connect(
                "nats", lambda: Bus.connect(self.settings, self.name, self.role)
            )
            store.timers_armed = TimerNotifier(bus)
            if gate is not None:  # another Brain's message that a budget's slot is free
                gate.bus = bus
                await gate.listen()
            try:
                await bus.ensure_streams()
                consumers = []
                for agent, level in self.levels():
                    durable = self.names.wake_durable(agent, level)
                    await bus.ensure_consumer(
                        self.names.wake_stream, durable,
                        self.names.wake_subject(agent, level),
                        max_ack_pending=max(1000, self.settings.brain_concurrency * 4),
                    )
                    consumers.append((durable, self.names.wake_subject(agent, level)))
                listener = asyncio.ensure_future(holds.run())
                # bounded: a subscription that hangs leaves this Brain releasing, not waiting
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(holds.tried.wait(), 5.0)
                self.ready.set()
                log.info("brain_ready", worker=self.name, consumers=[d for d, _ in consumers])
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self.announce(store.redis, store.keys))
                        tg.create_task(self.watch_epoch(epoch))
                        tg.create_task(self.clock.keep(store.redis, self.stopping))
                        for durable, subject in consumers:
                            tg.create_task(self._consume(bus, durable, subject))
                    await self.drain()
                finally:
                    listener.cancel()
                    await asyncio.gather(listener, return_exceptions=True)
            finally:
                await bus.close()
        finally:
            self._lines.flush()
            await store.close()
            await self._close_models(self._models)
            log.info("brain_stopped", worker=self.name, handled=self.handled)

    @staticmethod
    async def _close_models(models: dict[str, Any]) -> None:
        """Close the model clients this Brain built (their HTTP connection pools)."""
        built = list(models.values())
        models.clear()
        for client in built:
            close = getattr(client, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception as exc:  # closing is best effort at shutdown
                    log.warning("model_close_failed", error=str(exc))

    def levels(self) -> list[tuple[str, int]]:
        """(agent, compat level) pairs whose wakes this Brain consumes."""
        return [(a.name, level) for a in self.app.agents.values() for level in a.levels]

    def announcement(self) -> dict[str, object]:
        # kinds: the task kinds (and versions) it can run, for a client starting a task no
        # live Brain knows (it would wait, blocked, for one that does)
        out: dict[str, object] = {"serves": [[a, level] for a, level in self.levels()],
                                  "kinds": self.handlers.kinds()}
        if self.budgets:  # inspect shows each budget's state (baton.store.budgets)
            out["budgets"] = {k: b.as_dict() for k, b in self.budgets.items()}
        return out

    async def _consume(self, bus: Bus, durable: str, subject: str) -> None:
        puller = await bus.pull(self.names.wake_stream, durable, subject)
        try:
            while not self.stopping.is_set():
                # passes holding a lease for tool results only wait: they take no slot
                holding = self.holds.holding if self.holds is not None else 0
                free = self.settings.brain_concurrency - self.inflight + holding
                if free <= 0:  # bounded: wait for a session to finish
                    self.slot_freed.clear()
                    await self.slot_freed.wait()
                    continue
                try:
                    msgs = await puller.fetch(min(free, 64), timeout=FETCH_TIMEOUT_S,
                                              stop=self.stopping)
                except Exception as exc:  # NATS down: keep trying until it is back
                    log.warning("wake_fetch_failed", error=str(exc))
                    await self.wait_stopping(0.5)
                    continue
                for msg in msgs:
                    task = self.spawn(self._handle(msg))
                    task.add_done_callback(lambda _t: self.slot_freed.set())
        finally:
            await puller.close()

    @consumer("brain")  # the CONSUMER span, child of the context in the wake's headers
    async def _handle(self, msg: Msg) -> None:
        assert self.context is not None  # set before any consumer starts
        started = time.perf_counter()
        logs.clear()
        try:
            wake = decode(Wake, msg.data)
        except ValidationError as exc:
            await self._dead_letter(msg, str(exc))
            await msg.term()
            log.error("wake_undecodable", error=logs.bounded(exc))
            return
        sid = wake.session_id
        logs.bind(session_id=sid, reason=logs.bounded(wake.reason), delivery=delivery_count(msg))
        if wake.admitted:  # a new session's first wake: the next in line may start
            self.spawn(self._admitted(sid))
        current = self.active.get(sid)
        if current is not None:  # already in hand here: make that pass recheck
            current.join(carrier_of(msg))
            await msg.ack()
            self._lines.line(delivery_count(msg) == 1, outcome="joined", fence=0,
                             ms=round((time.perf_counter() - started) * 1000, 2))
            logs.clear()
            return
        session = SessionPass(self.context, sid, carrier=carrier_of(msg))
        self.active[sid] = session
        outcome, fence = "crashed", 0
        try:
            async with heartbeat(msg, self.settings.ack_wait_s / 3):
                result = await session.run()
            fence = result.fence
            await msg.ack()
            outcome = "takeover" if result.takeover else "done"
        except asyncio.CancelledError:
            # The drain ran out (or a second signal) with the pass still working, a model
            # call perhaps (model_call_timeout_s outlasts any drain): hand the session over
            # now, not after ack_wait. Its last commit stands; the pass released the lease
            # with a handover mark (SessionPass._hand_over), so the Brain the wake comes back
            # to leases it at once and redoes what came after, which counts as no crash.
            outcome = "handed_over"
            await settle(msg.nak())
            raise
        except LeaseBusyError as exc:
            outcome = "busy"
            await msg.nak(delay=exc.remaining_ms / 1000 + 0.05)
        except StaleFenceError as exc:
            outcome, fence = "fenced", exc.presented  # a newer Brain owns it: stop touching it
        except ArchivedError as exc:  # a late wake for a session that left Redis
            outcome = "archived"
            await self._dead_letter(msg, str(exc), sid)
            await msg.ack()
        except NotFoundError as exc:
            outcome = "unknown_session"
            await self._dead_letter(msg, str(exc), sid)
            await msg.ack()
        except UnavailableError as exc:
            log.warning("wake_retry_later", error=logs.bounded(exc))
            given_up = await retry_later(msg, delivery_count(msg), self.settings.max_deliver,
                                         "wake") == "given_up"
            outcome = "given_up" if given_up else "unavailable"
        except (CorruptStateError, ValidationError) as exc:  # undecodable: counted, bounded
            outcome = await self._poisoned(msg, sid, exc)
        except BatonError as exc:
            outcome = "error"
            log.error("wake_failed", error=logs.bounded(exc), code=exc.code)
            await settle(msg.nak(delay=1.0))
        except Exception as exc:  # a KeyError in a parser, a bug: the same bound, no loop
            outcome = await self._poisoned(msg, sid, exc)
        finally:
            self.active.pop(sid, None)
            self.handled += 1
            # Routine (first delivery, done, not a timer's wake): counted, at DEBUG.
            self._lines.line(outcome == "done" and delivery_count(msg) == 1
                             and not wake.reason.startswith("timer"),
                             outcome=outcome, fence=fence,
                             ms=round((time.perf_counter() - started) * 1000, 2))
            logs.clear()


    async def _admitted(self, sid: str) -> None:
        """Free the place of new session ``sid`` in its shard's admission window for the
        next in line (baton.store.admission), beside its pass. A failure only delays them:
        the place is freed after ``admission_start_ms`` anyway."""
        assert self.admission is not None
        try:
            started = await self.admission.received(sid)
        except BatonError as exc:
            log.warning("admission_receipt_failed", session_id=sid, error=logs.bounded(exc))
            return
        if started:
            log.debug("admission_moved", session_id=sid, started=started)

    async def _dead_letter(self, msg: Msg, reason: str, sid: str | None = None) -> None:
        """Record a wake that can never be handled; a copy that came around JetStream is
        not recorded (its stored message is, once delivered: one record per wake)."""
        if is_fallback(msg):
            return
        assert self.context is not None
        store = self.context.store
        await record_dead_letter(store.redis, store.keys, role="brain", source="wake",
                                 reason=reason, payload=msg.data, session_id=sid)

    async def _poisoned(self, msg: Msg, sid: str, exc: Exception) -> str:
        """Count a failure to process ``sid``; ack its wake once it is quarantined. A copy
        that came around JetStream is not counted (its stored message is, once delivered)."""
        assert self.context is not None
        log.error("session_failed", error=quarantine.reason_of(exc), code=getattr(
            exc, "code", type(exc).__name__))
        if is_fallback(msg):
            return "error"
        try:
            verdict = await quarantine.count_failure(
                self.context.store, sid, exc, self.settings.poison_limit)
        except BatonError as err:  # Redis away: the redelivery counts it later
            log.warning("poison_count_failed", error=str(err))
            await settle(msg.nak(delay=1.0))
            return "error"
        if verdict.quarantined:
            await msg.ack()
            return "quarantined"
        await settle(msg.nak(delay=1.0))
        return "poisoned"


async def main(settings: Settings, app_spec: str) -> None:
    """``baton brain``: a Brain as its own process (whose collector it may tune)."""
    tune_collector()
    await run_until_signalled(BrainWorker(settings, load_app(app_spec)))
