"""``baton chaos``: run one chaos round (:mod:`baton.devkit.chaos.run`) from a shell.

Owns the command: its options, the live progress line, the report it prints, the final JSON
line and the exit status (1 on any violation). The run itself, its faults and the facts it
collects live in :mod:`baton.devkit.chaos.run`; the invariants in :mod:`baton.devkit.chaos.checks`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from baton.devkit.chaos.run import (
    CHAOS_ENV,
    PARTITION_S,
    PAUSE_S,
    ChaosConfig,
    ChaosReport,
    ChaosRun,
    run_chaos,
)
from baton.devkit.netns import unavailable as netns_unavailable
from baton.observability import log as logs

__all__ = ["CHAOS_ENV", "ChaosConfig", "ChaosReport", "chaos_command", "run_chaos"]


def _render(console: Console, report: ChaosReport) -> None:
    s = report.summary()
    cfg = report.config
    console.print(f"[bold]chaos[/bold] seed {cfg.seed}: {s['sessions']} sessions "
                  f"({round(cfg.sessions * cfg.unsafe_share)} through the unsafe tool), "
                  f"{cfg.brains} brains, {cfg.hands} hands, {cfg.relays} relays, "
                  f"{s['seconds']}s")
    console.print(f"  faults: {s['kills']} SIGKILLs ({dict(report.kills)}), {s['pauses']} "
                  f"pauses of {PAUSE_S:g}s, restarts {s['restarts']}"
                  + (f", partitions of {PARTITION_S:g}s {s['partitions']}"
                     if cfg.partitions else "")
                  + (f", {s['slot_moves']} slot moves" if cfg.reshard else ""))
    console.print(f"  settled {s['settled']}/{s['sessions']}; mail: {s['deliveries']} "
                  f"deliveries, {s['duplicates']} duplicated, {s['confirmed']} confirmed after "
                  f"a takeover, {s['interrupted']} unsafe runs interrupted")
    console.print(f"  raw re-sends after a kill {s['raw_resends']}; late sends by paused "
                  f"workers {s['late_sends_by_paused']} (the key kept them from delivering); "
                  f"stale writes refused {s['stale_refused']}; services that died on their "
                  f"own {s['crashes']}; exits at start while a server was down "
                  f"{s['start_failures']} (restarted by the supervisor)")
    if cfg.archive_s:
        console.print(f"  archival after {cfg.archive_s:g}s: {s['archived_and_restored']} "
                      f"sessions archived, then restored by a second submission; "
                      f"{s['late_for_archived']} late messages for archived sessions "
                      f"refused and recorded")
    if s["recovery_probes"]:
        console.print(f"  {s['recovery_probes']} probe sessions after the checks, for workers "
                      f"that took no work after the last Redis restart")
    if report.violations:
        console.print(f"[bold red]{len(report.violations)} VIOLATIONS[/bold red]")
        for v in report.violations[:30]:
            console.print(f"  - {v}", markup=False)
        for name, tail in report.crash_logs.items():
            console.print(f"  {name}, last errors in its log:", markup=False)
            console.print("    " + tail.replace("\n", "\n    "), markup=False)
    else:
        console.print("[bold green]ALL INVARIANTS HOLD[/bold green]")


@click.command("chaos")
@click.option("--sessions", default=50, show_default=True, type=click.IntRange(1, 100_000),
              help="five-notice sessions submitted")
@click.option("--brains", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Brain workers")
@click.option("--hands", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Hands workers")
@click.option("--relays", default=2, show_default=True, type=click.IntRange(1, 64),
              help="outbox relays")
@click.option("--kill-every", default=2.0, show_default=True, type=click.FloatRange(0),
              help="seconds between SIGKILLs of a random brain, hands or relay (0: none)")
@click.option("--pause-every", default=0.0, show_default=True, type=click.FloatRange(0),
              help=f"seconds between SIGSTOPs ({PAUSE_S:g}s, past the lease) of a brain or hands")
@click.option("--restart-redis", default=0, show_default=True, type=click.IntRange(0, 100),
              help="SIGKILL and restart Redis this many times (same port, same data)")
@click.option("--restart-nats", default=0, show_default=True, type=click.IntRange(0, 100),
              help="SIGKILL and restart NATS this many times (same port, same data)")
@click.option("--cluster", is_flag=True,
              help="run on a Redis Cluster (3 primaries, 2 replicas each) and 3 NATS nodes "
                   "(restarts hit one node)")
@click.option("--partitions", default=0, show_default=True, type=click.IntRange(0, 100),
              help=f"cut the network this many times for {PARTITION_S:g}s (needs --cluster "
                   f"and root: every server and service in its own network namespace)")
@click.option("--unsafe-share", default=0.2, show_default=True, type=click.FloatRange(0, 1),
              help="share of sessions sending through the non-idempotent unsafe tool")
@click.option("--reshard", default=0, show_default=True, type=click.IntRange(0, 1000),
              help="move a random shard's Redis Cluster slot to another primary this many "
                   "times, a few keys at a time (needs --cluster)")
@click.option("--seed", default=None, type=int, help="random seed (default: from the clock)")
@click.option("--rate", default=10.0, show_default=True, type=click.FloatRange(0),
              help="sessions submitted per second (0: all at once)")
@click.option("--mail-delay-ms", default=30, show_default=True, type=click.IntRange(0, 10_000),
              help="the mail service holds each answer this long: wider windows mid-send")
@click.option("--cpu-hogs", default=0, show_default=True, type=click.IntRange(0, 256),
              help="busy processes started beside the stack (CPU starvation)")
@click.option("--deadline", default=600.0, show_default=True, type=click.FloatRange(1),
              help="seconds for submitting and settling every session; past it the run fails")
@click.option("--archive", "archive_s", default=0.0, show_default=True,
              type=click.FloatRange(0),
              help="archive sessions this many seconds after they settle, while the faults go "
                   "on, and continue --restore-share of them after their archival (0: off)")
@click.option("--restore-share", default=0.3, show_default=True, type=click.FloatRange(0, 1),
              help="with --archive: the share of sessions submitted to again once archived")
@click.option("--json", "json_only", is_flag=True,
              help="one JSON object: the summary (no report)")
@click.option("--keep", is_flag=True, help="keep the stack's directory (logs, data)")
def chaos_command(sessions: int, brains: int, hands: int, relays: int, kill_every: float,
                  pause_every: float, restart_redis: int, restart_nats: int,
                  unsafe_share: float, seed: int | None, rate: float, mail_delay_ms: int,
                  cpu_hogs: int, deadline: float, json_only: bool, keep: bool,
                  cluster: bool, partitions: int, archive_s: float,
                  restore_share: float, reshard: int) -> None:
    """Five-notice sessions under SIGKILLs, pauses and server restarts; check the invariants.

    Exits 1 on any violation. The last line of output is one JSON object.
    """
    if partitions and not cluster:
        raise click.UsageError("--partitions needs --cluster")
    if reshard and not cluster:
        raise click.UsageError("--reshard needs --cluster")
    if partitions and (why := netns_unavailable()):
        raise click.UsageError(f"--partitions: {why}")
    logs.configure("error")  # the supervisor's restart warnings are the point here
    seed = seed if seed is not None else int(time.time()) % 100_000
    cfg = ChaosConfig(sessions=sessions, brains=brains, hands=hands, relays=relays,
                      kill_every=kill_every, pause_every=pause_every,
                      restart_redis=restart_redis, restart_nats=restart_nats,
                      unsafe_share=unsafe_share, seed=seed, rate=rate,
                      mail_delay_ms=mail_delay_ms, deadline=deadline, cpu_hogs=cpu_hogs,
                      cluster=cluster, partitions=partitions, archive_s=archive_s,
                      restore_share=restore_share, reshard=reshard)
    console = Console(quiet=json_only, highlight=False, stderr=False,
                      width=None if sys.stdout.isatty() else 110)
    base = Path(tempfile.mkdtemp(prefix="baton-chaos-"))
    try:
        report = asyncio.run(_run_with_progress(cfg, base, console, json_only))
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    _render(console, report)
    if keep:
        console.print(f"stack directory kept: {base} (logs in {base / 'logs'})")
    sys.stdout.write(json.dumps(report.summary()) + "\n")
    sys.stdout.flush()
    if report.violations:
        sys.exit(1)


async def _run_with_progress(cfg: ChaosConfig, base: Path, console: Console,
                             quiet: bool) -> ChaosReport:
    def status(run: ChaosRun) -> str:
        r = run.report
        return (f"kills {sum(r.kills.values())} pauses {r.pauses} restarts "
                f"{sum(r.restarts.values())}")

    if quiet or not console.is_terminal:
        last = [0.0]

        def tick(run: ChaosRun) -> None:
            now = time.monotonic()
            if not quiet and now - last[0] >= 5.0:
                last[0] = now
                console.print(f"settled {run.settled}/{cfg.sessions}, submitted "
                              f"{run.submitted}; {status(run)}")

        return await run_chaos(cfg, base, tick)
    columns = (TextColumn("[bold]chaos[/bold]"), BarColumn(), MofNCompleteColumn(),
               TextColumn("settled  {task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("starting the stack", total=cfg.sessions)
        return await run_chaos(cfg, base, lambda run: progress.update(
            bar, completed=run.settled, description=status(run)))
