"""SSE watcher benchmark: one ``baton api`` process holding 1,000 event streams while
sessions commit, and the commit latency those watchers add.

Sessions commit (a Brain's commit appending one entry, from concurrent writers) first with no
API running, then with one API process (``baton api --dev``, a separate OS process) serving
1,000 ``GET /v1/sessions/ID/events`` streams spread over those sessions, each of which has
read its snapshot before the commits start. Reported: commit p50 / p99 without and with the
watchers and the p50 they add, how many watchers stayed connected and whether each saw every
commit of its session, the delivery lag (the receipt's Redis time -> the event read by a
watcher), and the API process's CPU time and memory.

Two delivery lags, because they answer different questions. The writers commit flat out (a
burst: thousands of commits a second, each fanned out to every watcher of its session), so
the lag of that burst is mostly the queue of the API's own backlog: it is reported with the
events per second delivered while it drained. Then the same writers commit at a paced
:data:`PACED_RATE` commits a second, which the API keeps up with: the lag measured there is
the latency a watcher sees. The benchmark's own CPU time is reported beside the API's: its
watchers are cheap to read (whole chunks, no per-line loop), so the lag is the API's, not
the client's. Figures, not assertions:
``bench/results/sse.json`` (and the API's log beside it, ``sse-api.log``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from rich.console import Console
from rich.table import Table

from baton.api.server import GC_THRESHOLD
from baton.bench.common import RESULTS_DIR, Result, Row, environment, percentile
from baton.bench.fanout_bench import BRAIN, _open
from baton.devkit.servers import RedisServer, free_port
from baton.models import Entry
from baton.settings import Settings
from baton.store.store import Store
from baton.store.writes import Writes

NAME = "sse"
DESCRIPTION = "1,000 SSE watchers on one API process while sessions commit: the p50 they add"

WRITERS = 8
PACED_RATE = 200  # commits a second over all sessions in the paced phase
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stats(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of ``pid`` from /proc (zeros where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        rss = int(fields[21]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0
    return cpu, rss


async def _commits(store: Store, sessions: list[tuple[str, int]], per_writer: int,
                   counts: Counter[str] | None = None, rate: float = 0.0) -> list[float]:
    """``WRITERS`` concurrent writers, each committing round-robin on its own sessions, flat
    out or (``rate``) at that many commits a second in all, on a fixed schedule; latencies
    in microseconds (and commits per session added to ``counts``)."""
    samples: list[float] = []
    counts = Counter() if counts is None else counts
    start = time.monotonic()

    async def writer(w: int) -> None:
        mine = sessions[w::WRITERS]
        for i in range(per_writer):
            if rate:  # writer w's i-th commit is due at (i * WRITERS + w) / rate
                await asyncio.sleep(max(0.0, start + (i * WRITERS + w) / rate
                                        - time.monotonic()))
            sid, fence = mine[i % len(mine)]
            writes = Writes(kind="commit", entries=[Entry(kind="system", text=f"tick {w}.{i}")])
            t0 = time.perf_counter_ns()
            await store.commit(sid, fence, writes, BRAIN)
            samples.append((time.perf_counter_ns() - t0) / 1000)
            counts[sid] += 1

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    return samples


class Watcher:
    """One SSE stream: counts the receipts it read and their delivery lag."""

    def __init__(self, http: aiohttp.ClientSession, url: str, session_id: str) -> None:
        self.http = http
        self.url = url
        self.session_id = session_id
        self.ready = asyncio.Event()
        self.receipts = 0
        self.lags_ms: list[float] = []
        self.error = ""

    async def run(self) -> None:
        try:
            async with self.http.get(self.url) as response:
                buf = b""
                # Whole chunks, split into messages: the client must cost little next to
                # the API it measures (a line-by-line loop over 1,000 streams does not).
                async for chunk in response.content.iter_any():
                    buf += chunk
                    *messages, buf = buf.split(b"\n\n")
                    now = time.time() * 1000
                    for message in messages:
                        kind, _, data = message.partition(b"event: ")[2].partition(b"\n")
                        if kind == b"receipt":
                            self.receipts += 1
                            self.lags_ms.append(now - orjson.loads(data[6:])["ts_ms"])
                        elif kind == b"snapshot":
                            self.ready.set()
                        elif kind == b"error":
                            self.error = "error event: " + data[6:200].decode()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = repr(exc)[:200]
        finally:
            self.ready.set()


async def _until(check: Any, timeout: float) -> bool:  # noqa: ASYNC109
    """Poll ``check()`` until true or ``timeout`` (a benchmark's patience, not a test)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def measure(redis_url: str, watchers: int, sessions_n: int, per_writer: int,
                  paced_s: float, log_path: Path) -> dict[str, Any]:
    settings = Settings(redis_url=redis_url, namespace="sse")
    store = await Store.connect(settings)
    api: asyncio.subprocess.Process | None = None
    tasks: list[asyncio.Task[None]] = []
    http: aiohttp.ClientSession | None = None
    threshold = gc.get_threshold()
    try:
        sessions = []
        for i in range(sessions_n):
            sub, fence = await _open(store, f"watched-{i}")
            sessions.append((sub.session_id, fence))
        await _commits(store, sessions, max(per_writer // 10, 5))  # warm-up
        baseline = await _commits(store, sessions, per_writer)

        port = free_port()
        env = {**os.environ, "BATON_REDIS_URL": redis_url, "BATON_NAMESPACE": "sse",
               "BATON_LOG_LEVEL": "warning"}
        with log_path.open("wb") as out:
            api = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "baton", "api", "--dev", "--port", str(port),
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None))

        async def healthy() -> bool:
            assert http is not None
            try:
                async with http.get(f"{base}/healthz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        deadline = time.monotonic() + 30
        while not await healthy():
            if api.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start; see {log_path}")
            await asyncio.sleep(0.1)
        cpu0, _ = _proc_stats(api.pid)
        opened = time.perf_counter()
        streams = [Watcher(http, f"{base}/v1/sessions/{sessions[i % sessions_n][0]}/events",
                           sessions[i % sessions_n][0]) for i in range(watchers)]
        tasks = [asyncio.create_task(w.run()) for w in streams]
        await asyncio.gather(*(w.ready.wait() for w in streams))
        open_s = time.perf_counter() - opened
        # This process holds a thousand client streams: its own full collections would show
        # as delivery lag. Collected as rarely as the API's (``tune_gc``) while measuring.
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLD)
        connected = sum(1 for w in streams if not w.error)
        cpu1, rss_idle = _proc_stats(api.pid)

        counts: Counter[str] = Counter()
        bench_cpu = time.process_time()
        burst_t0 = time.perf_counter()
        watched = await _commits(store, sessions, per_writer, counts)
        burst_commit_s = time.perf_counter() - burst_t0
        # Every watcher should read every commit of its session (one receipt each).
        complete = await _until(lambda: all(w.receipts >= counts[w.session_id]
                                            for w in streams), 120)
        burst_s = time.perf_counter() - burst_t0
        bench_cpu = time.process_time() - bench_cpu
        cpu2, rss = _proc_stats(api.pid)
        burst_lags = [lag for w in streams for lag in w.lags_ms]
        burst_events = len(burst_lags)

        # Paced: the lag a watcher sees when the API keeps up.
        marks = [len(w.lags_ms) for w in streams]
        paced_per_writer = max(1, round(PACED_RATE * paced_s / WRITERS))
        await _commits(store, sessions, paced_per_writer, counts, rate=PACED_RATE)
        complete = await _until(lambda: all(w.receipts >= counts[w.session_id]
                                            for w in streams), 120) and complete
        cpu3, _ = _proc_stats(api.pid)
        paced_lags = [lag for w, mark in zip(streams, marks, strict=True)
                      for lag in w.lags_ms[mark:]]
        ended = sum(1 for t in tasks if t.done())  # a stream the API closed (none expected)
        late_errors = sorted({w.error for w in streams if w.error})[:5]
        short = sorted(counts[w.session_id] - w.receipts for w in streams
                       if w.receipts < counts[w.session_id])
        base_p50, base_p99 = percentile(baseline, 50), percentile(baseline, 99)
        with_p50, with_p99 = percentile(watched, 50), percentile(watched, 99)
        return {
            "watchers": watchers, "sessions": sessions_n, "writers": WRITERS,
            "commits": len(watched), "connected": connected,
            "errors": late_errors,
            "every_watcher_saw_every_commit": complete, "streams_ended": ended,
            "watchers_short": len(short), "receipts_missing": sum(short),
            "receipts_read": sum(w.receipts for w in streams),
            "open_all_s": round(open_s, 2),
            "commit_p50_us": {"without": round(base_p50, 1), "with": round(with_p50, 1)},
            "commit_p99_us": {"without": round(base_p99, 1), "with": round(with_p99, 1)},
            "added_p50_us": round(with_p50 - base_p50, 1),
            "delivery_lag_ms": {"p50": round(percentile(paced_lags, 50), 1),
                                "p99": round(percentile(paced_lags, 99), 1)},
            "burst": {"commit_s": round(burst_commit_s, 2), "delivered_s": round(burst_s, 2),
                      "delivery_lag_ms": {"p50": round(percentile(burst_lags, 50), 1),
                                          "p99": round(percentile(burst_lags, 99), 1)},
                      "events": burst_events,
                      "events_per_s": round(burst_events / burst_s) if burst_s else 0,
                      "bench_cpu_s": round(bench_cpu, 2)},
            "paced": {"commits_per_s": PACED_RATE, "commits": paced_per_writer * WRITERS,
                      "events": len(paced_lags), "api_cpu_s": round(cpu3 - cpu2, 2)},
            "api_cpu_s": {"opening": round(cpu1 - cpu0, 2),
                          "during_commits": round(cpu2 - cpu1, 2)},
            "api_rss_mib": {"idle_streams": round(rss_idle, 1), "after": round(rss, 1)},
            "baseline_samples": baseline, "watched_samples": watched,
        }
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if http is not None:
            await http.close()
        if api is not None and api.returncode is None:
            api.terminate()
            try:
                await asyncio.wait_for(api.wait(), 20)
            except TimeoutError:
                api.kill()
                await api.wait()
        await store.close()


async def run(quick: bool = False, console: Console | None = None) -> Result:
    from baton.api.server import raise_open_files_limit

    console = console or Console()
    raise_open_files_limit()  # this process holds every watcher's socket
    watchers, sessions_n, per_writer, paced_s = \
        (200, 20, 50, 2.0) if quick else (1_000, 50, 250, 5.0)
    with tempfile.TemporaryDirectory(prefix="baton-sse-") as tmp:
        async with RedisServer(Path(tmp) / "redis") as server:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            f = await measure(server.url, watchers, sessions_n, per_writer, paced_s,
                              RESULTS_DIR / "sse-api.log")
    baseline, watched = f.pop("baseline_samples"), f.pop("watched_samples")
    table = Table(title=f"One API process, {f['connected']}/{f['watchers']} SSE watchers on "
                        f"{f['sessions']} sessions, {f['writers']} writers committing")
    for col in ("", "without watchers", "with watchers", "added"):
        table.add_column(col)
    p50, p99 = f["commit_p50_us"], f["commit_p99_us"]
    table.add_row("commit p50 (µs)", str(p50["without"]), str(p50["with"]), str(f["added_p50_us"]))
    table.add_row("commit p99 (µs)", str(p99["without"]), str(p99["with"]),
                  str(round(p99["with"] - p99["without"], 1)))
    console.print(table)
    console.print(
        f"every watcher saw every commit: {f['every_watcher_saw_every_commit']} "
        f"({f['receipts_read']} receipt events read; {f['watchers_short']} watchers short of "
        f"{f['receipts_missing']}; {f['streams_ended']} streams ended)")
    burst, paced = f["burst"], f["paced"]
    console.print(
        f"delivery lag (receipt's Redis time -> read by a watcher) at {paced['commits_per_s']} "
        f"commits/s: p50 {f['delivery_lag_ms']['p50']} ms, p99 "
        f"{f['delivery_lag_ms']['p99']} ms ({paced['events']} events; API CPU "
        f"{paced['api_cpu_s']} s); flat-out burst of {f['commits']} commits in "
        f"{burst['commit_s']} s: {burst['events']} events delivered in {burst['delivered_s']} s "
        f"({burst['events_per_s']}/s), lag p50 {burst['delivery_lag_ms']['p50']} ms, p99 "
        f"{burst['delivery_lag_ms']['p99']} ms (its backlog; benchmark CPU "
        f"{burst['bench_cpu_s']} s)")
    console.print(
        f"opening all streams {f['open_all_s']} s; API CPU {f['api_cpu_s']['opening']} s opening, "
        f"{f['api_cpu_s']['during_commits']} s during the commits; API RSS "
        f"{f['api_rss_mib']['after']} MiB" + (f"; errors: {f['errors']}" if f["errors"] else ""))
    rows = [Row(mode=mode, operation="commit", writers=WRITERS, n=len(samples),
                p50_us=percentile(samples, 50), p99_us=percentile(samples, 99), ops_per_s=0.0,
                note=note)
            for mode, samples, note in (("no watchers", baseline, ""),
                                        (f"{f['connected']} SSE watchers", watched,
                                         f"+{f['added_p50_us']} µs p50"))]
    return Result(NAME, rows, env=environment(), extra={"figures": f})
