"""Fleet-wide tool limits: what a cap costs per step, and how closely it holds.

Five stacks of the same shape run side by side (one Brain, three Hands, one relay, Redis and
NATS of their own, non-durable servers), each serving the notices example with its
``send_email`` tool declared another way (:mod:`baton.bench.limits_apps`):

- ``uncapped``: no limit. The Hands never reach the limit code then (``HandsWorker._process``
  runs the claim at once when ``ToolLimit.limited`` is false; no slot subscription, no
  limit in the announcement), and the run checks it: the tool's limit keys are absent from
  that stack's Redis at the end;
- ``cap never binds``: ``max_concurrency`` and a rate far above the load, so every run takes
  and gives back a slot and an admission (``tool_limit.lua`` twice) and none waits: the cost
  of the path alone;
- ``cap 3``: ``max_concurrency=3`` across the three Hands (64 slots each);
- ``rate 20/s``: ``rate="20/s"`` (burst 1) across the three Hands;
- ``uncapped again``: the uncapped tool on a stack of its own, the control: a paired change
  within its distance from zero is not told apart from nothing.

Each stack's mail service (:mod:`baton.bench.timed_mailbox`) answers a send after
:data:`MAIL_DELAY_MS` and counts its sends in flight and their peak, and stamps each
delivery as it arrives. Each round drives every stack in turn, in an order drawn from a
fixed seed, with the same five-notice sessions at the same concurrency, and measures, in the
same round and order, the baselines on a Redis and a NATS of their own: the raw hop chain of
``bench chain`` (Lua commit -> relay -> JetStream -> fetch -> Lua commit -> ack, and its
fenced commit alone), and one slot taken and given back (``Limits.acquire`` + ``release``).

Figures, not assertions: the CPU per step of Baton's processes (Brain, Hands, relay, Redis,
NATS: the mail service and this client apart) per variant, its change against the uncapped
stack paired by round (median, 95% interval), and as a multiple of the raw chain's CPU; the
cap's accuracy from the mail service's own counters and clock: the peak of sends in flight
beside the cap, sends accepted per second beside the rate (the error in %) and the most in
any one second. ``bench/results/limits.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from baton.bench import chain_bench
from baton.bench.cold_bench import cpu_ns, stack_pids
from baton.bench.common import Result, Row, environment, percentile, sequential
from baton.bench.e2e_bench import redis_calls
from baton.bench.limits_apps import (
    CAP,
    LOOSE_BURST,
    LOOSE_CAP,
    LOOSE_RATE,
    RATE,
)
from baton.bench.obs_bench import spread
from baton.bench.sessions import STEPS, bench_client, sessions
from baton.client import Client
from baton.devkit.devstack import DevStack
from baton.devkit.servers import EmbeddedStack
from baton.limits import ToolLimit
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.limits import Limits
from baton.store.redis_client import connect_redis

NAME = "limits"
DESCRIPTION = ("a tool uncapped, capped but never bound, capped at 3 and at 20/s: CPU per step "
               "beside the raw hops, the cap's accuracy at the mail service")

HANDS = 3
MAIL_DELAY_MS = 20  # the mail service's answer time: sends overlap as a real service's do
TOOL = "send_email"
#: The Baton processes whose CPU counts (the mail service and this client are the outside).
OWN = ("brain", "hands", "relay", "redis", "nats")
ORDER_SEED = 47
RAW = "raw hops"  # the baselines' turn in a round


@dataclass(frozen=True)
class Variant:
    name: str
    app: str
    limit: str


VARIANTS = (
    Variant("uncapped", "baton.bench.limits_apps:uncapped", "none"),
    Variant("cap never binds", "baton.bench.limits_apps:loose",
            f"max_concurrency={LOOSE_CAP}, rate={LOOSE_RATE:g}/s, burst={LOOSE_BURST}"),
    Variant("cap 3", "baton.bench.limits_apps:capped", f"max_concurrency={CAP}"),
    Variant("rate 20/s", "baton.bench.limits_apps:rated", f'rate="{RATE:g}/s"'),
    Variant("uncapped again", "baton.bench.limits_apps:uncapped", "none (control)"),
)
UNCAPPED, LOOSE, CAPPED, RATED, CONTROL = (v.name for v in VARIANTS)


@dataclass(frozen=True)
class Config:
    rounds: int = 8
    concurrency: int = 32
    sessions: int = 64  # per variant and round
    chain: chain_bench.Config = field(default_factory=lambda: chain_bench.Config(
        hop_n=400, chains=150, warmup=20, flows=16, per_flow=40, flow_warmup=5))
    pairs: int = 400  # slot acquire + release, per round


QUICK = Config(rounds=1, concurrency=8, sessions=16,
               chain=chain_bench.Config(hop_n=50, chains=30, warmup=5, flows=4, per_flow=10,
                                        flow_warmup=2),
               pairs=50)


# ---------------------------------------------------------------------------- accuracy


def accepted_per_s(arrivals_ms: list[float]) -> float:
    """Deliveries a second between the first and the last (nan with fewer than two)."""
    if len(arrivals_ms) < 2 or arrivals_ms[-1] <= arrivals_ms[0]:
        return math.nan
    return (len(arrivals_ms) - 1) * 1000 / (arrivals_ms[-1] - arrivals_ms[0])


def busiest_second(arrivals_ms: list[float]) -> int:
    """The most deliveries within any one second (a window starting at a delivery)."""
    best, lo = 0, 0
    for hi, at in enumerate(arrivals_ms):
        while at - arrivals_ms[lo] >= 1000:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# ---------------------------------------------------------------------------- the stacks


@dataclass
class _Stack:
    variant: Variant
    stack: DevStack
    client: Client
    mail_url: str
    mail_pid: int
    pids: dict[str, int]  # process name -> pid, Baton's own processes

    def cpu(self) -> dict[str, int]:
        return {name: cpu_ns(pid) for name, pid in self.pids.items()}


async def _mailbox(opened: contextlib.AsyncExitStack) -> tuple[str, int]:
    """A timed mail service in a process of its own: (its URL, its pid)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton.bench.timed_mailbox", "--delay-ms", str(MAIL_DELAY_MS),
        stdout=asyncio.subprocess.PIPE)

    async def stop() -> None:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    opened.push_async_callback(stop)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    if not line:
        raise RuntimeError("the timed mail service exited before it listened")
    return str(json.loads(line)["url"]), proc.pid


async def _open(variant: Variant, i: int, base: Path,
                opened: contextlib.AsyncExitStack) -> _Stack:
    # The Hands are spawned with the timed mail service's URL (a process's own variables
    # go over the stack's); the stack's own mail service idles.
    stack = await opened.enter_async_context(DevStack(
        base / str(i), brains=1, hands=0, relays=1, mail_delay_ms=MAIL_DELAY_MS,
        durable=False, namespace=f"limits{i}", mail_persist=False, app_spec=variant.app))
    mail_url, mail_pid = await _mailbox(opened)
    for _ in range(HANDS):
        await stack.spawn("hands", env={"BATON_MAIL_URL": mail_url})
    client = await bench_client(stack)
    opened.push_async_callback(client.close)
    pids = {name: pid for name, pid in stack_pids(stack).items() if name != "mailbox"}
    return _Stack(variant, stack, client, mail_url, mail_pid, pids)


def _role(name: str) -> str:
    return name.split("-")[0]


def _own(by_process: dict[str, float]) -> float:
    return sum(v for name, v in by_process.items() if _role(name) in OWN)


# ---------------------------------------------------------------------------- one turn


async def _drive(s: _Stack, cfg: Config, http: httpx.AsyncClient) -> dict[str, Any]:
    """One variant's sessions: CPU per step by process, sessions/s, the mail service's
    counts and clock over them."""
    await http.post(f"{s.mail_url}/reset")
    calls0 = await redis_calls(s.client.store)
    mail0, before = cpu_ns(s.mail_pid), s.cpu()
    done = await sessions(s.client, cfg.concurrency, cfg.sessions, 0)
    after, mail1 = s.cpu(), cpu_ns(s.mail_pid)
    calls = await redis_calls(s.client.store) - calls0
    calls["info"] = 0
    stats = (await http.get(f"{s.mail_url}/stats")).json()
    # Left by a slot's take and release until they expire (2 slot times): none at all
    # means no run of this stack went through the limit's script.
    keys = await s.client.store.redis.exists(*s.client.store.keys.tool_limit(TOOL))
    n = len(done.samples_ns)
    steps = n * STEPS
    arrivals = stats["delivered_at_ms"]
    return {
        "sessions": n,
        "sessions_per_s": n / done.elapsed_s,
        "p50_ms": percentile(done.samples_ns, 50) / 1e6,
        "cpu_us_per_step": {k: (after[k] - before[k]) / 1e3 / steps for k in before},
        "mail_cpu_us_per_step": (mail1 - mail0) / 1e3 / steps,
        "redis_calls_per_session": sum(calls.values()) / n,
        "accepted": stats["accepted"],
        "peak_in_flight": stats["max_in_flight"],
        "accepted_per_s": accepted_per_s(arrivals),
        "busiest_second": busiest_second(arrivals),
        "limit_keys": int(keys),
    }


async def _raw(servers: EmbeddedStack, cfg: Config, limits: Limits) -> dict[str, Any]:
    """The baselines on servers of their own (no variant's stack keeps their streams and
    keys): the raw chain, its fenced commit, and one slot taken and given back, with the
    servers' CPU per call."""
    redis_pid, nats_pid = servers.redis.pid, servers.nats.pid

    async def servers_s() -> float:
        return (cpu_ns(redis_pid) + cpu_ns(nats_pid)) / 1e9 if redis_pid and nats_pid else 0.0

    async def redis_s() -> float:
        return cpu_ns(redis_pid) / 1e9 if redis_pid else 0.0

    commit, chain, flows = await chain_bench.measure(
        servers.redis_url, servers.nats_url, cfg.chain, mode="raw", hops=("commit",),
        probe=servers_s)
    probe_limit = ToolLimit(max_concurrency=LOOSE_CAP, per_second=LOOSE_RATE, burst=LOOSE_BURST)

    async def pair(i: int) -> None:
        member = f"bench/{i}"
        if not (await limits.acquire("bench_probe", probe_limit, member)).granted:
            raise RuntimeError("the probe's slot was refused")
        await limits.release("bench_probe", probe_limit, member)

    slot = Row.from_run("raw", "slot acquire + release (tool_limit.lua x2)",
                        await sequential(pair, cfg.pairs, 20, probe=redis_s))
    out: dict[str, Any] = {}
    for key, row in (("commit", commit), ("chain", chain), ("chain_flows", flows),
                     ("slot_pair", slot)):
        out[key] = {"p50_us": row.p50_us, "client_cpu_us": row.client_cpu_us,
                    "server_cpu_us": row.server_cpu_us, "ops_per_s": row.ops_per_s,
                    "operation": row.operation + (f" ({row.note})" if row.note else "")}
    return out


def _cpu_of(op: dict[str, Any]) -> float:
    return float(op["client_cpu_us"] or 0.0) + float(op["server_cpu_us"] or 0.0)


# ---------------------------------------------------------------------------- run


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    started = time.perf_counter()
    turns: dict[str, list[dict[str, Any]]] = {v.name: [] for v in VARIANTS}
    raws: list[dict[str, Any]] = []
    waited: dict[str, int] = {}
    base = Path(tempfile.mkdtemp(prefix="baton-limits-"))
    try:
        async with contextlib.AsyncExitStack() as opened:
            stacks = {v.name: await _open(v, i, base, opened) for i, v in enumerate(VARIANTS)}
            http = await opened.enter_async_context(httpx.AsyncClient(timeout=10.0))
            console.print("[dim]" + "; ".join(
                f"{name}: {', '.join(f'{p} {pid}' for p, pid in s.pids.items())}"
                for name, s in stacks.items()) + "[/dim]")
            servers = await opened.enter_async_context(EmbeddedStack())
            raw_settings = Settings(redis_url=servers.redis_url, nats_url=servers.nats_url)
            raw_redis = connect_redis(raw_settings)
            opened.push_async_callback(raw_redis.aclose)
            limits = Limits(raw_redis, Keys("limits-raw", raw_settings.shards),
                            slot_ms=raw_settings.attempt_ttl_ms)
            for s in stacks.values():  # warm every stack: connections, first sessions
                await sessions(s.client, cfg.concurrency, cfg.concurrency, 0)
            shuffle = random.Random(ORDER_SEED)
            for r in range(cfg.rounds):
                order = [*stacks, RAW]
                shuffle.shuffle(order)
                for name in order:
                    if name == RAW:
                        raws.append(await _raw(servers, cfg, limits))
                    else:
                        turns[name].append(await _drive(stacks[name], cfg, http))
                console.print(f"[dim]round {r + 1}/{cfg.rounds}: " + ", ".join(
                    f"{name} {_own(t[-1]['cpu_us_per_step']):,.0f} µs/step"
                    for name, t in turns.items())
                    + f"; raw chain {_cpu_of(raws[-1]['chain_flows']):,.0f} µs CPU[/dim]")
            for name, s in stacks.items():
                waited[name] = _waits(s.stack)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    elapsed = time.perf_counter() - started
    summary = _summarize(turns, raws, waited)
    _print(summary, cfg, console)
    console.print(f"[dim]load average before {env['loadavg_1m']:.2f}; "
                  f"{elapsed:.0f} s[/dim]")
    rows = [Row(mode=name, operation=f"five notices c={cfg.concurrency}",
                writers=cfg.concurrency, n=sum(t["sessions"] for t in turns[name]),
                p50_us=v["p50_ms"] * 1000, p99_us=math.nan, ops_per_s=v["sessions_per_s"],
                ratio=v["cpu_x_uncapped"], server_cpu_us=v["cpu_us_per_step"],
                note="server CPU = Baton's processes per step; ratio = CPU per step / "
                     "uncapped's; medians of rounds")
            for name, v in summary["variants"].items()]
    rows += [Row(mode="raw", operation=b["operation"], writers=1, n=cfg.rounds,
                 p50_us=b["p50_us"], p99_us=math.nan, ops_per_s=b["ops_per_s"],
                 client_cpu_us=b["client_cpu_us"], server_cpu_us=b["server_cpu_us"],
                 note="medians of rounds")
             for b in summary["baselines"].values()]
    extra = {"config": asdict(cfg), "hands": HANDS, "mail_delay_ms": MAIL_DELAY_MS,
             "steps_per_session": STEPS, "variants": {v.name: asdict(v) for v in VARIANTS},
             "summary": summary, "rounds": turns, "baselines": raws,
             "loadavg_after": list(os.getloadavg()),
             "elapsed_s": round(elapsed, 1)}
    return Result(NAME, rows, env=env, extra=extra)


def _waits(stack: DevStack) -> int:
    """Runs that waited for a slot or the rate, from the Hands' logs (``tool_run_waiting``)."""
    total = 0
    for proc in stack.procs("hands"):
        with contextlib.suppress(OSError):
            total += proc.log_path.read_text(errors="replace").count("tool_run_waiting")
    return total


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def _summarize(turns: dict[str, list[dict[str, Any]]], raws: list[dict[str, Any]],
               waited: dict[str, int]) -> dict[str, Any]:
    base = [_own(t["cpu_us_per_step"]) for t in turns[UNCAPPED]]
    chain_cpu = _median([_cpu_of(b["chain_flows"]) for b in raws])
    variants: dict[str, Any] = {}
    for name, ts in turns.items():
        own = [_own(t["cpu_us_per_step"]) for t in ts]
        by_role: dict[str, float] = {}
        for role in OWN:
            by_role[role] = _median([sum(v for k, v in t["cpu_us_per_step"].items()
                                         if _role(k) == role) for t in ts])
        paired = spread([a / b - 1 for a, b in zip(own, base, strict=True)])
        variants[name] = {
            "cpu_us_per_step": _median(own),
            "cpu_x_uncapped": _median([a / b for a, b in zip(own, base, strict=True)]),
            "paired_change": paired,
            "cpu_x_raw_chain": _median(own) / chain_cpu,
            "cpu_us_per_step_by_role": dict(by_role),
            "mail_cpu_us_per_step": _median([t["mail_cpu_us_per_step"] for t in ts]),
            "sessions_per_s": _median([t["sessions_per_s"] for t in ts]),
            "p50_ms": _median([t["p50_ms"] for t in ts]),
            "redis_calls_per_session": _median([t["redis_calls_per_session"] for t in ts]),
            "peak_in_flight_max": max(t["peak_in_flight"] for t in ts),
            "peak_in_flight_median": _median([t["peak_in_flight"] for t in ts]),
            "accepted_per_s": _median([t["accepted_per_s"] for t in ts]),
            "busiest_second_max": max(t["busiest_second"] for t in ts),
            "accepted": sum(t["accepted"] for t in ts),
            "runs_that_waited": waited.get(name, 0),
            "limit_keys_after_sessions_max": max(t["limit_keys"] for t in ts),
        }
    # At most CAP sends at once of MAIL_DELAY_MS each: what the cap lets through at best.
    variants[CAPPED]["of_cap_allows"] = (variants[CAPPED]["accepted_per_s"]
                                         / (CAP * 1000 / MAIL_DELAY_MS))
    rated = variants[RATED]
    rated["rate_error"] = rated["accepted_per_s"] / RATE - 1
    rated["rate_error_by_round"] = [t["accepted_per_s"] / RATE - 1 for t in turns[RATED]]
    baselines = {key: {"operation": raws[0][key]["operation"],
                       **{f: _median([float(b[key][f] or math.nan) for b in raws])
                          for f in ("p50_us", "client_cpu_us", "server_cpu_us", "ops_per_s")}}
                 for key in ("commit", "chain", "chain_flows", "slot_pair")}
    pair_cpu = _cpu_of(baselines["slot_pair"])
    tool_steps = 5  # of STEPS per five-notice session
    return {"variants": variants, "baselines": baselines,
            "raw_chain_cpu_us": chain_cpu,
            "slot_pair_cpu_us": pair_cpu,
            "slot_pair_expected_us_per_step": pair_cpu * tool_steps / STEPS,
            "never_binding_added_us_per_step": (variants[LOOSE]["cpu_us_per_step"]
                                                - variants[UNCAPPED]["cpu_us_per_step"])}


def _change(stats: dict[str, float]) -> str:
    """``+4.1% (+3.0..+5.2)``: a paired change's median and its 95% interval."""
    return f"{stats['median']:+.1%} ({stats['ci_low']:+.1%}..{stats['ci_high']:+.1%})"


def _ratio(stats: dict[str, float]) -> str:
    """``1.041 (1.030..1.052)``: the same change as a ratio."""
    return (f"{1 + stats['median']:.3f} ({1 + stats['ci_low']:.3f}.."
            f"{1 + stats['ci_high']:.3f})")


def _cell(value: float | None, fmt: str = ",.0f") -> str:
    return "" if value is None or math.isnan(value) else format(value, fmt)


def _print(summary: dict[str, Any], cfg: Config, console: Console) -> None:
    v = summary["variants"]
    table = Table(title=f"Tool limits: five-notice sessions, {cfg.rounds} rounds of "
                        f"{cfg.sessions} at concurrency {cfg.concurrency} per variant, "
                        f"interleaved; {HANDS} Hands per stack; the mail service answers in "
                        f"{MAIL_DELAY_MS} ms; medians of rounds. CPU: Brain + Hands + relay + "
                        f"Redis + NATS per step; x raw chain: per raw chain's CPU at "
                        f"{cfg.chain.flows} flows, same rounds", title_justify="left")
    for col in ("variant", "CPU µs/step", "x uncapped (95% CI, paired)", "x raw chain",
                "sessions/s", "peak in flight", "sends/s accepted", "most in 1 s"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for variant in VARIANTS:
        f = v[variant.name]
        table.add_row(
            variant.name, _cell(f["cpu_us_per_step"]),
            "1" if variant.name == UNCAPPED else _ratio(f["paired_change"]),
            _cell(f["cpu_x_raw_chain"], ".2f"), _cell(f["sessions_per_s"], ".1f"),
            f"{f['peak_in_flight_max']}" + (f" (cap {CAP})" if variant.name == CAPPED else ""),
            _cell(f["accepted_per_s"], ".1f") + (f" ({f['rate_error']:+.1%})"
                                                 if variant.name == RATED else ""),
            str(f["busiest_second_max"]))
    console.print(table)
    console.print("[dim]limits: " + "; ".join(f"{x.name}: {x.limit}" for x in VARIANTS)
                  + "[/dim]")
    base = Table(title="Baselines of the same rounds, on a Redis and a NATS of their own "
                       "(medians of rounds; CPU per call: this process + the servers)",
                 title_justify="left")
    for col in ("operation", "p50 µs", "calls/s", "client CPU µs", "server CPU µs",
                "CPU µs"):
        base.add_column(col, justify="left" if col == "operation" else "right")
    for b in summary["baselines"].values():
        base.add_row(b["operation"], _cell(b["p50_us"]), _cell(b["ops_per_s"]),
                     _cell(b["client_cpu_us"]), _cell(b["server_cpu_us"]),
                     _cell(_cpu_of(b)) if not math.isnan(b["server_cpu_us"]) else "")
    console.print(base)
    split = Table(title="CPU µs per step by process, Redis commands per session (scripts' "
                        "commands counted) and runs that waited (tool_run_waiting in the Hands' "
                        "logs); medians of rounds", title_justify="left")
    split.add_column("variant")
    for col in (*OWN, "mail service", "Redis cmds/session", "runs waited"):
        split.add_column(col, justify="right")
    for variant in VARIANTS:
        f = v[variant.name]
        split.add_row(variant.name, *(_cell(f["cpu_us_per_step_by_role"][r]) for r in OWN),
                      _cell(f["mail_cpu_us_per_step"]), _cell(f["redis_calls_per_session"]),
                      str(f["runs_that_waited"]))
    console.print(split)
    unc, loose, rated = v[UNCAPPED], v[LOOSE], v[RATED]
    console.print(
        f"[dim]uncapped: a tool that declares no limit never reaches the limit code "
        f"(baton.hands.worker: the claim runs at once; no slot, no subscription to freed slots, "
        f"no limit announced). Seen here: the tool's limit keys in Redis right after its "
        f"sessions, at most {unc['limit_keys_after_sessions_max']} (the never-binding cap's: "
        f"{loose['limit_keys_after_sessions_max']}). CPU per step from before caps existed "
        f"cannot be run here; 'uncapped again', the same tool on a stack of its own, shows "
        f"how far from zero a paired change must be to count: "
        f"{_change(v[CONTROL]['paired_change'])}.[/dim]")
    console.print(
        f"[dim]a cap that never binds: {summary['never_binding_added_us_per_step']:+,.0f} µs "
        f"per step against uncapped; one slot taken and given back costs "
        f"{summary['slot_pair_cpu_us']:,.0f} µs of CPU (this process + Redis) here, and 5 of "
        f"a session's {STEPS} steps take one: {summary['slot_pair_expected_us_per_step']:,.0f} "
        f"µs per step expected. Accuracy, from the mail service's counters and clock: peak "
        f"in flight {v[CAPPED]['peak_in_flight_max']} at a cap of {CAP} (uncapped: "
        f"{unc['peak_in_flight_max']}), {v[CAPPED]['accepted_per_s']:.1f} sends/s where {CAP} "
        f"slots of {MAIL_DELAY_MS} ms allow {CAP * 1000 / MAIL_DELAY_MS:.0f} "
        f"({v[CAPPED]['of_cap_allows']:.0%}); at {RATE:g}/s, {rated['accepted_per_s']:.2f} sends/s "
        f"accepted ({rated['rate_error']:+.1%}), at most {rated['busiest_second_max']} in any "
        f"second (burst 1). A binding limit makes the sessions last longer: their CPU per "
        f"step also carries the stacks' idle cost over the extra time.[/dim]")
