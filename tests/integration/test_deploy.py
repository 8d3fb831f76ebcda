"""The deploy files agree with the code and are accepted by the real servers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import redis.asyncio as aioredis

from baton.auth import ROLES, nats_users_file, redis_acl_file
from baton.devkit.servers import NatsServer, RedisServer

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORDS = {f"{r.upper()}_NATS_PASSWORD": f"{r}pw" for r in ("admin", *ROLES)}


def test_permission_files_are_generated_from_the_code() -> None:
    # Regenerate with `python -m baton.auth` after changing shared/auth.py.
    assert (DEPLOY / "nats" / "users.conf").read_text() == nats_users_file("baton")
    assert (DEPLOY / "redis" / "users.acl").read_text() == redis_acl_file("baton")


def test_the_nats_config_is_valid_for_nats_server(tmp_path: Path) -> None:
    for name in ("nats.conf", "users.conf"):
        shutil.copy(DEPLOY / "nats" / name, tmp_path / name)
    conf = tmp_path / "nats.conf"
    text = conf.read_text()
    assert "sync_interval: always" in text and "include ./users.conf" in text
    conf.write_text(text.replace("store_dir: /data", f"store_dir: {tmp_path / 'js'}"))
    binary = NatsServer(tmp_path / "probe")._binary
    done = subprocess.run([binary, "-c", str(conf), "-t"], capture_output=True, text=True,
                          env={**os.environ, **PASSWORDS, "SERVER_NAME": "nats-1"},
                          timeout=30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_the_redis_acl_file_is_accepted_and_durable_settings_are_set(
    tmp_path: Path,
) -> None:
    conf = (DEPLOY / "redis" / "redis.conf").read_text()
    assert re.search(r"(?m)^appendonly yes$", conf)
    assert re.search(r"(?m)^appendfsync always$", conf)
    async with RedisServer(tmp_path) as server:
        admin = aioredis.Redis.from_url(server.url)
        for line in (DEPLOY / "redis" / "users.acl").read_text().splitlines():
            if not line.startswith("user ") or line.split()[1] == "default":
                continue
            rules = re.sub(r"\$\{(\w+)\}", "secret", line).split()[1:]
            await admin.execute_command("ACL", "SETUSER", *rules)
        names = {u.decode() for u in await admin.execute_command("ACL", "USERS")}
        await admin.aclose()
    assert names >= {"admin", *ROLES}


def test_stop_grace_periods_exceed_the_drain_timeout() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    drain = int(re.search(r"BATON_DRAIN_TIMEOUT_S=(\d+)", (DEPLOY / ".env.example")
                          .read_text())[1])  # type: ignore[index]
    graces = [int(g) for g in re.findall(r"stop_grace_period: (\d+)s", compose)]
    assert graces and max(graces) > drain
    assert 'BATON_STREAM_REPLICAS: "3"' in compose
    for role in ("brain", "hands", "relay"):
        manifest = (DEPLOY / "k8s" / f"{role}.yaml").read_text()
        grace = int(re.search(r"terminationGracePeriodSeconds: (\d+)", manifest)[1])  # type: ignore[index]
        assert grace > drain and "readinessProbe" in manifest and "PodDisruptionBudget" in manifest



def test_every_baton_service_sends_telemetry_to_the_collector_and_on_to_jaeger() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector:4318"
    # relay, brain and hands merge the shared block; the client sets its own.
    shared = compose.split("x-baton-env: &baton-env", 1)[1].split("\nservices:", 1)[0]
    client = compose.split("\n  client:", 1)[1].split("\n  otel-collector:", 1)[0]
    assert endpoint in shared and endpoint in client
    for role in ("relay", "brain", "hands", "client"):
        assert f"OTEL_SERVICE_NAME: baton-{role}" in compose
    for role in ("relay", "brain", "hands"):
        block = compose.split(f"\n  {role}:", 1)[1].split("\n\n", 1)[0]
        assert "<<: *baton-env" in block, role
    assert '"4318:4318"' in compose and '"16686:16686"' in compose
    collector = (DEPLOY / "otel" / "collector.yaml").read_text()
    assert "endpoint: jaeger:4317" in collector
    assert "exporters: [otlp/jaeger" in collector and "    metrics:\n" in collector
