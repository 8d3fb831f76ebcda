"""Where Redis spends its time in a five-notice session: by script and by command.

Redis' SLOWLOG, set to log every command, records each command's execution time in
microseconds: a script call (``FCALL`` of the library's function named for the script) with
the commands it runs, and each of those commands again as called by the script (the Lua
client, address ``?:0``). The sessions run on a stack of the e2e shape (1 Brain, 1 Hands, 1
relay, the mail service answering at once), at concurrency 1 and 32, with a few sessions
before each level to warm up.

Per session and per level: each script's calls and microseconds (its calls' p50 and p99),
the commands scripts ran (their share of the scripts' time), the commands sent directly,
and how much of the Redis process's CPU in the same run the logged execution covers (the
rest is reading, parsing and answering commands, and the event loop; the logged times are
wall time inside each command, so on a loaded machine they can add up to more). Baseline, measured
on the same server in the same run: a function that does nothing (the library's ``_ping``),
so each script's p50 reads as so many empty function calls, the fixed cost every call pays.

Logging every command costs the server some time of its own: the figures are for comparing
scripts and commands with each other and between versions, not the e2e benchmark's CPU.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.cold_bench import cpu_ns
from baton.bench.common import Result, Row, environment, percentile
from baton.bench.sessions import bench_client, sessions
from baton.devkit.devstack import DevStack
from baton.store.scripts import (
    SESSION_SCRIPTS,
    SHARD_SCRIPTS,
    TOMBSTONE_SCRIPTS,
    Library,
    library_code,
    source,
)

NAME = "redis"
DESCRIPTION = "Redis server time per five-notice session, by script and command (SLOWLOG)"

#: (concurrency, sessions, warm-up sessions per flow); SLOWLOG keeps every entry until read.
LEVELS = [(1, 40, 5), (32, 128, 1)]
QUICK_LEVELS = [(1, 8, 1), (32, 32, 1)]
#: The Lua client's address in SLOWLOG: the command was run by a script.
SCRIPTED = "?:0"
_NOOP = "return 1"


def script_names() -> dict[str, str]:
    """Function name (and SHA1 of an ``EVAL`` script) -> name of every Baton script, with
    and without its ACL checks (a worker calls the library its role needs; both run on a
    stack with restricted users and without)."""
    names = {hashlib.sha1(_NOOP.encode()).hexdigest(): "(empty script)"}
    for acl_checks in (True, False):
        library = library_code(acl_checks)[0]
        names[f"{library}_ping"] = "(empty function)"
        for name in (*SESSION_SCRIPTS, *SHARD_SCRIPTS, *TOMBSTONE_SCRIPTS):
            names[f"{library}_{name}"] = name
            text = source(name, acl_checks=acl_checks).encode()
            names[hashlib.sha1(text).hexdigest()] = name  # Redis names a script by its SHA1
    return names


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def tally(entries: Iterable[dict[str, Any]], names: dict[str, str]
          ) -> dict[str, dict[str, list[int]]]:
    """SLOWLOG entries -> {"scripts" | "scripted" | "direct": {name: [microseconds, ...]}}:
    script calls by script name (unknown SHAs by their first 12 hex digits), the commands
    scripts ran, and the commands clients sent directly."""
    out: dict[str, dict[str, list[int]]] = {
        "scripts": defaultdict(list), "scripted": defaultdict(list), "direct": defaultdict(list)}
    for entry in entries:
        words = _text(entry["command"]).split(" ")
        command = words[0].upper()
        if command == "CONFIG":  # this benchmark's own switch of the log
            continue
        duration = int(entry["duration"])
        if command in ("EVALSHA", "EVALSHA_RO") and len(words) > 1:
            sha = words[1].lower()
            out["scripts"][names.get(sha, f"sha {sha[:12]}")].append(duration)
        elif command in ("FCALL", "FCALL_RO") and len(words) > 1:
            out["scripts"][names.get(words[1], f"function {words[1]}")].append(duration)
        elif _text(entry.get("client_address", "")) == SCRIPTED:
            out["scripted"][command].append(duration)
        else:
            out["direct"][command].append(duration)
    return {kind: dict(by_name) for kind, by_name in out.items()}


def summarize(tallied: dict[str, dict[str, list[int]]], sessions_n: int) -> dict[str, Any]:
    """Per kind and name: calls and microseconds per session, p50 and p99 per call."""
    out: dict[str, Any] = {}
    for kind, by_name in tallied.items():
        out[kind] = {
            name: {"calls_per_session": len(us) / sessions_n,
                   "us_per_session": sum(us) / sessions_n,
                   "p50_us": percentile(us, 50), "p99_us": percentile(us, 99)}
            for name, us in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))}
    return out


class SlowlogEverything:
    """SLOWLOG set to log every command for a section, as it was configured afterwards."""

    def __init__(self, redis: Any, max_len: int) -> None:
        self.redis, self.max_len = redis, max_len
        self.saved: dict[str, str] = {}

    async def __aenter__(self) -> SlowlogEverything:
        for key in ("slowlog-log-slower-than", "slowlog-max-len"):
            self.saved.update(await self.redis.config_get(key))
        await self.redis.config_set("slowlog-max-len", self.max_len)
        await self.redis.slowlog_reset()
        await self.redis.config_set("slowlog-log-slower-than", 0)
        return self

    async def entries(self) -> list[dict[str, Any]]:
        await self.redis.config_set("slowlog-log-slower-than", -1)  # stop logging first
        entries: list[dict[str, Any]] = await self.redis.slowlog_get(self.max_len)
        if len(entries) >= self.max_len:
            raise RuntimeError(f"SLOWLOG filled its {self.max_len} entries: run fewer sessions")
        return entries

    async def __aexit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            await self.redis.config_set(key, value)
        await self.redis.slowlog_reset()


async def _empty_script_us(redis: Any, n: int = 200) -> float:
    """The p50 SLOWLOG time of a function that does nothing (the library's ``_ping``), on
    this server now."""
    library = Library(redis, acl_checks=False)
    await library.ensure()
    call = f"FCALL {library.name}_ping"
    # room for what the stack's workers run meanwhile (renewals, the sessions of the level
    # before still settling): only this function's calls are counted
    async with SlowlogEverything(redis, 50 * n) as log:
        for _ in range(n):
            await redis.execute_command("FCALL", f"{library.name}_ping", 0)
        durations = [int(e["duration"]) for e in await log.entries()
                     if _text(e["command"]).upper().startswith(call.upper())]
    return percentile(durations, 50)


def _print_level(level: str, v: dict[str, Any], console: Console) -> None:
    table = Table(title=f"Redis time per session at {level} ({v['sessions']} sessions; "
                        f"an empty script call: p50 {v['empty_script_p50_us']:.1f} µs)",
                  title_justify="left")
    for col in ("", "name", "calls/session", "µs/session", "p50 µs/call", "p99 µs/call",
                "p50 in empty calls"):
        table.add_column(col, justify="left" if col in ("", "name") else "right")
    empty = v["empty_script_p50_us"] or math.nan
    for kind, label in (("scripts", "script"), ("direct", "command"),
                        ("scripted", "in scripts")):
        for name, s in v[kind].items():
            table.add_row(label, name, f"{s['calls_per_session']:.2f}",
                          f"{s['us_per_session']:,.0f}", f"{s['p50_us']:.1f}",
                          f"{s['p99_us']:.1f}",
                          f"{s['p50_us'] / empty:.1f}" if kind == "scripts" else "")
    console.print(table)
    console.print(f"[dim]{level}: logged execution {v['logged_us_per_session']:,.0f} µs per "
                  f"session (scripts with the commands they ran, and direct commands; wall "
                  f"time inside each command, so a loaded machine adds to it) against "
                  f"{v['redis_cpu_us_per_session']:,.0f} µs of Redis CPU per session in the "
                  f"same run ({v['logged_share_of_cpu']:.0%}); the commands run by scripts "
                  f"take {v['scripted_share_of_scripts']:.0%} of the scripts' time, the rest "
                  f"is Lua's own work[/dim]")


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    names = script_names()
    rows: list[Row] = []
    extra: dict[str, Any] = {"levels": {}}
    base = Path(tempfile.mkdtemp(prefix="baton-redis-time-"))
    try:
        async with DevStack(base, brains=1, hands=1, relays=1, mail_delay_ms=0,
                            durable=False, namespace="bench", mail_persist=False) as stack:
            redis_pid = next(p["pid"] for p in stack.processes if p["name"] == "redis")
            client = await bench_client(stack)
            try:
                for conc, total, warmup in QUICK_LEVELS if quick else LEVELS:
                    level = f"c={conc}"
                    empty = await _empty_script_us(client.store.redis)
                    await sessions(client, conc, warmup * conc, 0)
                    async with SlowlogEverything(client.store.redis, 400 * total) as log:
                        cpu0 = cpu_ns(redis_pid)
                        done = await sessions(client, conc, total, 0)
                        cpu_us = (cpu_ns(redis_pid) - cpu0) / 1000
                        tallied = tally(await log.entries(), names)
                    n = len(done.samples_ns)
                    v: dict[str, Any] = {"sessions": n, "empty_script_p50_us": empty,
                                         **summarize(tallied, n)}
                    script_us = sum(s["us_per_session"] for s in v["scripts"].values())
                    direct_us = sum(s["us_per_session"] for s in v["direct"].values())
                    scripted_us = sum(s["us_per_session"] for s in v["scripted"].values())
                    v["logged_us_per_session"] = script_us + direct_us
                    v["redis_cpu_us_per_session"] = cpu_us / n
                    v["logged_share_of_cpu"] = (script_us + direct_us) / (cpu_us / n) \
                        if cpu_us else math.nan
                    v["scripted_share_of_scripts"] = scripted_us / script_us if script_us \
                        else math.nan
                    extra["levels"][level] = v
                    _print_level(level, v, console)
                    for name, s in v["scripts"].items():
                        rows.append(Row(
                            mode=level, operation=f"script {name}", writers=conc,
                            n=round(s["calls_per_session"] * n), p50_us=s["p50_us"],
                            p99_us=s["p99_us"], ops_per_s=math.nan,
                            ratio=s["p50_us"] / empty if empty else None,
                            note=f"{s['calls_per_session']:.2f}/session, "
                                 f"{s['us_per_session']:,.0f} µs/session"))
            finally:
                await client.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return Result(NAME, rows, env=environment(), extra=extra)


__all__ = ["DESCRIPTION", "NAME", "run", "script_names", "summarize", "tally"]
