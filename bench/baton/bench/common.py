"""Helpers shared by the benchmarks: timing loops, percentiles, the rich table and JSON output.

Benchmarks report figures, never assertions. A benchmark produces :class:`Row` objects (one
per measured operation) plus free-form ``extra`` facts, prints them with :func:`print_rows`
and saves them with :func:`write_json` under ``bench/results/`` (gitignored).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import platform
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS_DIR = Path(os.environ.get("BATON_BENCH_RESULTS") or Path.cwd() / "bench" / "results")


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def cpu_ticks(pid: int | None) -> int:
    """utime + stime of a process in clock ticks, from /proc (0 when it is gone or None)."""
    if pid is None:
        return 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process (0 when it is gone or None)."""
    return cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


def io_calls(pid: int | None) -> tuple[int, int]:
    """The read and write system calls a process made so far (``syscr``, ``syscw`` of
    /proc/PID/io: reads, receives and writes, sends on its sockets included); (0, 0) when it
    is gone, None, or its counters are not readable here."""
    if pid is None:
        return 0, 0
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/io").read_text().splitlines())
        return int(fields["syscr"]), int(fields["syscw"])
    except (OSError, KeyError, ValueError):
        return 0, 0


@dataclass
class Row:
    """One measured operation. Latencies in microseconds; ``ratio`` is p50 / the baseline p50."""

    mode: str
    operation: str
    writers: int
    n: int
    p50_us: float
    p99_us: float
    ops_per_s: float
    ratio: float | None = None
    client_cpu_us: float | None = None  # this process's CPU per op
    server_cpu_us: float | None = None  # the server's CPU per op, where the bench can read it
    note: str = ""

    @classmethod
    def from_run(
        cls, mode: str, operation: str, run: Run, *, writers: int = 1, note: str = ""
    ) -> Row:
        us = [s / 1000 for s in run.samples_ns]
        n = len(us)
        return cls(
            mode=mode,
            operation=operation,
            writers=writers,
            n=n,
            p50_us=percentile(us, 50),
            p99_us=percentile(us, 99),
            ops_per_s=n / run.elapsed_s if run.elapsed_s > 0 else math.nan,
            client_cpu_us=run.cpu_s * 1e6 / n if n else None,
            server_cpu_us=run.probed * 1e6 / n if n and run.probed is not None else None,
            note=note,
        )


@dataclass
class Run:
    """What a timed loop measured: per-call latencies, wall time and this process's CPU time."""

    samples_ns: list[int]
    elapsed_s: float
    cpu_s: float
    probed: float | None = None  # change of the probe's counter over the timed part


Probe = Callable[[], Awaitable[float]]


async def _read(probe: Probe | None) -> float:
    return await probe() if probe is not None else 0.0


async def sequential(
    call: Callable[[int], Awaitable[object]], n: int, warmup: int = 0, probe: Probe | None = None
) -> Run:
    """Time ``n`` sequential awaits of ``call(i)``, after ``warmup`` untimed ones.

    ``call`` receives a running index (warm-up calls included) so callers can feed it
    pre-built, distinct inputs. GC is collected before timing and left enabled: it is part of
    what a real process pays. ``probe`` reads an outside counter (e.g. the server's CPU
    seconds) at the start and the end of the timed part.
    """
    for i in range(warmup):
        await call(i)
    gc.collect()
    out = [0] * n
    clock = time.perf_counter_ns
    p0 = await _read(probe)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for j in range(n):
        t0 = clock()
        await call(warmup + j)
        out[j] = clock() - t0
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return Run(out, wall, cpu, await _read(probe) - p0 if probe else None)


async def concurrent(
    calls: Sequence[Callable[[int], Awaitable[object]]],
    n_each: int,
    warmup: int = 0,
    probe: Probe | None = None,
) -> Run:
    """Run one worker per callable, each doing ``n_each`` timed calls after ``warmup``.

    The wall and CPU time cover the timed part only: from the moment every worker finished its
    warm-up to the moment the last one finished.
    """
    ready = asyncio.Barrier(len(calls) + 1)
    samples: list[list[int]] = [[] for _ in calls]
    clock = time.perf_counter_ns

    async def worker(k: int, call: Callable[[int], Awaitable[object]]) -> None:
        for i in range(warmup):
            await call(i)
        await ready.wait()
        mine = samples[k]
        for j in range(n_each):
            t0 = clock()
            await call(warmup + j)
            mine.append(clock() - t0)

    gc.collect()
    async with asyncio.TaskGroup() as tg:
        for k, call in enumerate(calls):
            tg.create_task(worker(k, call))
        await ready.wait()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        p0 = await _read(probe)  # one round trip while the writers start: negligible
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return Run([s for per in samples for s in per], wall, cpu,
               await _read(probe) - p0 if probe else None)


def print_rows(title: str, rows: Iterable[Row], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=title, title_justify="left")
    for name, justify in [("mode", "left"), ("operation", "left"), ("writers", "right"),
                          ("n", "right"),
                          ("p50 µs", "right"), ("p99 µs", "right"), ("ops/s", "right"),
                          # what the ratio is to, each table's title says
                          ("ratio", "right"), ("client CPU µs/op", "right"),
                          ("server CPU µs/op", "right")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    last_mode = None
    for r in rows:
        if last_mode is not None and r.mode != last_mode:
            table.add_section()
        last_mode = r.mode
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        op = f"{r.operation} [dim]({r.note})[/dim]" if r.note else r.operation
        table.add_row(r.mode, op, str(r.writers), f"{r.n:,}", f"{r.p50_us:,.0f}",
                      f"{r.p99_us:,.0f}", _num(r.ops_per_s), ratio, _num(r.client_cpu_us),
                      _num(r.server_cpu_us))
    console.print(table)


def _num(value: float | None) -> str:
    """A figure for a table cell: blank when not measured (None, NaN)."""
    return "" if value is None or math.isnan(value) else f"{value:,.0f}"


def environment() -> dict[str, Any]:
    """Facts that make a result comparable with another run."""
    import os

    import redis
    import redis.utils

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "redis_py": redis.__version__,
        "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
        "event_loop": type(asyncio.get_running_loop()).__module__,
        # Other work on the machine skews every figure: keep the load with the result.
        "loadavg_1m": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@dataclass
class Result:
    """Everything one benchmark run produced, as written to ``bench/results/<name>.json``."""

    name: str
    rows: list[Row]
    env: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def result_json(result: Result) -> dict[str, Any]:
    """A benchmark's result as the JSON object written to ``<name>.json``."""
    return {"name": result.name, "env": result.env, "rows": [asdict(r) for r in result.rows],
            **result.extra}


def write_json(result: Result, directory: Path = RESULTS_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    path.write_text(json.dumps(result_json(result), indent=2, default=str) + "\n")
    return path
