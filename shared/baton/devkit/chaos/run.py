"""A chaos run: many five-notice sessions while workers are killed, paused and the servers
restarted; then the invariants of DESIGN section 4 are checked.

A durable :class:`~baton.devkit.devstack.DevStack` (Redis AOF ``always``, JetStream ``sync_interval:
always``) runs brains, hands and relays as separate supervised processes with the chaos app
(:mod:`baton.examples.chaos_app`). Sessions are submitted at a steady rate, each to five recipients
of its own, a share of them through the non-idempotent ``unsafe`` tool. Meanwhile, from one
seeded random generator (:class:`~baton.devkit.chaos.faults.ChaosFaults`):

- every ``--kill-every`` seconds a random brain, hands or relay is SIGKILLed; the supervisor
  starts it again after its backoff, as an orchestrator would;
- every ``--pause-every`` seconds a random brain or hands is SIGSTOPped for longer than its
  lease, attempt TTL and ack wait, then SIGCONTed: it comes back stale;
- Redis and NATS are each SIGKILLed and started again on the same port and data, ``K``
  times, spread over the submission window (on a cluster, ``--cluster``: one random node of
  it each time);
- with ``--partitions N`` (a cluster whose servers and services each run in their own
  network namespace, :mod:`baton.devkit.netns`; root only) the network is cut ``N`` times,
  spread over the window, for :data:`~baton.devkit.chaos.faults.PARTITION_S` each, then
  healed: a random Redis or NATS node isolated, or a random brain, hands or relay cut off
  from every Redis node or from every NATS node. A worker cut off from Redis is counted with
  the paused ones (it may act late, as they do).

Once every submission settled (or the deadline passed) the faults stop, paused workers are
resumed and the stack is given a moment to drain; then :mod:`baton.devkit.chaos.checks`
checks the facts. The ``baton chaos`` command (:mod:`baton.devkit.chaos`) prints a report and
ends with one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from redis.exceptions import RedisError

from baton.client import Client
from baton.devkit.chaos.checks import (
    ChaosConfig,
    ChaosReport,
    Findings,
    SessionFacts,
    check_mail,
    check_session,
)
from baton.devkit.chaos.faults import PARTITION_S, PAUSE_S, ChaosFaults
from baton.devkit.devstack import DevStack, Proc
from baton.errors import ArchivedError, UnavailableError
from baton.store import retention
from baton.store.deadletter import dead_letters
from baton.store.keys import RELAY_GROUP
from baton.store.outbox import Outbox
from baton.store.store import now_ms

__all__ = ["CHAOS_ENV", "PARTITION_S", "PAUSE_S", "ChaosConfig", "ChaosReport", "ChaosRun",
           "run_chaos"]

T = TypeVar("T")

APP = "baton.examples.chaos_app:app"
UNSAFE_AGENT = "notices_unsafe"
RECIPIENTS = 5
# Timings short enough for many takeovers in a run, long enough for a loaded 2-core machine.
CHAOS_ENV = {
    "BATON_ACK_WAIT_S": "2",
    "BATON_ATTEMPT_TTL_MS": "1500",
    "BATON_LEASE_MS": "2000",
    "BATON_RELAY_CLAIM_IDLE_MS": "1000",
    "BATON_PROGRESS_DEADLINE_MS": "4000",
}
_RETRY_S = 60.0  # how long the runner's own reads ride out a server restart
_DRAIN_S = 15.0
# After a run with a Redis restart: probe sessions a surviving worker may take to show it
# recovered, in rounds of this many at once, and how long each may take.
_PROBE_ROUNDS = 5
_PROBE_SESSIONS = 8
_PROBE_WAIT_S = 30.0
_DOWN = (UnavailableError, RedisError, OSError)  # a server restarting: try again


def _notice_text(recipients: Iterable[str]) -> str:
    """A five-notice session's input: the notice to each recipient, then a summary."""
    return ("Send the approved notice 'Our terms change on 1 March' to "
            + ", ".join(recipients) + ", then summarise.")


async def _retrying(call: Callable[[], Awaitable[T]]) -> T:
    """The runner's own Redis calls ride out a Redis restart (the services do the same)."""
    deadline = time.monotonic() + _RETRY_S
    while True:
        try:
            return await call()
        except _DOWN:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class ChaosRun:
    """One run: the stack, the submissions, the faults (:class:`ChaosFaults`) and the
    collected facts."""

    def __init__(self, cfg: ChaosConfig, stack: DevStack, client: Client,
                 on_progress: Callable[[ChaosRun], None]) -> None:
        self.cfg = cfg
        self.stack = stack
        self.client = client
        self.rng = random.Random(cfg.seed)
        self.report = ChaosReport(cfg)
        self.on_progress = on_progress
        self.facts: list[SessionFacts] = []
        self.continued: set[int] = set()  # sessions continued after their archival
        self.settled = 0
        self.submitted = 0
        self.done = asyncio.Event()
        self.faults = ChaosFaults(cfg, stack, self.rng, self.report, self.done,
                                  lambda: self.submitted, lambda: on_progress(self))

    def plan(self) -> None:
        unsafe = set(self.rng.sample(range(self.cfg.sessions),
                                     round(self.cfg.sessions * self.cfg.unsafe_share)))
        tag = f"{self.cfg.seed}-{self.rng.randrange(16**6):06x}"
        if self.cfg.archive_s > 0:
            self.continued = set(self.rng.sample(
                range(self.cfg.sessions), round(self.cfg.sessions * self.cfg.restore_share)))
        for i in range(self.cfg.sessions):
            self.facts.append(SessionFacts(
                index=i, session_id=f"s-chaos-{tag}-{i}",
                agent=UNSAFE_AGENT if i in unsafe else "notices", unsafe=i in unsafe,
                recipients=tuple(f"c{i}-{k}@chaos-{tag}.example" for k in range(RECIPIENTS))))

    # ------------------------------------------------------------------ sessions

    async def _session(self, f: SessionFacts) -> None:
        await self._round(f, f.recipients, f"chaos-{f.index}")
        self.submitted += 1
        if f.index in self.continued:
            # Archival runs: wait for the session to leave Redis (a tombstone, while the
            # faults go on), then continue it: the second submission restores it first.
            await self._archived(f)
            more = tuple(f"c{f.index}-again-{k}@{f.recipients[0].split('@')[1]}"
                         for k in range(RECIPIENTS))
            f.recipients = (*f.recipients, *more)
            await self._round(f, more, f"chaos-{f.index}-again")
        self.settled += 1
        self.on_progress(self)

    async def _round(self, f: SessionFacts, recipients: tuple[str, ...], request: str) -> None:
        """One submission of the session, waited for until settled."""
        text = _notice_text(recipients)
        # Fixed session and request ids: a submit retried across a Redis restart is the same.
        sub, _ = await _retrying(lambda: self.client.submit(
            text, agent=f.agent, session_id=f.session_id, request_id=request))
        f.submission = sub
        while not (f.submission and f.submission.settled):
            with contextlib.suppress(*_DOWN, TimeoutError):
                f.submission = await self.client.wait(sub, timeout=5.0)
            if not f.submission.settled:
                await asyncio.sleep(0.1)  # a connection lost mid-wait: wait again

    async def _archived(self, f: SessionFacts) -> None:
        """Wait until the session is archived (its tombstone), within the run's deadline."""
        store = self.client.store
        # polled: the archival happens in another process, which tells no one
        while not await _retrying(lambda: retention.tombstone(store, f.session_id)):  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # retention passes, then a Brain archives it
        f.archived = True

    async def submit_all(self) -> None:
        gap = 1.0 / self.cfg.rate if self.cfg.rate > 0 else 0.0
        async with asyncio.TaskGroup() as tg:
            for f in self.facts:
                tg.create_task(self._session(f))
                await asyncio.sleep(gap)
        self.done.set()

    # ------------------------------------------------------------------ after the run

    async def drain(self) -> None:
        """Let resumed workers make their late writes and the relays empty the outbox."""
        outbox = Outbox(self.client.store.redis, self.client.store.keys)
        deadline = time.monotonic() + _DRAIN_S
        await asyncio.sleep(PAUSE_S if self.report.pauses else 0.5)
        while time.monotonic() < deadline:
            backlog = await _retrying(outbox.backlog)
            if not any(b.rows for b in backlog):
                return
            await asyncio.sleep(0.2)

    async def collect(self, mail_url: str) -> None:
        for f in self.facts:
            if f.submission is None:
                continue
            await self._read_facts(f)
        # The restores above wrote wake rows of their own: the relays publish them before
        # the outbox is checked.
        await self.drain()
        async with httpx.AsyncClient(timeout=10.0) as http:
            self.report.mail = (await http.get(f"{mail_url}/stats")).json()
        out = self.report.findings
        deliveries = self.report.mail.get("deliveries", {})
        for f in self.facts:
            check_session(f, deliveries, out)
        check_mail(self.report.mail, self.facts, self.faults.paused, out)
        self.report.sessions = len(self.facts)
        self.report.settled = out.counts["settled"]
        await self._leftovers(out)
        self._crashes(out)
        await self._recovered(out)

    async def _read_facts(self, f: SessionFacts) -> None:
        """What the store holds of the session, read while it is in Redis.

        Archival runs: a session is archived a second after it settles, so it may be archived
        by now, or between two of these reads (the reads would then find its keys gone).
        It is brought back first, as a client's next submission would bring it back (its
        trace joins the archived history); a restore clears its retention, so only a
        retention timer armed before the restore can archive it again. The reads are taken
        again until no tombstone stands after them: nothing but this runner restores
        sessions now, so no tombstone after the reads means none came between them.
        """
        store, sid = self.client.store, f.session_id
        sub_id = f.submission.id if f.submission is not None else ""
        while True:
            await _retrying(lambda: self.client._restored(sid))
            f.submission = await _retrying(lambda: store.inbox.submission(sid, sub_id))
            try:
                state = await _retrying(lambda: store.load(sid))
            except ArchivedError:
                continue  # archived since: brought back, and read again
            f.live_tasks = [f"{t.id}:{t.state.name}" for t in state.tasks.values()
                            if not t.terminal]
            f.live_runs = [f"{r.run_id}:{r.status}" for r in state.runs.values()]
            f.runs = list((await _retrying(lambda: store.runs.applied(sid))).values())
            f.receipts = await _retrying(lambda: store.receipts(sid))
            f.restored = sum(r.kind == "restored" for r in f.receipts)
            if not await _retrying(lambda: retention.tombstone(store, sid)):
                return

    async def _describe_rows(self) -> list[str]:
        """Up to five rows per stream still in the outbox, and who holds them unacknowledged
        (the relay consumer, how long idle, how often delivered): what to look at next."""
        store = self.client.store
        redis: Any = store.redis  # decoded replies (str)
        keys, now = store.keys, now_ms()
        lines = []
        for shard in range(keys.shards):
            for key in (keys.outbox(shard), keys.wakes(shard)):
                for row_id, fields in await redis.xrange(key, "-", "+", count=5):
                    what = {k: str(v)[:80] for k, v in fields.items() if k != "payload"}
                    lines.append(f"  {key} {row_id} ({now - int(row_id.split('-')[0])} ms "
                                 f"old): {what}")
                try:
                    pending = await redis.xpending_range(key, RELAY_GROUP, "-", "+", 5)
                except RedisError:  # no group yet
                    pending = []
                for p in pending:
                    lines.append(f"  {key} {p['message_id']} read by {p['consumer']}, idle "
                                 f"{p['time_since_delivered']} ms, delivered "
                                 f"{p['times_delivered']}x")
        return lines

    async def _leftovers(self, out: Findings) -> None:
        store = self.client.store
        backlog = await _retrying(Outbox(store.redis, store.keys).backlog)
        rows = sum(b.rows for b in backlog)
        if rows:
            out.add(f"{rows} outbox rows left unpublished after the run")
            for line in await _retrying(self._describe_rows):
                out.add(line)
        dead = await _retrying(lambda: dead_letters(store.redis, store.keys, 20))
        for d in dead:
            if self.cfg.archive_s > 0 and " is archived " in str(d.get("reason")):
                # a late message for a session that left Redis: refused and recorded, by
                # design (a wake or a tool message redelivered after a kill)
                out.counts["late_for_archived"] += 1
                continue
            out.add(f"dead letter from {d.get('source')}: {d.get('reason')}")
        timers = 0
        for s in range(store.keys.shards):
            armed = await _retrying(lambda: store.redis.zrange(store.keys.timers(s), 0, -1))  # noqa: B023
            # a settled session's retention timer is expected: it archives the session later
            timers += sum(1 for m in armed if not str(m).startswith("retain|"))
        if timers:
            out.add(f"{timers} timers left armed after every session settled")

    async def _recovered(self, out: Findings) -> None:
        """A brain or hands that lived through the last Redis restart must work after it.

        Its connections all failed once then (no automatic retries, on purpose): it has to
        notice, log and go on. A worker proves it by a commit after the restart. One that
        made none may simply have been out-competed for the work left after the restart
        (the others took every message while it reconnected), so it gets more chances:
        rounds of probe sessions, after every check of the run's own sessions, until each
        such worker committed or the rounds run out. Relays show it through the empty
        outbox.
        """
        if "redis" not in self.faults.restarted_at:
            return
        mono, wall, submitted_before = self.faults.restarted_at["redis"]
        if self.cfg.sessions - submitted_before < 20:
            return  # too little work after the restart to expect every worker to get some
        survivors = {p.name: p for p in self.stack.procs()
                     if p.role in ("brain", "hands") and p.alive and p.started_at < mono}
        idle = set(survivors) - {r.worker.name for f in self.facts for r in f.receipts
                                 if r.worker is not None and r.ts_ms > wall}
        probes = 0
        for round_ in range(_PROBE_ROUNDS):
            if not idle:
                return
            batch = [f"s-chaos-probe-{self.cfg.seed}-{round_}-{k}"
                     for k in range(_PROBE_SESSIONS)]
            async with asyncio.TaskGroup() as tg:
                done = [tg.create_task(self._probe(sid, f"{round_}-{k}"))
                        for k, sid in enumerate(batch)]
            probes += len(batch)
            self.report.probes = probes
            for task in done:
                idle -= {r.worker.name for r in task.result() if r.worker is not None}
        for name in sorted(idle):
            p = survivors[name]
            out.add(f"{p.name} (pid {p.pid}) committed nothing after the last Redis "
                    f"restart, nor in {probes} probe sessions after the run: it did not "
                    f"recover")

    async def _probe(self, session_id: str, tag: str) -> list[Any]:
        """One five-notice session after the run (its own recipients); its receipts."""
        text = _notice_text(f"p{tag}-{k}@probe.example" for k in range(RECIPIENTS))
        sub, _ = await _retrying(lambda: self.client.submit(
            text, agent="notices", session_id=session_id, request_id=f"probe-{tag}"))
        with contextlib.suppress(TimeoutError):  # unsettled: its receipts still tell
            await _retrying(lambda: self.client.wait(sub, timeout=_PROBE_WAIT_S))
        return await _retrying(lambda: self.client.store.receipts(session_id))

    def _crashes(self, out: Findings) -> None:
        """Exits that nobody caused: a service that died on its own (e.g. on a restart)."""
        for p in self.stack.procs():
            exits = p.restarts + (0 if p.alive else 1)
            # A worker that starts while Redis or NATS is down exits at once ("cannot reach
            # ..."), and the supervisor starts it again after its backoff: counted apart.
            refused_start = _start_failures(p)
            if refused_start:
                self.report.start_failures[p.name] = refused_start
            extra = exits - self.faults.kills_by_name[p.name] - refused_start
            if extra > 0:
                self.report.crashes[p.name] = extra
                self.report.crash_logs[p.name] = _last_errors(p)
                out.add(f"{p.name} exited {extra}x on its own (see its log {p.log_path})")


async def run_chaos(cfg: ChaosConfig, base_dir: Path,
                    on_progress: Callable[[ChaosRun], None] | None = None) -> ChaosReport:
    """Run one chaos round on a fresh durable stack under ``base_dir``; stopped after."""
    started = time.monotonic()
    env = dict(CHAOS_ENV)
    if cfg.archive_s > 0:
        env["BATON_SESSION_RETENTION_S"] = f"{cfg.archive_s:g}"
    stack = DevStack(base_dir, brains=cfg.brains, hands=cfg.hands, relays=cfg.relays,
                     durable=True, app_spec=APP, namespace="chaos", env=env,
                     mail_delay_ms=cfg.mail_delay_ms, cluster=cfg.cluster,
                     netns=cfg.partitions > 0)
    report = ChaosReport(cfg)
    try:
        async with stack, cpu_hogs(cfg.cpu_hogs):
            # Every session waits at once: more than the default pool of 100 holds (per
            # node on a cluster).
            client = await Client.connect(stack.settings(
                worker_name="chaos-client", redis_max_connections=max(256, 2 * cfg.sessions)))
            run = ChaosRun(cfg, stack, client, on_progress or (lambda _r: None))
            report = run.report
            try:
                run.plan()
                try:
                    async with asyncio.timeout(cfg.deadline):
                        async with asyncio.TaskGroup() as tg:
                            tg.create_task(run.faults.run())
                            tg.create_task(run.submit_all())
                except TimeoutError:
                    run.done.set()
                    report.error = (f"deadline of {cfg.deadline:g}s passed with "
                                    f"{cfg.sessions - run.settled} sessions unsettled")
                    for p in stack.procs():
                        if p.paused:
                            stack.resume(p.name)
                await run.drain()
                await run.collect(stack.mail_url)
            finally:
                await client.close()
    except Exception as exc:
        report.error = report.error or _describe(exc)
    report.seconds = time.monotonic() - started
    return report


@asynccontextmanager
async def cpu_hogs(count: int) -> AsyncIterator[None]:
    """``count`` busy processes for the duration: workers paused or starved of CPU by their
    neighbours are the case where timeouts fire late and connects time out unsent."""
    hogs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", "while True: pass",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL)
        for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                hog.kill()
            await hog.wait()


def _start_failures(p: Proc) -> int:
    try:
        text = p.log_path.read_text(errors="replace")
    except OSError:
        return 0
    return sum(line.startswith("Error: cannot reach") for line in text.splitlines())


def _last_errors(p: Proc, lines: int = 6) -> str:
    """The last lines of a log that are not routine JSON events: tracebacks, errors."""
    try:
        text = p.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    odd = [line for line in text if not line.startswith("{") or '"level":"error"' in line]
    return "\n".join(odd[-lines:]) or "(nothing but routine events)"


def _describe(exc: BaseException) -> str:
    """The innermost errors of a task group, with where they were raised."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"
