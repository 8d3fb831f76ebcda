"""Health checks and graceful stop: /healthz, /readyz, ``baton health``, SIGTERM mid-tool."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from baton.bus.bus import Bus
from baton.client import Client
from baton.devkit.demo import FIVE_NOTICES
from baton.devkit.devstack import DevStack
from baton.hands.worker import HandsWorker
from baton.observability.health import answer, check_http, serve_health
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.scripts import load_functions
from baton.store.store import Store
from tests.helpers import eventually
from tests.integration.confinement import confined_redis
from tests.integration.hands_app import (
    APP,
    HOOKS,
    commit_runs,
    dispatch,
    make_intent,
    new_id,
    result_of,
)
from tests.integration.test_e2e_inprocess import running


async def test_readyz_turns_503_while_draining_and_the_tool_still_finishes(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"worker_name": "hands-h", "attempt_ttl_ms": 600})
    store = await Store.connect(settings)
    bus = await Bus.connect(settings, "test-brain")
    await bus.ensure_streams()
    worker = HandsWorker(settings, APP, ["gate"])
    session = new_id("s")
    intent = make_intent(bus, session, "gate", {})
    await commit_runs(store, bus, session, [intent])
    started, release = asyncio.Event(), asyncio.Event()

    async def hold(ctx: object) -> dict[str, str]:
        started.set()
        await release.wait()
        return {"done": "after the drain began"}

    HOOKS[intent.run_id] = hold
    try:
        async with serve_health(worker, 0, host="127.0.0.1") as port:
            assert (await check_http(port, "/readyz"))[0] == 503  # not started yet
            serving = asyncio.create_task(worker.serve())
            await asyncio.wait_for(worker.ready.wait(), 10)
            status, body = await check_http(port, "/readyz")
            assert status == 200 and '"nats_connected": true' in body, body
            await dispatch(bus, intent)
            await asyncio.wait_for(started.wait(), 10)
            worker.shutdown()  # what the first SIGTERM does
            status, body = await check_http(port, "/readyz")
            assert status == 503 and '"not_draining": false' in body, body
            status, body = await check_http(port, "/healthz")
            assert status == 200 and '"draining": true' in body, body
            assert (await check_http(port, "/nope"))[0] == 404
            release.set()
            await asyncio.wait_for(serving, 15)
        result = await result_of(store, intent)
        assert result.ok and result.output == {"done": "after the drain began"}
    finally:
        await bus.close()
        await store.close()


def _baton_health(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings.to_env()}
    return subprocess.run([sys.executable, "-m", "baton", "health", *args],
                          capture_output=True, text=True, env=env, timeout=30, check=False)


async def test_baton_health_reads_a_services_announcement(settings: Settings) -> None:
    relay = Relay(settings.model_copy(update={"worker_name": "relay-h"}))
    async with running(relay):
        ok = await asyncio.to_thread(_baton_health, settings, "--role", "relay",
                                     "--name", "relay-h")
        assert ok.returncode == 0 and "fresh" in ok.stdout, ok.stdout + ok.stderr
    gone = await asyncio.to_thread(_baton_health, settings, "--role", "relay", "--name", "relay-h")
    assert gone.returncode == 1 and "no announcement" in gone.stdout


async def test_sigterm_drains_a_hands_process_mid_tool(tmp_path: Path) -> None:
    # Each mail's reply is held 1.5 s: the SIGTERM lands while all five sends are in flight.
    stack = DevStack(tmp_path, brains=1, hands=1, relays=1, mail_delay_ms=1500)
    async with stack, httpx.AsyncClient() as http:
        client = await Client.connect(stack.settings())
        try:
            sub, _ = await client.submit(FIVE_NOTICES, agent="notices")

            async def accepted() -> bool:
                stats = (await http.get(f"{stack.mail_url}/stats")).json()
                return stats["accepted"] >= 1

            await eventually(accepted, timeout=20, message="a mail accepted, its reply held")
            stack.kill("hands-1", signal.SIGTERM, respawn=False)
            assert await stack.wait_exit("hands-1", timeout=20) == 0
            final = await client.wait(sub, timeout=20)  # no Hands left: all finished before
        finally:
            await client.close()
        assert final.status == "completed", final
        stats = (await http.get(f"{stack.mail_url}/stats")).json()
        assert stats["raw_requests"] == 5 and sorted(stats["deliveries"].values()) == [1] * 5
        log = stack.proc("hands-1").log_path.read_text()
        assert "service_draining" in log and "hands_stopped" in log


async def test_runs_the_drain_timeout_cuts_short_say_so_and_every_service_says_it_stopped(
    tmp_path: Path,
) -> None:
    """A run cut short by the drain timeout was logged outcome "unhandled", which said
    nothing of why; the Brain wrote no last line as the relay and the Hands do."""
    stack = DevStack(tmp_path, brains=1, hands=0, relays=1)
    async with stack, httpx.AsyncClient() as http:
        await http.post(f"{stack.mail_url}/hold")  # every send waits for the release
        hands = await stack.spawn("hands", env={"BATON_DRAIN_TIMEOUT_S": "0.2"})
        client = await Client.connect(stack.settings())
        try:
            await client.submit(FIVE_NOTICES, agent="notices")

            async def held() -> bool:
                return (await http.get(f"{stack.mail_url}/stats")).json()["held"] >= 1

            await eventually(held, timeout=20, message="a mail accepted, its reply held")
            stack.kill(hands.name, signal.SIGTERM, respawn=False)
            await stack.wait_exit(hands.name, timeout=20)
            stack.kill("brain-1", signal.SIGTERM, respawn=False)
            assert await stack.wait_exit("brain-1", timeout=20) == 0
        finally:
            await http.post(f"{stack.mail_url}/release")
            await client.close()
        log = stack.proc(hands.name).log_path.read_text()
        assert '"outcome":"stopped_by_shutdown"' in log and '"outcome":"unhandled"' not in log
        assert "brain_stopped" in stack.proc("brain-1").log_path.read_text()


async def test_a_service_is_not_ready_while_redis_lacks_this_versions_scripts() -> None:
    """A role user may not load the scripts (`baton load-functions` does, as the admin): a
    service whose Redis has none of this version's has every transition refused, so /readyz
    says not ready, and ready again once they are loaded, with no restart."""
    async with confined_redis() as c:
        admin, redis = c.connect("admin"), c.connect("relay")
        relay = Relay(c.settings("relay"))
        try:
            await relay.announce_once(redis, c.keys)
            assert relay.health_checks()["functions_loaded"] is True
            await admin.execute_command("FUNCTION", "FLUSH")
            await relay.announce_once(redis, c.keys)
            status, body = answer(relay, "GET", "/readyz")
            assert status == 503, body
            assert body["functions_loaded"] is False and body["redis_reachable"] is True
            await load_functions(admin, Settings())
            await relay.announce_once(redis, c.keys)
            assert relay.health_checks()["functions_loaded"] is True
        finally:
            await redis.aclose()
            await admin.aclose()


async def test_the_health_endpoint_listens_where_it_is_told(settings: Settings) -> None:
    # On a shared host the probe is local: BATON_HEALTH_HOST keeps the endpoint off the
    # other interfaces (here a second loopback address stands for them), and `baton health
    # --port` asks the address it names.
    s = settings.model_copy(update={"worker_name": "relay-h", "health_host": "127.0.0.2"})
    relay = Relay(s)
    async with serve_health(relay, 0, s.health_host) as port:
        assert (await check_http(port, "/healthz", "127.0.0.2"))[0] == 200
        assert (await check_http(port, "/healthz", "127.0.0.1"))[0] == 0  # nothing there
        asked = await asyncio.to_thread(_baton_health, s, "--port", str(port), "--path",
                                        "/healthz")
        assert asked.returncode == 0, asked.stdout + asked.stderr
