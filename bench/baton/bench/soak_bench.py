"""Soak: many five-notice sessions on durable servers, with a short retention and workers
killed now and then; memory, storage and speed must plateau (``baton bench soak``).

One :class:`~baton.devkit.devstack.DevStack` on durable servers (Redis ``appendfsync
always``, JetStream ``sync_interval: always``): 2 Brains, 2 Hands, 1 relay; sessions settle,
stay ``RETENTION_S`` in Redis, are archived to the stack's archive directory and leave a
tombstone for ``TOMBSTONE_TTL_S``. 32 sessions run at a time. Every ``kill_every`` sessions
one service (brain-1, hands-1 or the relay, in turn) is SIGKILLed and respawned by the
supervisor; the sessions in flight must still complete. brain-2 and hands-2 live through
the whole run: their RSS, and the servers', tell a leak.

The run is cut in ten stages. At the end of each the driver lets the sessions in flight
finish, checks exactly once from the mail service's counters (each of the five recipients
got one mail per session of the stage), clears the mail service's state (its memory is not
Baton's) and reads:

* Redis ``used_memory`` (all primaries of a cluster), the sessions still in Redis (the
  shards' session indexes) and the tombstones (the shards' archived indexes);
* each process's RSS (``/proc``): Brains, Hands, relay, Redis, NATS;
* JetStream's stored bytes and messages (both streams);
* the archive: objects and bytes;
* sessions per second over the stage.

After the warm-up (the first two stages: the tombstones' TTL must have passed once), each
series' slope per 10,000 sessions is fitted (least squares) and compared with its bound:
2% of the series' mean after warm-up per 10,000 sessions, at least 1 MB for bytes and 50 for
counts. A series over its bound grows: a leak to fix (a killed process's RSS is shown, not
judged). Also printed: the Redis bytes of a settled session still in Redis and of a
tombstone (MEMORY USAGE of samples) and the bytes of an archive object, the figures of the
scale-out guide's Sizing (docs/guides/scale-out.md).

Target: 200,000 sessions or an hour, whichever comes first (``--quick``: 2,000); each stage
ends at its tenth of either, so a stack that cannot run 200,000 in the hour (a cluster on a
small machine) still gets its ten stages.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment
from baton.bench.sessions import FIVE, bench_client
from baton.client import Client
from baton.devkit.devstack import DevStack

NAME = "soak"
DESCRIPTION = ("200,000 five-notice sessions (or an hour) with seconds of retention, "
               "workers killed: Redis, RSS, NATS and speed plateau")

RETENTION_S = 2.0
TOMBSTONE_TTL_S = 60.0
CONCURRENCY = 32
STAGES = 10
WARMUP_STAGES = 2
# Killed in turn; brain-2 and hands-2 are never killed: their RSS (and the servers') is what
# tells a leak, a restarted process starting small again.
KILLED = ("brain-1", "hands-1", "relay-1")
BOUND_SHARE = 0.02  # of a series' mean, per 10,000 sessions
# Floors of the bounds: a slope under 1 MB (bytes) or 50 (counts) per 10,000 sessions is
# flat whatever the series' mean (a small mean makes 2% of it noise).
BYTES_FLOOR, COUNT_FLOOR = 1 << 20, 50.0


@dataclass(frozen=True)
class Config:
    sessions: int = 200_000
    max_s: float = 3600.0
    kill_every: int = 5_000
    tombstone_ttl_s: float = TOMBSTONE_TTL_S


# A smoke run: the tombstones' TTL short enough to pass within the warm-up.
QUICK = Config(sessions=2_000, max_s=600.0, kill_every=400, tombstone_ttl_s=5.0)


@dataclass
class Stage:
    sessions: int  # completed so far
    elapsed_s: float
    per_s: float
    redis_used: int
    hot: int  # sessions in Redis
    tombstones: int
    rss: dict[str, int] = field(default_factory=dict)
    nats_bytes: int = 0
    nats_msgs: int = 0
    archived_objects: int = 0
    archived_bytes: int = 0
    killed: list[str] = field(default_factory=list)


def _rss(pid: int | None) -> int:
    if not pid:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def _archive_size(root: Path) -> tuple[int, int]:
    objects = size = 0
    for path in root.rglob("*.json.zst"):
        if "sessions" in path.parts:
            objects += 1
            size += path.stat().st_size
    return objects, size


async def _redis_figures(client: Client) -> tuple[int, int, int]:
    """(used_memory summed over primaries, sessions in Redis, tombstones)."""
    redis: Any = client.store.redis
    keys = client.store.keys
    from baton.store.redis_client import is_cluster

    if is_cluster(redis):
        found = await redis.info("memory", target_nodes=redis.PRIMARIES)
        used = sum(int(v["used_memory"]) for v in found.values() if isinstance(v, dict))
    else:
        used = int((await redis.info("memory"))["used_memory"])
    hot = sum([await redis.zcard(k) for k in keys.every("sessions")])
    tombs = sum([await redis.zcard(keys.archived(s)) for s in range(keys.shards)])
    return used, hot, tombs


async def _nats_figures(stack: DevStack) -> tuple[int, int]:
    import nats

    nc = await nats.connect(stack.nats_url.split(","), max_reconnect_attempts=1,
                            reconnect_time_wait=0.2)
    try:
        js = nc.jetstream()
        total_bytes = total_msgs = 0
        for info in await js.streams_info():
            total_bytes += info.state.bytes
            total_msgs += info.state.messages
        return total_bytes, total_msgs
    finally:
        await nc.close()


_SESSION_KEYS = ("meta", "entries", "tasks", "done", "docs", "subs", "reqs", "runs",
                 "runs_done", "intents", "inbox", "nudge", "receipts", "applied", "runs_applied",
                 "inbox_applied", "poison")
_SAMPLE = 50


async def _key_sizes(client: Client) -> dict[str, float | None]:
    """Redis bytes of a settled session still in Redis and of a tombstone (MEMORY USAGE of
    the keys of up to 50 of each, averaged; the shard indexes' members apart)."""
    redis: Any = client.store.redis
    keys = client.store.keys

    async def usage(key: str) -> int:
        return int(await redis.memory_usage(key, samples=0) or 0)

    hot: list[str] = []
    for k in keys.every("sessions"):  # the newest: the oldest may leave Redis meanwhile
        hot += await redis.zrevrange(k, 0, _SAMPLE - 1)
    tombs: list[str] = []
    for shard in range(keys.shards):
        tombs += await redis.zrange(keys.archived(shard), 0, _SAMPLE - 1)
    hot_sizes = []
    for sid in hot:
        base = keys.session(sid).meta.removesuffix("meta")
        size = sum([await usage(base + k) for k in _SESSION_KEYS])
        if size and await redis.exists(base + "meta"):  # not archived while it was read
            hot_sizes.append(size)
        if len(hot_sizes) == _SAMPLE:
            break
    tomb_sizes = [s for s in [await usage(keys.session(sid).archived) for sid in tombs] if s]
    tomb_sizes = tomb_sizes[:_SAMPLE]
    return {"hot_bytes_per_session": sum(hot_sizes) / len(hot_sizes) if hot_sizes else None,
            "tombstone_bytes": sum(tomb_sizes) / len(tomb_sizes) if tomb_sizes else None}


@dataclass
class _Kills:
    next: int  # the session count at which the next kill comes
    count: int = 0
    stage: list[str] = field(default_factory=list)  # killed during the current stage


class _Driver:
    """Sessions CONCURRENCY at a time until a stage's count is reached."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.done = 0
        self.failed: list[str] = []

    async def _one(self) -> None:
        sub, _ = await self.client.submit(FIVE, agent="notices")
        final = await self.client.wait(sub, timeout=120)
        if final.status != "completed":
            self.failed.append(f"{sub.session_id}: {final.status} {final.error}")
        self.done += 1

    async def until(self, target: int, deadline: float, kill: Any) -> None:
        async def worker() -> None:
            while self.done + running[0] < target and time.monotonic() < deadline:
                running[0] += 1
                try:
                    await self._one()
                except Exception as exc:  # a session the run could not finish: reported
                    self.failed.append(repr(exc)[:300])
                    self.done += 1
                finally:
                    running[0] -= 1
                await kill()

        running = [0]
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def _series(stages: list[Stage]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "redis used_memory": [s.redis_used for s in stages],
        "sessions in Redis": [s.hot for s in stages],
        "tombstones": [s.tombstones for s in stages],
        "JetStream bytes": [s.nats_bytes for s in stages],
        "sessions/s": [s.per_s for s in stages],
    }
    for name in sorted({n for s in stages for n in s.rss}):
        out[f"RSS {name}"] = [s.rss.get(name, 0) for s in stages]
    return out


def _verdicts(stages: list[Stage]) -> list[dict[str, Any]]:
    kept = stages[WARMUP_STAGES:]
    xs = [s.sessions / 10_000 for s in kept]
    out = []
    for name, ys in _series(kept).items():
        mean = sum(ys) / len(ys) if ys else 0.0
        slope = _slope(xs, ys)
        floor = (0.0 if name == "sessions/s" else COUNT_FLOOR
                 if name in ("sessions in Redis", "tombstones") else BYTES_FLOOR)
        bound = max(abs(mean) * BOUND_SHARE, floor)
        # speed may rise; only a fall is a problem
        flat: bool | None = (slope >= -bound) if name == "sessions/s" else (slope <= bound)
        if any(name == f"RSS {k}" for k in KILLED):
            flat = None  # restarted during the run: not judged
        out.append({"series": name, "mean": mean, "slope_per_10k": slope, "bound": bound,
                    "flat": flat})
    return out


async def soak(cfg: Config, console: Console, *, cluster: bool = False) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="baton-soak-"))
    env = {"BATON_SESSION_RETENTION_S": str(RETENTION_S),
           "BATON_TOMBSTONE_TTL_S": str(cfg.tombstone_ttl_s)}
    stages: list[Stage] = []
    checks: list[str] = []  # exactly-once checks a stage failed
    try:
        async with DevStack(base, brains=2, hands=2, relays=1, durable=True, cluster=cluster,
                            namespace="soak", env=env, mail_persist=False) as stack:
            client = await bench_client(stack)
            driver = _Driver(client)
            kills = _Kills(cfg.kill_every)

            async def kill() -> None:
                if driver.done >= kills.next:
                    kills.next += cfg.kill_every
                    name = KILLED[kills.count % len(KILLED)]
                    kills.count += 1
                    stack.kill(name)  # the supervisor starts it again
                    kills.stage.append(name)

            started = time.monotonic()
            deadline = started + cfg.max_s
            archive_dir = base / "archive"
            async with httpx.AsyncClient(base_url=stack.mail_url, timeout=10.0) as http:
                await http.post("/reset")
                for stage in range(1, STAGES + 1):
                    before, t0 = driver.done, time.monotonic()
                    fails_before = len(driver.failed)
                    # a stage ends at its share of the sessions or of the time, whichever
                    # comes first: a slower stack (a cluster) still gets its ten stages
                    await driver.until(cfg.sessions * stage // STAGES,
                                       min(deadline, started + cfg.max_s * stage / STAGES),
                                       kill)
                    ran = driver.done - before
                    per_s = ran / (time.monotonic() - t0) if ran else 0.0
                    stats = (await http.get("/stats")).json()
                    ok = ran - (len(driver.failed) - fails_before)
                    wrong = {k: v for k, v in stats["deliveries"].items() if v != ok}
                    if wrong:  # a recipient mailed more or less than once per session
                        checks.append(f"stage {stage}: deliveries {wrong} for {ok} sessions")
                    await http.post("/reset")
                    used, hot, tombs = await _redis_figures(client)
                    nbytes, nmsgs = await _nats_figures(stack)
                    objects, size = await asyncio.to_thread(_archive_size, archive_dir)
                    rss = {p["name"]: _rss(p.get("pid")) for p in stack.processes
                           if p["role"] in ("brain", "hands", "relay", "redis", "nats")}
                    stages.append(Stage(driver.done, time.monotonic() - started, per_s, used,
                                        hot, tombs, rss, nbytes, nmsgs, objects, size,
                                        list(kills.stage)))
                    kills.stage = []
                    console.print(
                        f"[dim]stage {stage}/{STAGES}: {driver.done} sessions, "
                        f"{per_s:.0f}/s, Redis {used / 1e6:.1f} MB, {hot} in Redis, "
                        f"{tombs} tombstones, NATS {nbytes / 1e6:.1f} MB, "
                        f"archive {objects} objects[/dim]")
                    if time.monotonic() >= deadline:
                        break
            sizes = await _key_sizes(client)
            await client.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    last = stages[-1]
    return {"cluster": cluster, "stages": [vars(s) for s in stages], **sizes,
            "verdicts": _verdicts(stages) if len(stages) > WARMUP_STAGES + 1 else [],
            "failed": [*driver.failed, *checks], "sessions": last.sessions,
            "elapsed_s": last.elapsed_s,
            "archived_bytes_per_session": (last.archived_bytes / last.archived_objects
                                           if last.archived_objects else None)}


def _print(out: dict[str, Any], console: Console) -> None:
    table = Table(title=f"soak ({'cluster' if out['cluster'] else 'single'}): after warm-up, "
                        f"slope per 10,000 sessions against its bound")
    for col in ("series", "mean", "slope / 10k", "bound", "flat"):
        table.add_column(col, justify="left" if col == "series" else "right")
    for v in out["verdicts"]:
        table.add_row(v["series"], f"{v['mean']:,.0f}", f"{v['slope_per_10k']:+,.0f}",
                      f"{v['bound']:,.0f}", "restarted" if v["flat"] is None
                      else "yes" if v["flat"] else "[red]GROWS[/red]")
    console.print(table)
    console.print(f"{out['sessions']} sessions in {out['elapsed_s']:.0f} s; a settled "
                  f"session in Redis {out['hot_bytes_per_session'] or 0:,.0f} bytes, its "
                  f"tombstone {out['tombstone_bytes'] or 0:,.0f} bytes, its archive object "
                  f"{out['archived_bytes_per_session'] or 0:,.0f} bytes")
    if out["failed"]:
        console.print(f"[red]{len(out['failed'])} failures[/red]: " + "; ".join(
            out["failed"][:5]))


async def run(quick: bool, console: Console, cluster: bool = False) -> Result:
    cfg = QUICK if quick else Config()
    if os.environ.get("BATON_SOAK_SESSIONS"):
        cfg = Config(sessions=int(os.environ["BATON_SOAK_SESSIONS"]), max_s=cfg.max_s,
                     kill_every=max(100, int(os.environ["BATON_SOAK_SESSIONS"]) // 40))
    out = await soak(cfg, console, cluster=cluster)
    _print(out, console)
    rows = [Row(mode="soak", operation="five notices, durable, retention "
                f"{RETENTION_S:g} s", writers=CONCURRENCY, n=out["sessions"], p50_us=0.0,
                p99_us=0.0, ops_per_s=out["sessions"] / out["elapsed_s"]
                if out["elapsed_s"] else 0.0)]
    return Result(name=f"soak{'-cluster' if cluster else ''}", rows=rows, env=environment(),
                  extra=out)
