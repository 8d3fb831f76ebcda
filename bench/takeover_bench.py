"""Takeover: a Hands SIGKILLed mid-send, to the session done, over repeated trials.

One :class:`~baton.devkit.devstack.DevStack` per settings variant (one Brain, two Hands, one
Relay; the mail service holds each answer 300 ms). Per trial a five-notice session is
submitted; as soon as the mail service has *recorded* one of its sends (accepted, reply not yet
seen) the Hands sending it is SIGKILLed and not restarted: the other, live replica must take
the run over (JetStream redelivers after ``ack_wait``; the attempt is reclaimed once its
heartbeat is older than ``attempt_ttl``), confirm it by its operation id and the Brain must
finish. Measured: kill -> the run's reclaim receipt, and kill -> submission settled. A fresh
Hands replaces the dead one between trials (untimed).

Variants: the defaults (``ack_wait_s`` 5, ``attempt_ttl_ms`` 5000), and the shorter timings
proposed when the default misses the target (section "Takeover" of the printed note).
Target: median <= 1.5 s with the default settings and no restart by anyone.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment, percentile
from baton.client import Client
from baton.devkit.devstack import DevStack
from baton.receipts import ClaimDetail
from baton.settings import Settings

NAME = "takeover"
DESCRIPTION = "kill a Hands mid-send -> session done (median, p90), default and short timings"

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
MAIL_DELAY_MS = 300
TARGET_MEDIAN_S = 1.5
# Heartbeats run every third of these; a shorter wait costs beats only for tools that run
# longer than a third of it (the beat tasks start only when the first beat is due).
PROPOSED = {"BATON_ACK_WAIT_S": "1", "BATON_ATTEMPT_TTL_MS": "1000"}


@dataclass(frozen=True)
class Config:
    trials: int = 7


QUICK = Config(trials=3)


async def _trial(stack: DevStack, client: Client, http: httpx.AsyncClient,
                 i: int) -> dict[str, float]:
    sub, _ = await client.submit(FIVE, agent="notices")
    store = client.store
    async with asyncio.timeout(30):
        while True:  # poll another process until a send is recorded but not answered
            state = await store.load(sub.session_id)
            busy = [r for r in state.runs.values()
                    if r.accepted_ms and not r.completed_ms and r.worker]
            found = None
            for run in busy:
                if (await http.get(f"/operations/{run.intent.operation_id}")).status_code == 200:
                    found = run
                    break
            if found is not None:
                break
            await asyncio.sleep(0.003)
    assert found.worker is not None
    stack.kill(found.worker, respawn=False)
    t0 = time.monotonic()
    wall0 = time.time() * 1000
    final = await client.wait(sub, timeout=60)
    done_s = time.monotonic() - t0
    if final.status != "completed":
        raise RuntimeError(f"trial {i}: session ended {final.status}: {final.error}")
    claims = [r for r in await store.receipts(sub.session_id)
              if isinstance(r.detail, ClaimDetail) and r.detail.run_id == found.run_id
              and r.worker and r.worker.name != found.worker]
    reclaim_s = (claims[0].ts_ms - wall0) / 1000 if claims else float("nan")
    await stack.wait_exit(found.worker)
    await stack.spawn("hands", f"hands-t{i}")  # the next trial has two live replicas again
    return {"done_s": done_s, "reclaim_s": reclaim_s}


async def trials(variant: str, env: dict[str, str], cfg: Config,
                 console: Console) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="baton-takeover-"))
    out: list[dict[str, float]] = []
    try:
        async with DevStack(base, brains=1, hands=2, relays=1, mail_delay_ms=MAIL_DELAY_MS,
                            namespace="bench", env=env, mail_persist=False) as stack:
            client = await Client.connect(stack.settings(worker_name="bench-client"))
            try:
                async with httpx.AsyncClient(base_url=stack.mail_url, timeout=5.0) as http:
                    for i in range(cfg.trials):
                        out.append(await _trial(stack, client, http, i))
                        console.print(f"[dim]{variant} trial {i + 1}: done "
                                      f"{out[-1]['done_s']:.2f}s after the kill[/dim]")
            finally:
                await client.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    settings = Settings.from_env(env)
    done = [t["done_s"] for t in out]
    return {"variant": variant, "ack_wait_s": settings.ack_wait_s,
            "attempt_ttl_ms": settings.attempt_ttl_ms, "trials": out,
            "median_s": percentile(done, 50), "p90_s": percentile(done, 90),
            "reclaim_median_s": percentile([t["reclaim_s"] for t in out], 50)}


def _rows(results: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for r in results:
        done = [t["done_s"] * 1e6 for t in r["trials"]]
        rows.append(Row(mode=r["variant"], operation="kill Hands mid-send -> session done",
                        writers=1, n=len(done), p50_us=percentile(done, 50),
                        p99_us=percentile(done, 99), ops_per_s=float("nan"),
                        note=f"p90 {r['p90_s']:.2f}s"))
    return rows


def print_takeover(results: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Takeover (seconds after the SIGKILL)", title_justify="left")
    for col in ("settings", "ack_wait_s", "attempt_ttl_ms", "trials", "reclaim median",
                "done median", "done p90", f"target median <= {TARGET_MEDIAN_S}s"):
        table.add_column(col, justify="left" if col == "settings" else "right")
    for r in results:
        met = r["median_s"] <= TARGET_MEDIAN_S
        table.add_row(r["variant"], f"{r['ack_wait_s']:g}", str(r["attempt_ttl_ms"]),
                      str(len(r["trials"])), f"{r['reclaim_median_s']:.2f}",
                      f"{r['median_s']:.2f}", f"{r['p90_s']:.2f}",
                      "yes" if met else "[red]no[/red]")
    console.print(table)


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    results = [await trials("defaults", {}, cfg, console),
               await trials("proposed", dict(PROPOSED), cfg, console)]
    print_takeover(results, console)
    default = results[0]
    console.print(
        f"[dim]What bounds it: the dead Hands' message comes back after ack_wait "
        f"({default['ack_wait_s']:g}s) and its attempt can be reclaimed once its heartbeat is "
        f"older than attempt_ttl ({default['attempt_ttl_ms']} ms); both clocks start at the "
        f"last beat before the kill, so the takeover is about max(ack_wait, ttl) plus a "
        f"confirm and two hops. The proposed defaults ({PROPOSED}) keep heartbeats at a third "
        f"of each (only tools running longer than that beat at all).[/dim]")
    return Result(NAME, _rows(results), env=env,
                  extra={"config": asdict(cfg), "variants": results,
                         "target_median_s": TARGET_MEDIAN_S})
