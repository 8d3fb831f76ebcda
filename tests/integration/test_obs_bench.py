"""bench obs moves its modes from stack to stack (baton.bench.obs_bench.configure): a stack's
services are stopped and started again with another mode's configuration, and the next
sessions run on the new ones alone."""

from __future__ import annotations

from pathlib import Path

from baton.bench.obs_bench import configure
from baton.bench.sessions import FIVE, bench_client, session_call
from baton.devkit.dev import _pid_alive
from baton.devkit.devstack import DevStack


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


async def test_a_stack_serves_the_next_modes_configuration(tmp_path: Path) -> None:
    async with DevStack(tmp_path, brains=0, hands=0, relays=0, namespace="obs0",
                        mail_persist=False) as stack:
        client = await bench_client(stack)
        try:
            first = await configure(stack, {"BATON_LOG_LEVEL": "warning"})
            assert set(first) == {"redis", "nats", "brain", "hands", "relay"}
            await session_call(client, FIVE)(0)
            second = await configure(stack, {"BATON_LOG_LEVEL": "info", "OBS_MODE": "b"})
            await session_call(client, FIVE)(1)
        finally:
            await client.close()
        for role in ("brain", "hands", "relay"):
            assert second[role] != first[role] and not _pid_alive(first[role]), role
            env = _environ(second[role])
            assert env["BATON_LOG_LEVEL"] == "info" and env["OBS_MODE"] == "b", role
        assert (second["redis"], second["nats"]) == (first["redis"], first["nats"])
        assert [p.name for p in stack.procs() if p.alive and p.role != "mailbox"] == [
            "relay-2", "brain-2", "hands-2"]
