"""``baton demo``: the five-notice task with a Hands worker killed mid-send.

The script the design is built around, run end to end on a private stack: one Brain, two
Hands, one relay and a mail service that holds each answer for a moment. As soon as the mail
service has *accepted* the fourth mail, the Hands process sending it is SIGKILLed, before it
could save the reply. The other Hands replica takes the run over (JetStream redelivers the
message after the tool consumers' ``ack_wait``; NATS answers "no responders" for the dead
holder, so the attempt is reclaimed at once instead of after ``attempt_ttl``), and because
``send_email`` declares ``replay="confirm"`` it asks the mail service about the operation id
instead of sending again. The demo prints each mail's fate, the takeover, the confirm and the
handoff timeline (:mod:`baton.cli.trace`), writes the timeline's picture to
``$BATON_HOME/demo/trace.html`` and keeps the receipts so ``baton trace SESSION`` works after
the stack is gone, checks the exactly-once invariants, and ends with one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console
from rich.table import Table

from baton.cli.observe import save_receipts
from baton.cli.trace import build_trace, render_text
from baton.cli.trace.html import render_html
from baton.client import Client
from baton.devkit.devstack import DevStack
from baton.devkit.stack import home
from baton.models import ToolRun, WorkerRef
from baton.observability import log as logs
from baton.receipts import ClaimDetail, Receipt
from baton.store.store import Store

__all__ = ["FIVE_NOTICES", "demo_command", "run_demo"]

FIVE_NOTICES = (
    "Send the approved notice 'Our terms change on 1 March' to ada@example.com, "
    "grace@example.com, linus@example.com, margaret@example.com and barbara@example.com, "
    "then summarise."
)
RECIPIENTS = 5
MAIL_DELAY_MS = 300  # the window in which mail 4 is accepted but its reply not yet seen
# Short but sane timings: the takeover happens within a few seconds. One send at a time per
# Hands keeps the order readable.
DEMO_ENV = {
    "BATON_ACK_WAIT_S": "2",
    "BATON_ATTEMPT_TTL_MS": "1500",
    "BATON_HANDS_CONCURRENCY": "1",
}
_DEADLINE_S = 90.0


@dataclass
class Kill:
    worker: str = ""
    run_id: str = ""
    recipient: str = ""
    at_s: float = 0.0
    run_status: str = ""


@dataclass
class Outcome:
    session: str = ""
    status: str = "not_started"
    answer: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    runs: list[ToolRun] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    kill: Kill = field(default_factory=Kill)
    seconds: float = 0.0
    startup_s: float = 0.0
    error: str = ""

    @property
    def takeovers(self) -> list[tuple[WorkerRef, ClaimDetail]]:
        """Reclaims by another worker than the one that left the run: (taker, the reclaim)."""
        return [(r.worker, r.detail) for r in self.receipts
                if isinstance(r.detail, ClaimDetail) and r.detail.kind == "reclaim"
                and r.worker is not None
                and r.detail.previous_worker not in ("", r.worker.name)]

    def summary(self) -> dict[str, Any]:
        deliveries: dict[str, int] = self.stats.get("deliveries", {})
        recovery = {r.intent.arguments.get("to", "?"): (r.result.recovery if r.result else None)
                    for r in self.runs}
        out = {
            "delivered": sum(deliveries.values()),
            "recipients": len(deliveries),
            "duplicates": self.stats.get("duplicates_suppressed"),
            "raw_sends": self.stats.get("raw_requests"),
            "takeovers": len(self.takeovers),
            "confirmed": sum(1 for v in recovery.values() if v == "confirmed"),
            "status": self.status,
            "session": self.session,
            "killed": self.kill.worker,
            "seconds": round(self.seconds, 2),
        }
        problems = self.problems(deliveries)
        out["ok"] = not problems
        if problems:
            out["problems"] = problems
        return out

    def problems(self, deliveries: dict[str, int]) -> list[str]:
        if self.error:
            return [self.error]
        found = []
        if len(deliveries) != RECIPIENTS or any(n != 1 for n in deliveries.values()):
            found.append(f"deliveries per recipient: {deliveries}")
        if self.stats.get("duplicates_suppressed") != 0:
            found.append("the mail service suppressed duplicate sends")
        if self.stats.get("raw_requests") != RECIPIENTS:
            found.append(f"{self.stats.get('raw_requests')} raw sends, expected {RECIPIENTS}")
        if not self.takeovers:
            found.append("no Hands takeover was recorded")
        if self.status != "completed":
            found.append(f"submission {self.status}")
        return found


async def run_demo(base_dir: Path, say: Console | None = None) -> Outcome:
    """Run the scripted demo on a fresh stack under ``base_dir``; everything is stopped after."""
    out = Outcome()
    started = time.monotonic()

    def note(text: str) -> None:
        if say is not None:
            say.print(f"[dim]{time.monotonic() - started:6.2f}s[/dim]  {text}")

    try:
        async with asyncio.timeout(_DEADLINE_S):
            await _run(base_dir, out, note, started)
    except Exception as exc:  # reported in the JSON line, the exit code says it failed
        out.error = f"{type(exc).__name__}: {exc}"
    out.seconds = time.monotonic() - started
    return out


async def _run(base_dir: Path, out: Outcome, note: Any, started: float) -> None:
    note("starting Redis, NATS, the mail service (300 ms send delay), "
         "1 brain, 2 hands, 1 relay ...")
    stack = DevStack(base_dir, brains=1, hands=2, relays=1, mail_delay_ms=MAIL_DELAY_MS,
                     env=DEMO_ENV)
    async with stack:
        out.startup_s = time.monotonic() - started
        note(f"stack ready in {out.startup_s:.2f}s")
        client = await Client.connect(stack.settings())
        try:
            async with httpx.AsyncClient(base_url=stack.mail_url, timeout=2.0) as http:
                sub, _ = await client.submit(FIVE_NOTICES, agent="notices")
                out.session = sub.session_id
                note(f"submitted the five-notice task (session [bold]{sub.session_id}[/bold])")
                out.kill = await _kill_after_fourth(stack, client.store, http, sub.session_id)
                out.kill.at_s = time.monotonic() - started
                # Two short lines, so that a narrow terminal never leaves the last words of
                # one alone on the next.
                note(f"mail 4 ({out.kill.recipient}) accepted by the mail service, "
                     f"its run still {out.kill.run_status} in Redis")
                note(f"[bold red]SIGKILL {out.kill.worker}[/bold red] before it saw the reply")
                final = await client.wait(sub, timeout=_DEADLINE_S)
                out.status, out.answer = final.status, final.answer or final.error or ""
                note(f"submission {final.status}")
                out.stats = (await http.get("/stats")).json()
            out.runs = await _runs(client.store, sub.session_id)
            out.receipts = await client.store.receipts(sub.session_id)
        finally:
            await client.close()


async def _kill_after_fourth(stack: DevStack, store: Store, http: httpx.AsyncClient,
                             session: str) -> Kill:
    """Poll the mail service; once it accepted mail 4, SIGKILL the Hands sending it."""
    while True:  # a poll of another process, bounded by the demo's deadline
        if (await http.get("/stats")).json()["accepted"] >= 4:
            break
        await asyncio.sleep(0.003)
    accepted: list[tuple[str, ToolRun]] = []
    for run in await _runs(store, session):
        reply = await http.get(f"/operations/{run.intent.operation_id}")
        if reply.status_code == 200:
            accepted.append((reply.json()["delivered_at"], run))
    accepted.sort(key=lambda pair: pair[0])
    fourth = accepted[3][1]
    if not fourth.worker:
        raise RuntimeError(f"run {fourth.run_id} has no Hands worker recorded")
    # No respawn: the point is that the *other* live replica takes over.
    stack.kill(fourth.worker, respawn=False)
    return Kill(worker=fourth.worker, run_id=fourth.run_id,
                recipient=str(fourth.intent.arguments.get("to")), run_status=fourth.status)


async def _runs(store: Store, session: str) -> list[ToolRun]:
    """Live and applied runs, in the order the model called them."""
    runs = {**await store.runs.applied(session), **(await store.load(session)).runs}
    return sorted(runs.values(), key=lambda r: (r.intent.created_ms, r.intent.tool_call_id or ""))


# ---------------------------------------------------------------------- presentation


def _render(console: Console, out: Outcome) -> None:
    names = {r.run_id: str(r.intent.arguments.get("to", "?")) for r in out.runs}
    mails = Table(title="Each mail's fate", title_justify="left")
    for col in ("#", "recipient", "finished by", "attempts", "recovery", "outcome"):
        mails.add_column(col)
    for i, run in enumerate(out.runs, 1):
        result = run.result
        recovery = result.recovery if result else "-"
        style = "bold green" if recovery == "confirmed" else ""
        mails.add_row(str(i), names[run.run_id], run.worker or "-", str(run.attempt),
                      f"[{style}]{recovery}[/{style}]" if style else recovery,
                      result.outcome if result else run.status)
    console.print(mails)

    for taker, d in out.takeovers:
        via = f", published by {d.carrier.relay}" if d.carrier and d.carrier.relay else ""
        console.print(
            f"[bold]takeover[/bold]: {names.get(d.run_id, '?')}: attempt "
            f"{d.previous_attempt} by {d.previous_worker} (killed) -> attempt "
            f"{d.attempt} by [bold]{taker.name}[/bold], "
            f"delivery {d.delivery} of the JetStream message{via}")
    for run in out.runs:
        if run.result and run.result.recovery == "confirmed":
            found = run.result.output or {}
            console.print(
                f"[bold]confirm[/bold]: asked the mail service about operation "
                f"{run.intent.operation_id}: found {found.get('message_id')} to "
                f"{found.get('to')}; result adopted, [bold]no second send[/bold]")

    console.print("[bold]Handoff timeline[/bold] (from the session's receipts alone; "
                  "`baton trace` prints the same):")
    console.out(render_text(build_trace(out.session, out.receipts)), end="")
    stats = out.stats
    console.print(f"mail service: {stats.get('raw_requests')} raw sends, "
                  f"{stats.get('accepted')} accepted, {stats.get('duplicates_suppressed')} "
                  f"duplicates suppressed, deliveries {stats.get('deliveries')}")
    console.print(f"[bold]final answer[/bold]: {out.answer}")


def _save_trace(out: Outcome) -> tuple[Path, Path]:
    """Keep the receipts and the picture in $BATON_HOME: the demo's stack does not outlive it."""
    saved = save_receipts(out.session, out.receipts)
    picture = home() / "demo" / "trace.html"
    picture.parent.mkdir(parents=True, exist_ok=True)
    picture.write_text(render_html(build_trace(out.session, out.receipts)))
    return saved, picture


@click.command("demo")
@click.option("--keep", is_flag=True, help="keep the stack's directory (logs, data) afterwards")
@click.option("--json", "json_only", is_flag=True,
              help="one JSON object: the summary (no report)")
def demo_command(keep: bool, json_only: bool) -> None:
    """Five notices, a Hands worker SIGKILLed after mail 4 was accepted, exactly-once result."""
    logs.configure("warning")
    # Piped output (make demo in CI, the tests) gets a fixed width instead of 80 columns.
    console = Console(quiet=json_only, highlight=False,
                      width=None if sys.stdout.isatty() else 110)
    base = Path(tempfile.mkdtemp(prefix="baton-demo-"))
    try:
        out = asyncio.run(run_demo(base, console))
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    if not out.error:
        _render(console, out)
    summary = out.summary()
    if out.receipts:
        saved, picture = _save_trace(out)
        console.print(f"trace picture: [bold]{picture}[/bold] (open it in a browser); "
                      f"receipts saved to {saved}: `baton trace {out.session}` shows them "
                      "again after this stack is gone")
    if out.session:
        logs_at = base / "logs"
        console.print(f"look further: session {out.session}; " + (
            f"service logs: grep {out.session} {logs_at}/*.log" if keep
            else "run `baton demo --keep` to keep the service logs"))
    verdict = "[bold green]ALL INVARIANTS HOLD[/bold green]" if summary["ok"] else \
        f"[bold red]INVARIANTS BROKEN[/bold red]: {summary.get('problems')}"
    console.print(f"{verdict}  ({out.seconds:.1f}s, stack start {out.startup_s:.1f}s)")
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()
    if not summary["ok"]:
        sys.exit(1)
