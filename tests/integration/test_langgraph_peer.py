"""The bench's in-process peer (baton.bench.langgraph_peer) does the five-notice work for real:
a LangGraph agent with a SQLite checkpointer sends each session's five mails once, each under
its own Idempotency-Key, to the bundled mail service."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from baton.bench import langgraph_peer
from baton.bench.sessions import FIVE
from baton.devkit.mailbox import MailboxServer

pytestmark = pytest.mark.skipif(not langgraph_peer.available(),
                                reason=f"LangGraph is not installed: {langgraph_peer.INSTALL_HINT}")


async def test_each_session_sends_its_five_mails_once(mailbox: MailboxServer) -> None:
    rows, cpu = await langgraph_peer.measure(mailbox.url, FIVE, [(1, 2, 0), (2, 4, 1)], None)
    assert sorted(rows) == [1, 2] and rows[1].n == 2 and rows[2].n == 4
    assert all(set(c) == {"process", "mailbox"} and c["process"] > 0 for c in cpu.values())
    sessions = 2 + 2 * (1 + 2)  # c=1: two; c=2: two workers, one warm-up and two each
    ops = mailbox.operations
    assert len(ops) == 5 * sessions and mailbox.duplicates_suppressed == 0
    # the key is the thread's and the call's: five calls per thread, threads apart
    threads = {key.rsplit("-", 1)[0] for key in ops}
    assert len(threads) == sessions
    assert sorted({op.to for op in ops.values()}) == sorted(
        ["ada@example.com", "grace@example.com", "linus@example.com", "margaret@example.com",
         "barbara@example.com"])


async def test_a_refused_mail_fails_the_session(mailbox: MailboxServer,
                                               tmp_path: Path) -> None:
    agent = await langgraph_peer.LangGraphAgent(f"{mailbox.url}/missing").open(
        tmp_path / "checkpoints.sqlite")
    try:
        with pytest.raises(httpx.HTTPStatusError, match="404"):
            await agent.session(FIVE)
    finally:
        await agent.close()
    assert mailbox.operations == {}


async def test_langsmith_tracing_in_the_environment_stays_off(
        mailbox: MailboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's LANGSMITH_TRACING=true would add LangSmith's cost (and calls to its server)
    to the peer's figures: its sessions run with tracing off."""
    from langsmith import utils

    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("LANGSMITH_ENDPOINT", "http://127.0.0.1:9")
    utils.get_env_var.cache_clear()
    try:
        assert utils.tracing_is_enabled()
        agent = await langgraph_peer.LangGraphAgent(mailbox.url).open(tmp_path / "c.sqlite")
        seen: list[object] = []
        post = agent.http.post

        async def traced_post(*args: object, **kwargs: object) -> httpx.Response:
            seen.append(utils.tracing_is_enabled())  # inside the graph's tool call
            return await post(*args, **kwargs)  # type: ignore[arg-type]

        agent.http.post = traced_post  # type: ignore[method-assign]
        try:
            await agent.session(FIVE)
        finally:
            await agent.close()
        assert seen == [False] * 5
    finally:
        utils.get_env_var.cache_clear()


@pytest.mark.parametrize(("fsync", "level"), [(False, 0), (True, 2)])
async def test_its_checkpoints_are_fsynced_beside_durable_servers(
        mailbox: MailboxServer, tmp_path: Path, fsync: bool, level: int) -> None:
    """bench durable holds Baton on servers that fsync every write against this agent with
    SQLite's synchronous=FULL (2); bench e2e, on servers that do not, with OFF (0)."""
    agent = await langgraph_peer.LangGraphAgent(mailbox.url).open(tmp_path / "c.sqlite",
                                                                  fsync=fsync)
    try:
        async with agent._conn.execute("PRAGMA synchronous") as cursor:
            assert (await cursor.fetchone())[0] == level
        await agent.session(FIVE)
    finally:
        await agent.close()
    assert len(mailbox.operations) == 5
