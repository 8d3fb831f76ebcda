"""One woken session on one Brain: lease, load, schedule until idle, check dirty, release.

The lease is renewed in the background while phases run; if renewal finds a newer fence
(this Brain was paused or partitioned and another took over), the pass is cancelled and
nothing more is written: every later commit would be refused anyway. A pass cancelled by
its Brain stopping hands the session over instead (release.lua's handover): the next Brain
leases it at once, and the phase it left is not counted as a crash.

A pass sees its Brain only through :class:`BrainContext`: the connections, configuration
and the app's code a pass needs, built once by the Brain when it has connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from baton.app import App
from baton.archive import Archive
from baton.brain.budget import ModelGate
from baton.brain.context import TaskContext
from baton.brain.held import Holds
from baton.brain.interrupts import CancelWatch
from baton.brain.registry import Registry
from baton.brain.scheduler import schedule
from baton.bus.subjects import BusNames
from baton.errors import ArchivedError, NotArchivable, NotFoundError, StaleFenceError
from baton.faults import Faults
from baton.models import WorkerRef
from baton.observability.log import get_logger
from baton.observability.tracing import recheck_span
from baton.receipts import Carrier
from baton.settings import Settings
from baton.store import retention
from baton.store.state import SessionState
from baton.store.store import HoldEnd, Store

log = get_logger("baton.brain")

#: How long a stopping pass waits for the store to take its handover (Store.hand_over): well
#: within the 2 s the drain gives its cancelled passes (baton.service.Service.drain).
HAND_OVER_S = 1.0


def _quiet(call: asyncio.Future[None]) -> None:
    """Retrieve the outcome of a handover no longer waited for (logged by its waiter)."""
    if not call.cancelled():
        call.exception()


@dataclass(frozen=True)
class BrainContext:
    """What every session pass of one Brain shares."""

    store: Store
    settings: Settings
    worker: WorkerRef
    app: App
    names: BusNames
    faults: Faults
    handlers: Registry
    # Model clients built on first use, shared by the passes (the Brain closes them).
    models: dict[str, Any] = field(default_factory=dict)
    # The Brain's hold channels: where a pass that dispatched tool runs waits for their
    # results under its lease (brain.held); None: passes never hold.
    holds: Holds | None = None
    # Where settled sessions go once their retention passed, and come back from
    # (baton.store.retention); None: this Brain neither archives nor restores.
    archive: Archive | None = None
    # The models' fleet-wide budgets (brain.budget); None: no model has one.
    budgets: ModelGate | None = None


@dataclass
class PassResult:
    fence: int = 0
    commits: int = 0
    passes: int = 0
    takeover: bool = False
    holds: int = 0  # times the pass held its lease for tool results (brain.held)
    archived: bool = False  # the pass archived the session (it left Redis)
    restored: bool = False  # the pass brought the session back from the archive first


def _settled(state: SessionState) -> bool:
    """Nothing live in the session: no open task, no request, no decision, no live run."""
    return (not any(not t.terminal for t in state.tasks.values()) and not state.requests
            and not state.decisions and not state.meta.cancels
            and not any(r.status in ("dispatched", "running", "awaiting_approval")
                        for r in state.runs.values()))


class SessionPass:
    """Processes one session until nothing is runnable. Created per wake."""

    def __init__(
        self, brain: BrainContext, session_id: str, *, carrier: Carrier | None = None
    ) -> None:
        self.brain = brain
        self.session_id = session_id
        # How the wake that (re)started this pass arrived: recorded in the lease receipt.
        self.carrier = carrier
        self.rewake = False  # set when another wake for this session arrives meanwhile
        self.lost: StaleFenceError | None = None
        # The cancel requests the lease renewals find in the inbox (brain.interrupts).
        self.cancels = CancelWatch()

    async def _restore_asked(self) -> bool:
        """Whether a client's restore request waits in the inbox (ask_restore.lua)."""
        inbox = self.brain.store.keys.session(self.session_id).inbox
        return bool(await self.brain.store.redis.hexists(inbox, "restore"))

    async def _asked_back(self) -> bool:
        """Whether a client's request waits in the archived session's inbox."""
        inbox = self.brain.store.keys.session(self.session_id).inbox
        return bool(await self.brain.store.redis.hlen(inbox))

    def join(self, carrier: Carrier | None) -> None:
        """Another wake of this session arrived here: recheck after this round (a pass
        holding its lease ends its hold and rechecks at once)."""
        self.rewake = True
        self.carrier = carrier  # its next lease receipt names this wake
        if self.brain.holds is not None:
            self.brain.holds.join(self.session_id)

    async def run(self) -> PassResult:
        brain, sid = self.brain, self.session_id
        settings = brain.settings
        result = PassResult()
        while True:
            try:
                lease, state = await brain.store.acquire_and_load(
                    sid, brain.worker, settings.lease_ms, carrier=self.carrier
                )
            except ArchivedError:
                # A client asked for it back (a request waits in the inbox): restore it,
                # then lease it as usual. Anything else is a late wake: refused (but for the
                # wake that joined this pass while it archived the session: its archival).
                if brain.archive is None or not await self._asked_back():
                    if result.archived:
                        return result
                    raise
                result.restored = await retention.restore(brain.store, brain.archive, sid,
                                                          brain.worker) or result.restored
                continue
            except NotFoundError:
                # Neither the session nor its tombstone is in Redis: a client found it in the
                # archive (its tombstone expired) and asked for it back. The tombstone is
                # written back from the archive object, then restored as above.
                if brain.archive is None or not await self._restore_asked():
                    raise
                if not await retention.reinstate(brain.store, brain.archive, sid):
                    raise
                continue
            self.carrier = None  # recorded; a joined wake sets the next one
            result.fence, result.takeover = lease.fence, result.takeover or lease.takeover
            structlog.contextvars.bind_contextvars(fence=lease.fence)  # every later line
            brain.faults.hit("brain.after_wake")
            if brain.archive is not None and _settled(state) and not self.rewake:
                try:
                    if await retention.archive_if_due(brain.store, brain.archive, sid,
                                                      lease.fence, brain.worker):
                        result.archived = True  # its keys, the lease among them, are gone
                        if not self.rewake:
                            return result
                        # A wake joined this pass meanwhile (acked, as any joined wake): a
                        # client asking for the session back, whose repeated asks carry the
                        # same message id (deduplicated), so no other wake would come. Look
                        # again: the lease is refused ARCHIVED, and the request restores it.
                        self.rewake = False
                        continue
                except NotArchivable as exc:  # it moved meanwhile: an ordinary pass
                    log.info("archive_skipped", session_id=sid, reason=exc.reason)
            await self._under_lease(lease.fence, result, state)
            if not self.rewake:
                return result
            self.rewake = False  # a wake raced our release: go round once more

    async def _under_lease(self, fence: int, result: PassResult, state: SessionState) -> None:
        """Work while a background task renews the lease; a lost lease stops the work.

        The renewer is stopped through an Event rather than only by cancellation: redis-py
        may swallow a cancellation that lands inside a command.
        """
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        me = asyncio.current_task()
        renewer: asyncio.Task[None] | None = None

        def start_renewer() -> None:  # most passes end before the first renewal is due
            nonlocal renewer
            renewer = loop.create_task(self._renew(fence, done, me))

        timer = loop.call_later(self.brain.settings.lease_ms / 3000, start_renewer)
        stopped = False
        try:
            await self._work(fence, result, state)
        except asyncio.CancelledError:
            if self.lost is None or me is None:
                # by the caller (the Brain is stopping, its drain ran out), not by a lost lease
                stopped = self.lost is None
                raise
            me.uncancel()  # cancelled by our renewer, not by the caller
        finally:
            timer.cancel()
            done.set()
            if renewer is not None:
                await asyncio.wait({renewer}, timeout=2.0)
            if stopped:
                await self._hand_over(fence)
        if self.lost is not None:
            raise self.lost

    async def _hand_over(self, fence: int) -> None:
        """Tell the store this pass stopped on purpose (Store.hand_over): the next Brain
        leases the session at once and does not count the phase this pass left as a crash.

        Bounded and shielded from the cancellation that stopped the pass: without an answer
        within HAND_OVER_S the session is left as a crash leaves it (the lease lapses, the
        phase is counted), which is safe."""
        call = asyncio.ensure_future(self.brain.store.hand_over(self.session_id, fence))
        call.add_done_callback(_quiet)
        try:
            async with asyncio.timeout(HAND_OVER_S):
                await asyncio.shield(call)
        except TimeoutError:
            log.warning("hand_over_unanswered", session_id=self.session_id, fence=fence)
        except StaleFenceError:
            pass  # another Brain took over meanwhile: nothing of ours to hand over
        except Exception as exc:  # Redis away: as a crash, the lease lapses
            log.warning("hand_over_failed", session_id=self.session_id, fence=fence,
                        error=str(exc))
        else:
            log.info("session_handed_over", session_id=self.session_id, fence=fence)

    async def _work(self, fence: int, result: PassResult, state: SessionState) -> None:
        brain, sid = self.brain, self.session_id
        lease_ms = brain.settings.lease_ms
        # Holds the span of a recheck after a hold's signal (tracing.recheck_span): from
        # the release that finds the results to the end of the schedule that applies them.
        recheck_span_scope = contextlib.ExitStack()
        try:
            while True:
                ctx = TaskContext(
                    session_id=sid, fence=fence, state=state, store=brain.store,
                    settings=brain.settings, app=brain.app, names=brain.names,
                    worker=brain.worker, faults=brain.faults, models=brain.models,
                    holds=brain.holds, cancels=self.cancels, budgets=brain.budgets,
                )
                self.cancels.reset()  # the schedule takes up the cancels waiting now
                await self._schedule(ctx)
                recheck_span_scope.close()
                result.commits += ctx.commits
                result.passes += 1
                if ctx.yielded:  # a task still running: take up what arrived, then go on
                    state = await brain.store.reload_under_lease(sid)
                    continue
                if ctx.holding and ctx.released_at == ctx.commits:
                    # The last commit kept the lease for the results of the runs it
                    # dispatched (brain.held): wait for their signal, then recheck under
                    # the same fence.
                    rechecked = await self._hold(fence, result, recheck_span_scope)
                    if rechecked is None:
                        return
                    state = rechecked
                    continue
                if ctx.released_at and ctx.released_at == ctx.commits:
                    again = ctx.recheck  # the last commit released the lease (or kept it)
                else:
                    again = await brain.store.release(sid, fence, lease_ms)
                if not again:
                    return
                # work arrived meanwhile (the nudge): recheck under the same lease
                state = await brain.store.reload_under_lease(sid)
        finally:
            recheck_span_scope.close()
            if brain.holds is not None:  # a hold registered by a commit that never held
                brain.holds.forget(sid)

    async def _hold(self, fence: int, result: PassResult,
                    recheck_span_scope: contextlib.ExitStack) -> SessionState | None:
        """Hold the lease until the results' signal comes (or the hold runs its length),
        then release, which finds them (the nudge) and keeps the lease for the recheck: the
        state to recheck, or None when nothing arrived and the lease was released. After a
        signal, the recheck runs in a span that continues the completion's trace, and the
        state comes in the release's round trip."""
        brain, sid = self.brain, self.session_id
        holds = brain.holds
        assert holds is not None
        lease_ms = brain.settings.lease_ms
        since = time.monotonic()
        headers = await holds.hold(sid)
        result.holds += 1
        end = HoldEnd(brain.worker, heard=headers is not None,
                      hold_ms=round((time.monotonic() - since) * 1000))
        rechecked: SessionState | None
        if headers is None:  # ran its length: a signal lost, or the results are not in yet
            rechecked = await brain.store.release_and_load(sid, fence, lease_ms, hold_end=end,
                                                        read_ahead=False)
        else:
            keys = brain.store.keys
            channel = keys.hold_channel(keys.shard_of(sid), holds.name)
            recheck_span_scope.enter_context(recheck_span(sid, channel, headers))
            rechecked = await brain.store.release_and_load(sid, fence, lease_ms, hold_end=end)
        if rechecked is None:
            return None
        self.rewake = False  # what a wake joined meanwhile brought is in this state
        brain.faults.hit("brain.after_wake")  # woken under the same lease
        return rechecked

    async def _schedule(self, ctx: TaskContext) -> None:
        """Advance every runnable task until it waits, sleeps or ends (brain.scheduler)."""
        await schedule(self.brain.handlers, ctx)

    async def _renew(self, fence: int, done: asyncio.Event, work: asyncio.Task | None) -> None:
        brain = self.brain
        interval = brain.settings.lease_ms / 3000
        first = True
        while not done.is_set():
            if not first:  # the first renewal is due when this task starts
                try:
                    await asyncio.wait_for(done.wait(), interval)
                    return
                except TimeoutError:
                    pass
            first = False
            try:
                renewal = await brain.store.renew(self.session_id, fence,
                                                  brain.settings.lease_ms, brain.worker)
                self.cancels.saw(renewal.cancels)
            except StaleFenceError as exc:
                log.warning("lease_lost", session_id=self.session_id, fence=fence,
                            current=exc.current)
                self.lost = exc
                if work is not None and not done.is_set():
                    work.cancel()
                return
            except Exception as exc:  # Redis blip: the next renewal may still make it
                log.warning("lease_renew_failed", session_id=self.session_id, error=str(exc))
