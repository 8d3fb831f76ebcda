"""The ``baton`` command line as a user meets it: one-line errors, readable or JSON output.

Every test runs the real CLI as a child process (``python -m baton``) against the real
Redis and NATS of the test session (or against nothing, for the "no stack" cases).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from baton.client import Client
from baton.errors import ConflictError, NotFoundError, from_redis_error
from baton.settings import Settings
from baton.store.store import Store


def _cli(*args: str, env: dict[str, str], stdin: str | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "baton", *args], capture_output=True,
                          text=True, input=stdin, timeout=timeout, check=False,
                          env={**os.environ, "BATON_DEBUG": "", **env})


def _env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    return {**settings.to_env(), "BATON_HOME": str(tmp_path / "home")}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``error:`` line a failed command printed; no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_submit_wait_past_its_timeout_names_the_submission_and_what_to_run(
    settings: Settings, tmp_path: Path,
) -> None:
    done = _cli("submit", "--agent", "ghost", "--session", "s-late", "--wait", "--timeout",
                "0.5", "hello", env=_env(settings, tmp_path))
    assert done.returncode == 124, done.stderr
    line = _one_error(done)
    assert "submission sub-" in line and "session s-late" in line and "still accepted" in line
    assert "baton watch s-late" in line and "baton trace s-late" in line
    # no Brain serves "ghost": a warning first, on stderr; stdout has only the result
    assert "warning: no live Brain serves agent ghost at compat level 1" in done.stderr
    assert done.stdout.startswith("submitted sub-") and "warning" not in done.stdout


def test_a_cancel_no_brain_can_carry_out_says_so(settings: Settings, tmp_path: Path) -> None:
    """A session not opened yet (its request waits for a Brain of agent ghost): the cancel is
    recorded, and the command warns that nothing serves the agent, as submit and start do
    (it said 'cancel requested' and stayed pending without a word)."""
    env = _env(settings, tmp_path)
    started = _cli("submit", "--agent", "ghost", "--session", "s-unserved", "hello", env=env)
    assert started.returncode == 0, started.stderr
    done = _cli("cancel", "s-unserved", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cancel requested") or done.stdout.startswith(
        "cancel pending"), done.stdout
    assert ("warning: no live Brain serves agent ghost at compat level 1 in namespace "
            f"{settings.namespace}: the cancel is kept and waits until one starts"
            in done.stderr), done.stderr


def test_submit_require_brain_refuses_and_stores_nothing(settings: Settings,
                                                         tmp_path: Path) -> None:
    done = _cli("submit", "--agent", "ghost", "--session", "s-refused", "--require-brain",
                "hello", env=_env(settings, tmp_path))
    assert done.returncode == 1
    assert "no live Brain serves agent ghost at compat level 1" in _one_error(done)
    assert done.stdout == ""

    async def exists() -> int:
        store = await Store.connect(settings)
        try:
            return int(await store.redis.exists(store.keys.session("s-refused").meta))
        finally:
            await store.close()

    import asyncio

    assert asyncio.run(exists()) == 0


def test_require_brain_checks_the_level_an_existing_session_is_at(settings: Settings,
                                                                    tmp_path: Path) -> None:
    """A session migrated to compat 2 is served by compat-2 Brains, whatever --compat says;
    a level below 1 is refused before anything is looked up."""
    import asyncio

    async def migrated() -> None:  # as a v2 Brain's migration leaves the session's meta
        store = await Store.connect(settings)
        try:
            await store.redis.hset(store.keys.session("s-moved").meta,
                                   mapping={"agent": "ghost", "compat": "2"})
        finally:
            await store.close()

    asyncio.run(migrated())
    env = _env(settings, tmp_path)
    done = _cli("submit", "--agent", "ghost", "--compat", "1", "--session", "s-moved",
                "--require-brain", "hello", env=env)
    assert done.returncode == 1
    assert "no live Brain serves agent ghost at compat level 2" in _one_error(done)
    zero = _cli("submit", "--compat", "0", "hello", env=env)
    assert zero.returncode == 2 and "--compat" in zero.stderr and "Traceback" not in zero.stderr
    bad = _cli("submit", "--agent", "bad agent!", "hello", env=env)  # one error, no warning
    assert bad.returncode == 1 and "invalid agent 'bad agent!'" in _one_error(bad)


def test_start_warns_or_refuses_like_submit_when_no_brain_serves(settings: Settings,
                                                                 tmp_path: Path) -> None:
    env = _env(settings, tmp_path)
    done = _cli("start", "sleeper", "--agent", "ghost", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "warning: no live Brain serves agent ghost at compat level 1" in done.stderr
    assert json.loads(done.stdout)["created"] is True
    refused = _cli("start", "sleeper", "--agent", "ghost", "--require-brain", env=env)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "not starting (--require-brain)" in _one_error(refused)


def test_submit_dash_reads_stdin_and_json_gives_the_submission(settings: Settings,
                                                               tmp_path: Path) -> None:
    env = _env(settings, tmp_path)
    text = "Send the approved notice to ada@example.com\nfrom a pipe"
    done = _cli("submit", "--agent", "ghost", "--json", "-", env=env, stdin=text)
    assert done.returncode == 0, done.stderr
    sub = json.loads(done.stdout)
    assert sub["text"] == text and sub["created"] is True and sub["status"] == "accepted"
    human = _cli("submit", "--agent", "ghost", "plain words", env=env)
    assert human.returncode == 0 and human.stdout.startswith("submitted sub-")
    with pytest.raises(ValueError):
        json.loads(human.stdout)


async def test_a_reused_request_id_with_other_text_is_a_conflict(settings: Settings,
                                                                  tmp_path: Path) -> None:
    client = await Client.connect(settings)
    try:
        first, created = await client.submit("café ☕ one", agent="ghost", session_id="s-rid",
                                             request_id="r-1")
        again, created_again = await client.submit("café ☕ one", agent="ghost",
                                                   session_id="s-rid", request_id="r-1")
        assert created and not created_again and again.id == first.id  # idempotent
        with pytest.raises(ConflictError) as caught:
            await client.submit("two", agent="ghost", session_id="s-rid", request_id="r-1")
        assert "r-1" in caught.value.message and first.id in caught.value.message
        sk = client.store.keys.session("s-rid")
        subs = await client.store.redis.hlen(sk.subs)
        requests = await client.store.redis.hkeys(sk.inbox)
        assert subs + len(requests) == 1  # the refused input wrote nothing
    finally:
        await client.close()
    import asyncio

    env = _env(settings, tmp_path)
    done = await asyncio.to_thread(_cli, "submit", "--agent", "ghost", "--session", "s-rid",
                                   "--request-id", "r-1", "three", env=env)
    assert done.returncode == 1
    line = _one_error(done)
    assert "request id r-1 in session s-rid" in line and first.id in line
    same = await asyncio.to_thread(_cli, "submit", "--agent", "ghost", "--session", "s-rid",
                                   "--request-id", "r-1", "--json", "café ☕ one", env=env)
    assert same.returncode == 0 and json.loads(same.stdout)["id"] == first.id


async def test_a_reused_request_id_without_a_session_reaches_the_first_submission(
    settings: Settings, tmp_path: Path,
) -> None:
    """A retry that names no session (its first reply was lost) finds the first submission
    instead of opening a second session with the same input."""
    import asyncio

    env = _env(settings, tmp_path)
    first = await asyncio.to_thread(_cli, "submit", "--agent", "ghost", "--request-id",
                                    "order-17", "--json", "notify ada", env=env)
    assert first.returncode == 0, first.stderr
    sub = json.loads(first.stdout)
    retry = await asyncio.to_thread(_cli, "submit", "--agent", "ghost", "--request-id",
                                    "order-17", "--json", "notify ada", env=env)
    assert retry.returncode == 0, retry.stderr
    again = json.loads(retry.stdout)
    assert (again["id"], again["session_id"], again["created"]) == (
        sub["id"], sub["session_id"], False)
    other = await asyncio.to_thread(_cli, "submit", "--agent", "ghost", "--request-id",
                                    "order-17", "notify grace", env=env)
    assert other.returncode == 1
    assert "request id order-17" in _one_error(other) and sub["id"] in _one_error(other)
    client = await Client.connect(settings)
    try:  # the library call behaves the same, and so does starting a task
        same, created = await client.submit("notify ada", agent="ghost", request_id="order-17")
        assert same.id == sub["id"] and not created
        started = await client.start_task(None, "notice-batch", {}, agent="ghost",
                                          request_id="batch-3")
        restarted = await client.start_task(None, "notice-batch", {}, agent="ghost",
                                            request_id="batch-3")
        assert started[:2] == restarted[:2] and started[2] and not restarted[2]
        fresh, _ = await client.submit("notify ada", agent="ghost")  # no id: a new session
        assert fresh.session_id != sub["session_id"]
    finally:
        await client.close()


def test_an_empty_text_is_refused_before_anything_is_asked(tmp_path: Path) -> None:
    env = {"BATON_HOME": str(tmp_path / "empty"),
           "BATON_REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0"}
    done = _cli("submit", "-", env=env, stdin="  \n")
    assert done.returncode == 1
    assert _one_error(done) == "error: nothing to submit: the text is empty"
    assert "warning" not in done.stderr  # refused before the Brains were looked up


def test_not_found_replies_are_sentences(settings: Settings, tmp_path: Path) -> None:
    env, ns = _env(settings, tmp_path), settings.namespace
    for args in (("cancel", "s-missing"), ("inspect", "s-missing"), ("trace", "s-missing"),
                 ("watch", "s-missing"), ("cancel", "--json", "s-missing")):
        done = _cli(*args, env=env)
        assert done.returncode == 1, (args, done.stderr)
        assert _one_error(done) == f"error: no session s-missing in namespace {ns}", args
    for args in (("approve", "s-missing", "--run", "r-1", "--yes"),
                 ("reject", "s-missing", "--run", "r-1")):
        done = _cli(*args, env=env)
        assert done.returncode == 1, (args, done.stderr)
        assert _one_error(done) == f"error: no run r-1 in session s-missing (namespace {ns})"
    # a Lua script's bare reply becomes the same sentence
    mapped = from_redis_error(Exception("NOT_FOUND session"), session_id="s-x", namespace="baton")
    assert isinstance(mapped, NotFoundError)
    assert mapped.message == "no session s-x in namespace baton"


def test_with_no_stack_every_command_fails_in_one_line(tmp_path: Path) -> None:
    env = {"BATON_HOME": str(tmp_path / "empty"),
           "BATON_REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0",
           "BATON_NATS_URL": f"nats://127.0.0.1:{_closed_port()}"}
    for args in (("submit", "hi"), ("start", "notice_batch"), ("inspect",),
                 ("cancel", "s-1"), ("reject", "s-1", "--run", "r-1"),
                 ("api", "--dev", "--port", "0")):
        done = _cli(*args, env=env)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        assert "cannot reach Redis" in _one_error(done), args
        # where the URL came from: an exported variable wins over any local stack
        assert _one_error(done).endswith("(BATON_REDIS_URL from the environment)"), args
    # watch: a bounded retry (its bound shortened here from 5 s), then the same error
    watch = _cli("watch", "s-1", "--connect-wait", "0.3", env=env)
    assert watch.returncode == 3, (watch.stdout, watch.stderr)
    assert "cannot reach Redis" in _one_error(watch)
    assert "gave up after 0.3 s of retries" in watch.stderr
    assert "-- connection lost" not in watch.stderr  # never reached: nothing was lost
    bad = _cli("start", "notice_batch", "--input", "[not json", env=env)
    assert bad.returncode == 2 and "not JSON" in bad.stderr and "Traceback" not in bad.stderr
    missing = _cli("dev", "status", env=env)
    assert missing.returncode == 1 and "no stack running" in _one_error(missing)
    debug = _cli("--debug", "inspect", env=env)
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # the escape hatch


def test_a_file_that_holds_no_saved_receipts_is_one_error_line(tmp_path: Path) -> None:
    env = {"BATON_HOME": str(tmp_path / "empty")}
    for name, text, problem in (("broken.json", "{not json", "Expecting property name"),
                                ("other.json", '{"session_id": "s-1", "receipts": [{}]}',
                                 "Field required")):
        path = tmp_path / name
        path.write_text(text)
        done = _cli("trace", "s-1", "--receipts", str(path), env=env)
        assert done.returncode == 1
        line = _one_error(done)
        assert f"{path} is not a file of receipts saved by baton" in line and problem in line


def test_submit_past_a_tenants_bound_is_one_error_line_and_writes_nothing(
        settings: Settings, tmp_path: Path) -> None:
    """baton submit --tenant: within the tenant's bound on waiting work it is queued; past
    it, one error line naming the bound, exit 3 (retryable: try later)."""
    env = {**_env(settings, tmp_path), "BATON_ADMISSION_WINDOW": "1",
           "BATON_MAX_WAITING_PER_TENANT": "1"}
    first = _cli("submit", "--agent", "ghost", "--tenant", "acme", "--priority", "2", "hello",
                 env=env)
    assert first.returncode == 0, first.stderr
    second = _cli("submit", "--agent", "ghost", "--tenant", "acme", "hello again", env=env)
    assert second.returncode == 3, (second.stdout, second.stderr)  # retryable: try later
    line = _one_error(second)
    assert "tenant acme's new sessions waiting to start (1) reached the bound of 1" in line
    other = _cli("submit", "--agent", "ghost", "--tenant", "globex", "hello", env=env)
    assert other.returncode == 0, other.stderr  # another tenant has its own bound
    bad = _cli("submit", "--agent", "ghost", "--priority", "9", "hello", env=env)
    assert bad.returncode == 2 and "priority" in bad.stderr, bad.stderr


def _announce_brains(settings: Settings, *brains: tuple[str, list[str], list[str]]) -> None:
    """Liveness records as live Brains write them: (name, agents served at level 1, kinds)."""
    import asyncio

    from baton.models import dumps
    from baton.store.store import now_ms

    async def go() -> None:
        store = await Store.connect(settings)
        try:
            for name, agents, kinds in brains:
                field = f"brain:{name}"
                # seen "in an hour": alive however slowly the commands below run
                info = {"role": "brain", "name": name, "pid": 1,
                        "seen_ms": now_ms() + 3_600_000,
                        "serves": [[a, 1] for a in agents],
                        "kinds": {k: 1 for k in kinds}}
                await store.redis.hset(store.keys.workers(field), field, dumps(info))
        finally:
            await store.close()

    asyncio.run(go())


def test_without_agent_submit_and_start_take_the_one_served_or_refuse(
    settings: Settings, tmp_path: Path,
) -> None:
    """No silent default agent: none served, or several, is one error line listing what the
    live Brains serve and nothing written; one served is taken; an existing session keeps
    its own agent; start picks the one agent whose Brains run KIND."""
    env = _env(settings, tmp_path)
    none = _cli("submit", "hello", env=env)
    assert none.returncode == 1 and none.stdout == ""
    assert (f"no live Brain serves any agent in namespace {settings.namespace}: name the "
            "agent with --agent") in _one_error(none)

    _announce_brains(settings, ("b-1", ["support"], ["triage"]))
    one = _cli("submit", "--json", "--session", "s-support", "hello", env=env)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["agent"] == "support" and "warning" not in one.stderr

    _announce_brains(settings, ("b-2", ["billing"], ["invoice"]))
    several = _cli("submit", "hello", env=env)
    assert several.returncode == 1 and several.stdout == ""
    assert (f"name the agent with --agent: the live Brains in namespace {settings.namespace} "
            "serve billing, support") in _one_error(several)
    again = _cli("submit", "--json", "--session", "s-support", "more", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["agent"] == "support"  # the session's own

    started = _cli("start", "invoice", "--json", env=env)
    assert started.returncode == 0, started.stderr
    assert "warning" not in started.stderr
    unknown = _cli("start", "sleeper", env=env)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "serve billing, support (task kind 'sleeper' does not single one out)" in \
        _one_error(unknown)
