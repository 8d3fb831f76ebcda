"""trace / watch / inspect on real stacks: the demo's kill-and-takeover run, a live session."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from baton.cli.inspect import cluster_view, render_cluster, render_session, session_view
from baton.cli.observe import load_receipts, save_receipts
from baton.cli.trace import build_trace, render_text
from baton.cli.trace.html import render_html
from baton.cli.watch import Watch, render_change
from baton.client import Client
from baton.devkit.demo import DEMO_ENV, FIVE_NOTICES, MAIL_DELAY_MS, Outcome, run_demo
from baton.devkit.devstack import DevStack
from baton.store.store import Store
from tests.helpers import eventually


def _baton(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "baton", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env}, check=False)
    assert done.returncode == 0, f"baton {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """One demo run (five notices, the Hands sending mail 4 SIGKILLed), shared by the tests."""
    out = asyncio.run(run_demo(tmp_path_factory.mktemp("demo")))
    assert not out.error and out.status == "completed", out.error
    assert out.takeovers, "the demo recorded no takeover"
    return out


def test_trace_text_shows_the_kill_and_the_takeover_in_order_with_fences(demo: Outcome) -> None:
    trace = build_trace(demo.session, demo.receipts)
    text = render_text(trace)
    lines = text.splitlines()
    killed, run = demo.kill.worker, demo.kill.run_id
    tail = run.rsplit("-", 2)
    short = f"run {tail[-2]}-{tail[-1]}"
    first_claim = next(i for i, line in enumerate(lines)
                       if f"claimed {short} attempt 1" in line and killed in line)
    takeover = next(i for i, line in enumerate(lines) if f"TAKEOVER of {short}" in line)
    confirmed = next(i for i, line in enumerate(lines)
                     if f"completed {short} attempt 2" in line and "CONFIRMED" in line)
    final = next(i for i, line in enumerate(lines) if "commit:final" in line)
    assert first_claim < takeover < confirmed < final
    other = lines[takeover]
    assert f"attempt 1 by {killed} ended without a result" in other
    assert "a:2" in other and killed not in other.split()[1]  # taken over by the other hands
    assert " a:1 " in lines[first_claim]
    # the killed process's lane says it fell silent with the run in hand
    assert re.search(rf"{killed} \(pid \d+\).*left {short} attempt 1 without a result", text)
    assert "takeovers: 1" in text and "confirm / recovery outcomes: 1" in text
    refused = [r for r in demo.receipts if r.kind == "refused"]
    assert f"refused stale writes: {len(refused) or 'none'}" in text
    # Brain fences are session fences: the results are looked at under the lease the Brain
    # held for them (s:1, brain.held), or, when its hold ran out first, a second lease (s:2)
    assert any((" s:1 " in line and " held " in line and "no relay" in line)
               or (" s:2 " in line and " lease " in line) for line in lines), text


def test_trace_json_and_html_picture(demo: Outcome, tmp_path: Path) -> None:
    trace = build_trace(demo.session, demo.receipts)
    data = json.loads(json.dumps(trace.to_json()))
    assert len(data["events"]) == len(demo.receipts)
    assert [e["stream_id"] for e in data["events"]] == [r.stream_id
                                                        for r in demo.receipts]
    take = [data["events"][i] for i in data["takeovers"]]
    assert take and take[0]["kind"] == "reclaim" and take[0]["fence"] == "a:2"
    assert {h["kind"] for h in data["handoffs"]} >= {"wake", "dispatch", "takeover"}
    run = next(r for r in data["runs"] if r["run_id"] == demo.kill.run_id)
    assert [a["result"] for a in run["attempts"]] == ["abandoned", "ok"]
    assert run["recovery"] == "confirmed" and run["deliveries"] >= 2
    assert all(e["hops"].get("execution", 0) >= 0 for e in data["events"])

    html = render_html(trace)
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert "src=" not in html and "@import" not in html
    lanes = {lane["name"] for lane in data["lanes"]}
    assert {demo.kill.worker, "brain-1"} <= lanes
    for name in lanes:
        assert f">{name}</text>" in html
    assert html.count('class="handoff takeover"') == 1 and "TAKEOVER" in html
    assert "DIED?" in html  # the killed lane is highlighted
    # each relay has a lane (in the JSON too) with a dot per stream message it published
    relays = [lane for lane in data["lanes"] if lane["role"] == "relay"]
    assert relays and {lane["name"] for lane in relays} == set(data["relays"])
    pubs = data["publishes"]
    assert pubs and sum(lane["published"] for lane in relays) == len(pubs)
    assert all(p["published_t_ms"] is not None and p["lane"] in lanes_by_id(data)
               for p in pubs)
    assert html.count('<g class="lane relay">') == len(relays)
    assert html.count('<g class="publish">') == len(pubs)
    # the killed run's message was published once and delivered twice: to the Hands that
    # died, then (redelivered) to the one that took over, drawn red dashed from the same dot
    claims = [e for e in data["events"] if e["run_id"] == demo.kill.run_id
              and e["kind"] in ("claim", "reclaim")]
    assert [e["carrier"]["delivery"] for e in claims] == [1, 2]
    pub = pubs[claims[0]["carrier"]["publish"]]
    assert claims[1]["carrier"]["publish"] == pub["index"]
    assert pub["deliveries"] == [e["index"] for e in claims]
    assert data["events"][pub["source"]]["kind"] in ("commit:tools", "commit:redispatch")
    assert html.count('class="relayed redelivery"') >= 1
    (tmp_path / "trace.html").write_text(html)


def lanes_by_id(data: dict[str, Any]) -> set[str]:
    return {lane["id"] for lane in data["lanes"]}


def test_trace_names_the_relay_and_the_consumer_of_every_hop(demo: Outcome) -> None:
    """Each wake and tool message names who carried it: the relay process that published the
    outbox row (and when), and the Brain or Hands process that acted on it."""
    trace = build_trace(demo.session, demo.receipts)
    data = json.loads(json.dumps(trace.to_json()))
    lanes = {lane["id"]: lane for lane in data["lanes"]}
    hops = [e for e in data["events"] if e["kind"] in ("lease", "takeover", "claim", "reclaim")]
    assert hops and all(e["carrier"] is not None for e in hops), hops
    relays = set(data["relays"])
    assert relays and all(r.startswith("relay-") for r in relays), relays
    for e in hops:
        c = e["carrier"]
        lane = lanes[e["lane"]]
        assert c["consumer"] == lane["name"] and c["relay"] in relays, c
        assert c["row_id"] and c["stream_seq"] > 0 and c["delivery"] >= 1, c
        assert c["published_t_ms"] is not None, c
        assert lane["role"] == ("brain" if e["kind"] in ("lease", "takeover") else "hands")
        if c["timer"]:
            continue
        src = data["events"][c["source"]]  # the commit whose outbox row this was
        assert int(c["row_id"].rsplit("/", 2)[1]) == src["seq"], (c, src)
        if lane["role"] == "hands":
            assert src["kind"] in ("commit:tools", "commit:redispatch"), src
        else:
            assert src["kind"] in ("submit", "complete", "commit:apply", "cancel") or \
                src["kind"].startswith("commit"), src
    assert data["carriers"] == [e["carrier"] for e in hops]
    # every wake and dispatch names its relay, but a wake of a Brain holding its lease for
    # the results, which came on its hold channel (brain.held)
    held = {e["index"] for e in data["events"] if e["kind"] == "held"}
    via = {h["via"] for h in data["handoffs"] if h["kind"] in ("wake", "dispatch")
           and h["dst"] not in held}
    assert via and via <= relays
    assert all(h["via"] == "" for h in data["handoffs"] if h["dst"] in held)
    text = render_text(trace)
    first = next(e for e in hops if e["kind"] == "claim")
    relay, worker = first["carrier"]["relay"], lanes[first["lane"]]["name"]
    assert re.search(rf"{relay} published outbox row \S+ from commit:tools of brain-\d at "
                     rf"\+\d+\.\d+s \(stream seq \d+, delivery \d\) -> {worker} claimed", text)
    assert "message hops (outbox row -> relay -> the process that acted on it):" in text
    assert f"{relay} (" in render_html(trace)  # the page names the relays too


def test_saved_receipts_and_the_cli_trace(demo: Outcome, tmp_path: Path) -> None:
    env = {"BATON_HOME": str(tmp_path / "home"), "BATON_REDIS_URL": "redis://127.0.0.1:1/0"}
    save_receipts(demo.session, demo.receipts, tmp_path / "home")
    _, back = load_receipts(tmp_path / "home" / "traces" / f"{demo.session}.json")
    assert back == demo.receipts
    # the stack is gone (no Redis at that URL): trace falls back to the saved receipts
    out = _baton("trace", demo.session, env=env)
    assert "TAKEOVER of" in out
    # with --html the page is the result: one line says where it is, not the text again
    out = _baton("trace", demo.session, "--html", str(tmp_path / "t.html"), env=env)
    assert out == f"wrote {tmp_path / 't.html'}\n"
    assert (tmp_path / "t.html").read_text().startswith("<!doctype")
    # with --json too, stdout is still the JSON timeline alone
    out = _baton("trace", demo.session, "--json", "--html", str(tmp_path / "u.html"), env=env)
    assert json.loads(out)["takeovers"] and (tmp_path / "u.html").exists()
    out = _baton("trace", demo.session, "--json", "--run", demo.kill.run_id, env=env)
    assert len(out.strip().splitlines()) == 1  # one document per line, as every --json
    js = json.loads(out)
    assert {e["run_id"] for e in js["events"] if e["run_id"]} == {demo.kill.run_id}
    assert [js["events"][i]["kind"] for i in js["takeovers"]] == ["reclaim"]
    # an id that matches nothing is said so, not "no receipts" for a session that has them
    done = subprocess.run([sys.executable, "-m", "baton", "trace", demo.session, "--run",
                           "no-such-run"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, check=False)
    assert done.returncode == 1, done
    assert f"no receipts about run no-such-run in session {demo.session}" in done.stderr


def _ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in events if e["type"] == "receipt"]


async def test_watch_inspect_live_session_resume_and_redis_connection_drop(
    tmp_path: Path,
) -> None:
    env = {**DEMO_ENV, "BATON_HANDS_CONCURRENCY": "2"}
    async with DevStack(tmp_path, brains=1, hands=2, relays=1, mail_delay_ms=MAIL_DELAY_MS,
                        env=env) as stack:
        settings = stack.settings()
        client = await Client.connect(settings)
        admin = Redis.from_url(stack.redis_url, decode_responses=True)
        try:
            sub, _ = await client.submit(FIVE_NOTICES, agent="notices")
            sid = sub.session_id
            seen: list[dict[str, Any]] = []
            watch = Watch(settings, sid, seen.append, until_settled=True, block_ms=1000)
            task = asyncio.create_task(watch.run())
            await eventually(lambda: any(e["type"] == "snapshot" for e in seen), timeout=10)
            # inspect while it is live: runs in flight, a lease, the services
            store = await Store.connect(settings)
            try:
                await eventually(lambda: any(e["type"] == "mark" and e["mark"] == "accepted"
                                             for e in seen), timeout=10)
                live = await session_view(store, sid)
                # drop the watcher's connection(s) mid-session: it must reconnect and resume
                killed = 0
                for c in await admin.client_list():
                    if c.get("name") == f"baton-watch:{sid}":
                        killed += await admin.client_kill_filter(_id=c["id"])
                assert killed >= 1
                last = await asyncio.wait_for(task, timeout=60)
                final = await session_view(store, sid)
                cluster = await cluster_view(store)
            finally:
                await store.close()
            receipts = await client.store.receipts(sid)
            all_ids = [r.stream_id for r in receipts]
        finally:
            await client.close()
            await admin.aclose()

    # watch: snapshot first, then every later receipt exactly once, in order, until settled
    assert seen[0]["type"] == "snapshot"
    snap_at = seen[0]["last_id"]
    got = _ids(seen)
    assert got == [i for i in all_ids if _after(i, snap_at)], "lost or repeated receipts"
    assert last == all_ids[-1]
    assert watch.reconnects >= 1 and any(e["type"] == "reconnect" for e in seen)
    kinds = {e["type"] for e in seen}
    assert {"receipt", "mark", "entry", "task", "submission"} <= kinds
    assert any(e["type"] == "submission" and e["status"] == "completed" for e in seen)
    marks = {(e["run_id"], e["mark"]) for e in seen if e["type"] == "mark"}
    assert sum(1 for _, m in marks if m == "applied") == 5
    # Every mark names the run's attempt (1: nothing was retried), never the Brain's fence.
    assert {e["attempt"] for e in seen if e["type"] == "mark"} <= {1, None}
    text = "\n".join(render_change(e) for e in seen)
    assert "== snapshot of" in text and "mark completed" in text

    # inspect, live: a lease or runs in flight, and the marks so far
    assert live["runs"] and any(r["marks"]["accepted"] for r in live["runs"])
    assert live["lease"]["fence"] >= 1 and live["tasks"][0]["state"] in ("waiting", "running")
    # inspect, finished: every run applied with its three marks and attempts
    assert final["submissions"][0]["status"] == "completed"
    assert len(final["runs"]) == 5 and all(
        all(r["marks"].values()) and r["attempt"] >= 1 for r in final["runs"])
    assert final["lease"]["fence"] >= 1 and final["tasks"][0]["state"] == "terminal"
    assert {b["shard"] for b in final["backlog"]} == set(range(settings.shards))
    roles = {s["role"] for s in cluster["services"]}
    assert {"brain", "hands", "relay"} <= roles
    assert cluster["sessions_by_state"].get("settled", 0) >= 1
    assert "backlog" in cluster and cluster["dead_letters"]["count"] >= 0
    # the renderers run on both views
    from rich.console import Console
    console = Console(record=True, width=200)
    render_session(final, console)
    render_cluster(cluster, console)
    shown = console.export_text()
    assert "Tool runs" in shown and "Services seen" in shown and "Outbox backlog" in shown


def _after(stream_id: str, ref: str) -> bool:
    a, b = (tuple(int(x) for x in s.split("-")) for s in (stream_id, ref))
    return a > b


async def test_watch_resume_from_an_id_repeats_nothing_and_loses_nothing(tmp_path: Path) -> None:
    async with DevStack(tmp_path, brains=1, hands=1, relays=1) as stack:
        settings = stack.settings()
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit(FIVE_NOTICES, agent="notices")
            await client.wait(sub, timeout=60)
            all_ids = [r.stream_id for r in await client.store.receipts(sub.session_id)]
        finally:
            await client.close()
        # a finished session: the snapshot, nothing after it, and it ends at once
        first: list[dict[str, Any]] = []
        await Watch(settings, sub.session_id, first.append, until_settled=True).run()
        assert [e["type"] for e in first] == ["snapshot"]
        assert first[0]["last_id"] == all_ids[-1] and first[0]["receipts"] == len(all_ids)
        # resume after each id in turn: exactly the receipts after it
        for cut in (all_ids[0], all_ids[len(all_ids) // 2], all_ids[-2]):
            got: list[dict[str, Any]] = []
            await Watch(settings, sub.session_id, got.append, after=cut,
                        until_settled=True, block_ms=200).run()
            assert _ids(got) == all_ids[all_ids.index(cut) + 1:]
        # the CLI, on the stack: inspect both views, trace, watch from an id
        env = {"BATON_REDIS_URL": stack.redis_url, "BATON_NATS_URL": stack.nats_url,
               "BATON_HOME": str(tmp_path / "home")}
        out = _baton("watch", sub.session_id, "--json", "--from", all_ids[-3], "--until-settled",
                     env=env)
        lines = [json.loads(line) for line in out.splitlines()]
        assert lines[0]["type"] == "resume" and _ids(lines) == all_ids[-2:]
        text = _baton("watch", sub.session_id, "--until-settled", env=env)
        assert text.startswith("== snapshot of") and "submission" in text
        shown = _baton("inspect", sub.session_id, env=env)
        assert "Tool runs" in shown and "lease holder" in shown
        out = _baton("inspect", "--json", env=env)
        assert len(out.strip().splitlines()) == 1
        data = json.loads(out)
        assert {"brain", "hands", "relay"} <= {s["role"] for s in data["services"]}
        traced = _baton("trace", sub.session_id, env=env)
        assert "session lease taken" in traced and "takeovers: none" in traced
        async with httpx.AsyncClient(base_url=stack.mail_url) as http:
            assert (await http.get("/stats")).json()["raw_requests"] == 5


async def test_watch_that_never_reached_redis_reports_no_lost_connection() -> None:
    """Nothing was lost before the store first answered: no "connection lost; resuming"
    lines while waiting for it, only the error once the wait is over."""
    from baton.devkit.process import free_port
    from baton.errors import RedisUnavailable
    from baton.settings import Settings

    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="w")
    seen: list[dict[str, Any]] = []
    watch = Watch(settings, "s-none", seen.append, first_give_up_s=0.5)
    with pytest.raises(RedisUnavailable, match="cannot reach Redis"):
        await watch.run()
    assert seen == [] and watch.reconnects == 0
