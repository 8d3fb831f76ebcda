"""Takeover: a Hands SIGKILLed mid-send, to the session done, over many trials.

One :class:`~baton.devkit.devstack.DevStack` (one Brain, two Hands, one Relay; the mail
service holds each answer 300 ms). Per trial a five-notice session is submitted; as soon as
the mail service has *recorded* one of its sends (accepted, reply not yet seen) the Hands
sending it is SIGKILLed and not restarted: the other, live replica must take the run over,
confirm the send by its operation id and the Brain must finish. What makes it fast: the tool
consumers' ``tool_ack_wait_s`` brings the dead Hands' message back to the live one, which asks
the holder over NATS (``baton.hands.liveness``); "no responders" (its connection is gone)
lets it claim the attempt at once instead of after ``attempt_ttl``. Measured: kill -> the
run's reclaim receipt, and kill -> submission settled. Checked per trial from the mail
service's counters: every send delivered once (no duplicate), five raw requests (no re-send
of the killed one). A fresh Hands replaces the dead one between trials (untimed).

Target: median <= 0.5 s from the kill to the session done, with the shipped settings.
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
TARGET_MEDIAN_S = 0.5


@dataclass(frozen=True)
class Config:
    trials: int = 50


QUICK = Config(trials=5)


async def _trial(stack: DevStack, client: Client, http: httpx.AsyncClient,
                 i: int) -> dict[str, float]:
    await http.post("/reset")
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
    stats = (await http.get("/stats")).json()
    await stack.wait_exit(found.worker)
    await stack.spawn("hands", f"hands-t{i}")  # the next trial has two live replicas again
    return {"done_s": done_s, "reclaim_s": reclaim_s,
            # a send delivered twice; a send requested again (the confirm found it instead)
            "duplicates": float(sum(n - 1 for n in stats["deliveries"].values())
                                + stats["duplicates_suppressed"]),
            "resends": float(stats["raw_requests"] - stats["accepted"])}


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
    return {"variant": variant, "ack_wait_s": settings.tool_ack_wait_s,
            "attempt_ttl_ms": settings.attempt_ttl_ms, "trials": out,
            "min_s": min(done), "median_s": percentile(done, 50),
            "p90_s": percentile(done, 90), "p99_s": percentile(done, 99), "max_s": max(done),
            "reclaim_median_s": percentile([t["reclaim_s"] for t in out], 50),
            "duplicates": int(sum(t["duplicates"] for t in out)),
            "resends": int(sum(t["resends"] for t in out))}


def _rows(results: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for r in results:
        done = [t["done_s"] * 1e6 for t in r["trials"]]
        rows.append(Row(mode=r["variant"], operation="kill Hands mid-send -> session done",
                        writers=1, n=len(done), p50_us=percentile(done, 50),
                        p99_us=percentile(done, 99), ops_per_s=float("nan"),
                        note=f"p90 {r['p90_s']:.2f}s, {r['duplicates']} duplicates, "
                             f"{r['resends']} re-sends"))
    return rows


def print_takeover(results: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Takeover (seconds after the SIGKILL)", title_justify="left")
    for col in ("settings", "tool_ack_wait_s", "attempt_ttl_ms", "kills", "reclaim median",
                "done min", "done median", "done p90", "done max", "duplicates", "re-sends",
                f"target median <= {TARGET_MEDIAN_S}s"):
        table.add_column(col, justify="left" if col == "settings" else "right")
    for r in results:
        met = r["median_s"] <= TARGET_MEDIAN_S
        table.add_row(r["variant"], f"{r['ack_wait_s']:g}", str(r["attempt_ttl_ms"]),
                      str(len(r["trials"])), f"{r['reclaim_median_s']:.2f}",
                      f"{r['min_s']:.2f}", f"{r['median_s']:.2f}", f"{r['p90_s']:.2f}",
                      f"{r['max_s']:.2f}", str(r["duplicates"]), str(r["resends"]),
                      "yes" if met else "[red]no[/red]")
    console.print(table)


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    results = [await trials("defaults", {}, cfg, console)]
    print_takeover(results, console)
    default = results[0]
    console.print(
        f"[dim]What bounds it: the dead Hands' message comes back after the tool consumers' "
        f"ack_wait ({default['ack_wait_s']:g}s, counted from its last in_progress beat), the "
        f"live Hands finds the attempt busy, NATS answers 'no responders' for the holder and "
        f"the attempt is claimed at once (not after attempt_ttl, "
        f"{default['attempt_ttl_ms']} ms); then a confirm by operation id, the complete, a "
        f"wake and the Brain's summary turn.[/dim]")
    return Result(NAME, _rows(results), env=env,
                  extra={"config": asdict(cfg), "variants": results,
                         "target_median_s": TARGET_MEDIAN_S})
