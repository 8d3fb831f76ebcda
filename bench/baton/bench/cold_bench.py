"""Cold start and idle cost: import CPU, time to ready, CPU of an idle stack per second.

* **import**: CPU time (user + system, ``resource``) of importing ``baton`` and each worker
  entry point in a fresh interpreter (the interpreter's own start excluded), median of a few.
* **ready**: a DevStack's start (servers, mail service, one Brain, Hands and Relay), and a
  Hands spawned into the running stack until it serves (announced with its PID): wall time,
  and the CPU time the new process spent until then (the part a busy machine cannot inflate).
* **idle**: the CPU every process of that stack (Redis, NATS, the three services) spends per
  second of wall time while nothing is submitted, read from the kernel's per-thread run
  time (``/proc/<pid>/task/*/schedstat``, nanoseconds; clock ticks of ``/proc/<pid>/stat``
  where the kernel keeps no schedstats), so a loaded machine slows the figure's sampling,
  not the CPU it counts, and a 10 ms tick does not round a process's figure. The stack's
  workers ping their (loopback, single) NATS server every 30 s, as a DevStack's do; at the
  2 s a networked deployment keeps, to find a server gone silent, the pings add about
  1.5 ms/s (four workers and the server they wake).
* **idle floor**, measured in the same seconds: a Redis and a NATS server started as a
  DevStack starts them, with no client, and one bare asyncio process per Baton worker that
  wakes once a second and does nothing else (the least a worker that announces it is alive
  can do). What a process costs per second asleep is mostly what each wake costs the
  machine: tens of microseconds on a quiet host, a millisecond and more on a virtual
  machine whose caches the host has handed to others meanwhile, so the same stack measures
  2 ms/s on one machine and 12 on another. The idle figure is printed as a multiple of the
  floor too (a ratio the regression check compares), and every process's wakes per second
  (voluntary context switches: a property of the code, not of the machine).

Targets: import of the package < 0.3 s CPU; a worker ready < 1 s after spawn; an idle stack
<= 5 ms of CPU per second in total.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, cpu_ticks, environment, percentile, process_cpu_s
from baton.devkit.devstack import DevStack
from baton.devkit.servers import EmbeddedStack

NAME = "cold"
DESCRIPTION = "import CPU, stack start, worker ready after spawn, idle CPU per second"

MODULES = ("baton", "baton.client", "baton.hands.worker", "baton.brain.worker",
           "baton.relay.worker")
IMPORT_TARGET_S = 0.3
READY_TARGET_S = 1.0
IDLE_TARGET_MS = 5.0
# A worker module is imported as its entry point (`baton brain|hands|relay`) imports it:
# after loading nats-py, redis-py and structlog without their unused parts (baton.bus.lean).
_PROBE = ("import resource, sys\n"
          "def cpu():\n"
          "    r = resource.getrusage(resource.RUSAGE_SELF)\n"
          "    return r.ru_utime + r.ru_stime\n"
          "t = cpu()\n"
          "if sys.argv[1].endswith('.worker'):\n"
          "    from baton.bus.lean import import_service_libraries\n"
          "    import_service_libraries()\n"
          "__import__(sys.argv[1])\n"
          "print(cpu() - t)\n")


def import_cpu(module: str, repeats: int) -> float:
    """Median CPU seconds of importing ``module`` in a fresh interpreter."""
    samples = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _PROBE, module], check=True,
                             capture_output=True, text=True)
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return percentile(samples, 50)


def stack_pids(stack: DevStack) -> dict[str, int]:
    pids: dict[str, int] = {}
    if stack.servers is not None:
        for name, server in (("redis", stack.servers.redis), ("nats", stack.servers.nats)):
            if server.pid:
                pids[name] = server.pid
    for proc in stack.procs():
        if proc.pid:
            pids[proc.name] = proc.pid
    return pids


def _threads(pid: int) -> list[Path]:
    """``/proc/<pid>/task/<tid>`` of ``pid``'s live threads (none when it is gone)."""
    try:
        return list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def cpu_ns(pid: int) -> int:
    """CPU time ``pid``'s live threads have run, in ns (0 when it is gone)."""
    total = 0
    for task in _threads(pid):
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        except OSError:  # no schedstats in this kernel
            return cpu_ticks(pid) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return total


def wakes(pid: int) -> int:
    """Times ``pid``'s live threads went to sleep and were woken (voluntary context
    switches; 0 when it is gone)."""
    total = 0
    for task in _threads(pid):
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            continue
    return total


async def idle_cpu(pids: dict[str, int], seconds: float
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """CPU ms and wakes per wall second of each process, over ``seconds`` of idling."""
    before = {n: (cpu_ns(p), wakes(p)) for n, p in pids.items()}
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - t0
    after = {n: (cpu_ns(p), wakes(p)) for n, p in pids.items()}
    return ({n: (after[n][0] - before[n][0]) / 1e6 / wall for n in pids},
            {n: (after[n][1] - before[n][1]) / wall for n in pids})


# A process that wakes once a second and does nothing else: what a sleeping worker costs.
_WAKER = ("import asyncio\n"
          "async def main():\n"
          "    while True:\n"
          "        await asyncio.sleep(1.0)\n"
          "asyncio.run(main())\n")


@contextlib.asynccontextmanager
async def idle_floor(workers: int) -> AsyncIterator[dict[str, int]]:
    """The floor's processes (see the module docstring): their PIDs by name."""
    wakers: list[asyncio.subprocess.Process] = []
    try:
        for _ in range(workers):
            wakers.append(await asyncio.create_subprocess_exec(
                sys.executable, "-c", _WAKER, stdin=asyncio.subprocess.DEVNULL))
        async with EmbeddedStack() as servers:
            pids = {f"floor {s.name}": s.pid for s in (servers.redis, servers.nats) if s.pid}
            pids.update({f"floor waker-{i + 1}": w.pid for i, w in enumerate(wakers)})
            yield pids
    finally:
        for w in wakers:
            w.kill()
            await w.wait()


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    repeats, idle_s = (3, 5.0) if quick else (5, 20.0)
    imports = {m: import_cpu(m, repeats) for m in MODULES}
    base = Path(tempfile.mkdtemp(prefix="baton-cold-"))
    try:
        t0 = time.monotonic()
        async with DevStack(base, brains=1, hands=1, relays=1, namespace="bench",
                            mail_persist=False) as stack:
            start_s = time.monotonic() - t0
            t1 = time.monotonic()
            late = await stack.spawn("hands", "hands-late")
            ready_s = time.monotonic() - t1
            # Its own CPU until serving: what the start costs, however busy the machine.
            ready_cpu_s = process_cpu_s(late.pid)
            pids = stack_pids(stack)
            workers = len(pids) - 2  # all but Redis and NATS
            async with idle_floor(workers) as floor:
                await asyncio.sleep(2.0)  # past the start's own work (announce, stream setup)
                spent, woken = await idle_cpu({**pids, **floor}, idle_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    idle = {n: ms for n, ms in spent.items() if n in pids}
    idle_wakes = {n: w for n, w in woken.items() if n in pids}
    floor_cpu = {n: ms for n, ms in spent.items() if n in floor}
    total_idle = sum(idle.values())
    total_floor = sum(floor_cpu.values())

    table = Table(title="Cold start and idle", title_justify="left")
    for col in ("figure", "measured", "target"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for m, cpu in imports.items():
        target = f"< {IMPORT_TARGET_S}s" if m == "baton" else ""
        table.add_row(f"import {m} (CPU)", f"{cpu * 1000:.0f} ms", target)
    table.add_row("DevStack start (1 Brain, 1 Hands, 1 Relay; wall)", f"{start_s:.2f} s", "")
    table.add_row("Hands spawned -> serving (wall)", f"{ready_s:.2f} s", f"< {READY_TARGET_S}s")
    table.add_row("  its CPU until serving", f"{ready_cpu_s:.2f} s", "")
    for name, ms in sorted(idle.items()):
        table.add_row(f"idle CPU {name}", f"{ms:.2f} ms/s ({idle_wakes[name]:.1f} wakes/s)", "")
    table.add_row("idle CPU, whole stack", f"{total_idle:.2f} ms/s", f"<= {IDLE_TARGET_MS}")
    for name, ms in sorted(floor_cpu.items()):
        table.add_row(f"idle {name}", f"{ms:.2f} ms/s ({woken[name]:.1f} wakes/s)", "")
    table.add_row(f"idle floor (servers without clients, {workers} bare wakers; same seconds)",
                  f"{total_floor:.2f} ms/s", "")
    table.add_row("idle stack / floor", f"{total_idle / total_floor:.2f}x", "")
    console.print(table)
    rows = [Row(mode="cold", operation=f"import {m}", writers=1, n=repeats,
                p50_us=cpu * 1e6, p99_us=float("nan"), ops_per_s=float("nan"),
                note="CPU time") for m, cpu in imports.items()]
    rows.append(Row(mode="cold", operation="hands spawn -> ready", writers=1, n=1,
                    p50_us=ready_s * 1e6, p99_us=float("nan"), ops_per_s=float("nan")))
    extra: dict[str, Any] = {
        "import_cpu_s": imports, "stack_start_s": start_s, "worker_ready_s": ready_s,
        "worker_ready_cpu_s": ready_cpu_s,
        "idle_cpu_ms_per_s": idle, "idle_cpu_total_ms_per_s": total_idle,
        "idle_wakes_per_s": idle_wakes, "idle_window_s": idle_s,
        "idle_floor_ms_per_s": floor_cpu, "idle_floor_total_ms_per_s": total_floor,
        "idle_floor_wakes_per_s": {n: w for n, w in woken.items() if n in floor},
        "targets": {"import_s": IMPORT_TARGET_S, "ready_s": READY_TARGET_S,
                    "idle_ms_per_s": IDLE_TARGET_MS},
    }
    return Result(NAME, rows, env=environment(), extra=extra)
