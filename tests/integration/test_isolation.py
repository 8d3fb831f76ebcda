"""Tools declared ``isolation="process"`` against a real Hands, Redis (password on) and NATS.

The worker's credentials are in its settings and in its environment, as in a deployment;
an isolated tool must find none of them, and its crash, hang or memory blow-up must end
only its own attempt, with a clear error result. The attacks of one child on the others run
against a Hands that is root (this process) and one that is not (``tests.unprivileged_hands``,
a process of a uid of its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from baton.app import Agent, App, tool
from baton.bus.bus import Bus
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import ConfigError
from baton.hands import HandsWorker, isolation
from baton.models import Task, ToolDispatch, ToolIntent, ToolResult
from baton.settings import Settings
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import eventually
from tests.isolated_apps import (
    HELD_SECRET,
    Nothing,
    bail,
    dial,
    dial_out,
    escape,
    greet,
    hang,
    hog,
    holder,
    peek,
    plant,
    reader,
    segfault,
    shout,
    snoop,
)

PASSWORD = "worker-secret-" + uuid.uuid4().hex[:8]
APP = App(agents=[Agent(name="iso", tools=("snoop",))],
          tools=[snoop, hog, hang, segfault, bail, greet, shout, plant, holder, reader, escape,
                 dial, dial_out, peek])
BRAIN = worker_ref("brain", "brain-iso")
#: The uid of the Hands that is not root, and of the files it owns.
UNPRIVILEGED_UID = secrets.choice(range(1_800_000_000, 1_900_000_000))
ROOT = Path(__file__).resolve().parents[2]
Serving = Callable[[Settings], AbstractAsyncContextManager[tuple[Store, Bus]]]


@pytest.fixture(scope="module")
async def locked_redis() -> AsyncIterator[RedisServer]:
    async with RedisServer() as server:
        admin = aioredis.Redis.from_url(server.url)
        await admin.config_set("requirepass", PASSWORD)
        await admin.aclose()
        yield server


@pytest.fixture
def hs(locked_redis: RedisServer, nats_server: NatsServer,
       monkeypatch: pytest.MonkeyPatch) -> Settings:
    url = locked_redis.url.replace("redis://", f"redis://:{PASSWORD}@")
    # Where a deployed worker has them: its environment (a child would inherit them).
    monkeypatch.setenv("BATON_REDIS_URL", url)
    monkeypatch.setenv("BATON_NATS_PASSWORD", PASSWORD)
    return Settings(redis_url=url, nats_url=nats_server.url,
                    namespace="t" + uuid.uuid4().hex[:10], worker_name="hands-iso",
                    attempt_ttl_ms=600, ack_wait_s=2.0)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[Store, Bus]]:
    store = await Store.connect(settings)
    bus = await Bus.connect(settings, "test-brain")
    await bus.ensure_streams()
    worker = HandsWorker(settings, APP)
    task = asyncio.create_task(worker.serve())
    ready = asyncio.create_task(worker.ready.wait())
    await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield store, bus
    finally:
        worker.shutdown()
        await asyncio.wait_for(task, 15)
        await bus.close()
        await store.close()


@asynccontextmanager
async def unprivileged(settings: Settings) -> AsyncIterator[tuple[Store, Bus]]:
    """Like :func:`serving`, by a Hands that is not root (:mod:`tests.unprivileged_hands`, as
    :data:`UNPRIVILEGED_UID`, with ``$BATON_HOME`` if set). Skips where the kernel refuses it
    a user namespace: what it then gets is `test_without_namespaces_...`'s."""
    workdir = Path(tempfile.mkdtemp(prefix="baton-hands-"))
    os.chown(workdir, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1",
           "BATON_REDIS_URL": settings.redis_url, "BATON_NATS_URL": settings.nats_url,
           "BATON_NAMESPACE": settings.namespace, "BATON_WORKER_NAME": "hands-unprivileged",
           "BATON_ATTEMPT_TTL_MS": str(settings.attempt_ttl_ms),
           "BATON_ACK_WAIT_S": str(settings.ack_wait_s),
           "BATON_HOME": os.environ.get("BATON_HOME") or str(workdir / ".baton")}
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--mount", "--", sys.executable, "-m", "tests.unprivileged_hands",
        str(UNPRIVILEGED_UID), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env=env, cwd=workdir)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        async with asyncio.timeout(60):  # a bound for a broken start, not a timing
            found = json.loads(await proc.stdout.readline() or b"null")
            assert found is not None, f"the Hands that is not root ended: {await proc.wait()}"
            if not found["unshare"] and "may not make a user namespace" in found["missing"]:
                pytest.skip(f"this kernel refuses a user namespace: {found['missing']}")
            assert found["user_namespace"], found
            assert json.loads(await proc.stdout.readline() or b"null") == {"ready": True}
        store = await Store.connect(settings)
        bus = await Bus.connect(settings, "test-brain")
        try:
            await bus.ensure_streams()
            yield store, bus
        finally:
            await bus.close()
            await store.close()
    finally:
        proc.stdin.close()
        try:
            async with asyncio.timeout(30):
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=["root", "unprivileged"])
def hands(request: pytest.FixtureRequest) -> Serving:
    """A Hands that is root (this process) or one that is not."""
    return serving if request.param == "root" else unprivileged


async def run_tools(store: Store, bus: Bus, calls: list[tuple[str, dict[str, Any]]]
                    ) -> list[ToolResult]:
    """Commit one run per call as a Brain would, dispatch them, and wait for each result."""
    return [await result for result in await start_tools(store, bus, calls)]


async def start_tools(store: Store, bus: Bus, calls: list[tuple[str, dict[str, Any]]]
                      ) -> list[Awaitable[ToolResult]]:
    """Commit one run per call as a Brain would and dispatch them: each result, to await."""
    session = "s-" + uuid.uuid4().hex[:8]
    wake = bus.wake_subject("iso", 1)
    intents = [
        ToolIntent(run_id=f"run-{i}-{name}", session_id=session, task_id="task-1", tool=name,
                   arguments=arguments, operation_id=f"op-{i}", replay="unsafe",
                   wake_subject=wake)
        for i, (name, arguments) in enumerate(calls)
    ]
    await store.inbox.submit(session, agent="iso", compat=1, wake_subject=wake, request_id="r1",
                             text="go", task=Task(id="task-1", kind="generation", owner=session),
                             worker=worker_ref("client", "c"), submission_id="sub-1")
    lease = await store.acquire(session, BRAIN, 5000)
    await store.commit(session, lease.fence, Writes(runs=intents), BRAIN)
    for intent in intents:
        message = ToolDispatch(session_id=session, run_id=intent.run_id, tool=intent.tool)
        await bus.publish(bus.tool_subject(intent.tool), message.to_json().encode(),
                          msg_id=f"{session}/{intent.run_id}")

    async def result(intent: ToolIntent) -> ToolResult:
        async def completed() -> ToolResult | None:
            run = await store.runs.get(session, intent.run_id)
            return run.result if run and run.status == "completed" else None

        return await eventually(completed, timeout=60, message=f"result of {intent.tool}")

    return [result(i) for i in intents]


async def test_an_isolated_tool_finds_no_credentials_to_use(
    hs: Settings, locked_redis: RedisServer
) -> None:
    async with serving(hs) as (store, bus):
        (seen,) = await run_tools(store, bus, [
            ("snoop", {"host": "127.0.0.1", "port": locked_redis.port})])
    assert seen.ok, seen
    out = seen.output
    # Only what the tool declares (LC_CTYPE is set by Python itself: PEP 538 coercion of the
    # C locale an empty environment implies).
    assert {k: v for k, v in out["env"].items() if k != "LC_CTYPE"} == {"ALLOWED": "declared"}
    assert not any(PASSWORD in str(v) for v in (out["env"], out["argv"], out["fds"]))
    assert not any("redis://" in a or "nats://" in a for a in out["argv"])
    # stdin, stdout (and the answer's copy), stderr, the event loop's own AF_UNIX pair:
    # no network socket of the worker's (Redis, NATS, HTTP) came along.
    assert not any("AF_INET" in target for target in out["fds"].values()), out["fds"]
    assert all(t.startswith(("pipe:", "anon_inode:", "gone:")) or t.endswith("AF_UNIX")
               for t in out["fds"].values()), out["fds"]
    assert out["ping"].startswith("-NOAUTH"), out["ping"]  # the worker's Redis, unreachable
    assert PASSWORD not in out["settings_redis"]


async def test_crashes_hangs_and_memory_blowups_end_only_their_attempt(hs: Settings) -> None:
    async with serving(hs) as (store, bus):
        hogged, hung, crashed, bailed = await run_tools(store, bus, [
            ("hog", {}), ("hang", {}), ("segfault", {}), ("bail", {})])
        after, by_hand = await run_tools(store, bus, [("greet", {"text": "still serving"}),
                                                      ("shout", {"text": "hi"})])

    assert (hogged.outcome, hogged.error_code) == ("error", "tool_memory_limit")
    assert "64 MB" in (hogged.error or "")
    assert (hung.outcome, hung.error_code) == ("error", "tool_timeout")
    assert "wall time" in (hung.error or "")
    assert (crashed.outcome, crashed.error_code) == ("error", "tool_crashed")
    assert "SIGSEGV" in (crashed.error or "")
    assert (bailed.outcome, bailed.error_code) == ("error", "tool_crashed")
    assert "status 1" in (bailed.error or "") and "bailing out" in (bailed.error or "")
    assert after.ok and after.output == {"greeting": "hello still serving"}
    assert by_hand.ok and by_hand.output == "HI"


def test_isolation_options_are_checked_where_the_tool_is_declared() -> None:
    with pytest.raises(ConfigError, match="need isolation='process'"):
        tool(memory_mb=64)(plain)
    with pytest.raises(ConfigError, match="need isolation='process'"):
        tool(network=True)(plain)
    with pytest.raises(ConfigError, match="network is True or False"):
        tool(isolation="process", network="yes")(plain)  # type: ignore[arg-type]

    def local() -> None:
        @tool(isolation="process")
        async def nested(args: Nothing, ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match="importable by module path"):
        local()


async def plain(args: Nothing, ctx: Any) -> None:
    return None


# ---------------------------------------------------------------- one child against the others
# Each of these passed the attack before children were confined (python -I in a fresh
# directory, their own PID, mount and network namespaces and uid, non-dumpable). Against a
# Hands that is not root (`hands` param "unprivileged"), the attacks of the three below and of
# the secure dev credentials' test succeeded until its children got user namespaces.


def _processes() -> dict[int, tuple[bytes, bytes]]:
    """Every process this (root) test can see: its argv and environment, as /proc has them."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue  # gone meanwhile
            found[int(entry)] = (cmdline, environ)
    return found


def _exists(path: str | Path) -> bool:
    return os.path.exists(path)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended: only its exit status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


async def test_a_module_a_tool_plants_in_its_directory_reaches_no_later_child(
    hs: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's own directory is where an unconfined child started (and so what its
    # sys.path began with): a scratch one, so that a planted module harms nothing else.
    monkeypatch.chdir(tmp_path)
    hostile = "raise SystemExit('planted by an earlier tool')\n"
    async with serving(hs) as (store, bus):
        (planted,) = await run_tools(store, bus, [
            ("plant", {"name": "orjson", "source": hostile})])
        after, again = await run_tools(store, bus, [("greet", {"text": "next"}),
                                                    ("shout", {"text": "hi"})])
    assert planted.ok and planted.output["wrote"], planted
    assert after.ok and after.output == {"greeting": "hello next"}, after
    assert again.ok and again.output == "HI", again
    # It wrote into a directory of its own, removed when it ended: not the worker's.
    assert planted.output["cwd"] != str(tmp_path)
    assert not _exists(planted.output["cwd"]) and not _exists(tmp_path / "orjson.py")


async def test_a_child_cannot_read_another_childs_environment(
    hs: Settings, hands: Serving
) -> None:
    async with hands(hs) as (store, bus):
        (held,) = await start_tools(store, bus, [("holder", {})])
        holding = asyncio.ensure_future(held)

        def holder_pid() -> int | None:
            for pid, (cmdline, environ) in _processes().items():
                if HELD_SECRET.encode() in environ and b"baton.hands.isolated" in cmdline \
                        and not cmdline.split(b"\0")[0].endswith(b"unshare"):
                    return pid if _catches(pid, signal.SIGUSR1) else None
            return None

        pid = await eventually(holder_pid, timeout=60, message="the holder, ready")
        try:
            (read,) = await run_tools(store, bus, [("reader", {"pid": pid})])
        finally:
            os.kill(pid, signal.SIGUSR1)
        released = await holding
    assert read.ok, read
    assert read.ok and not read.truncated, read
    assert read.output["leaked"] == [], read.output
    assert HELD_SECRET not in read.output["given"], read.output
    # Nor does it see the holder, or any process but itself.
    assert read.output["listed"] == [read.output["self"]], read.output
    assert read.output["dumpable"] == 0
    assert released.ok and released.output == "released", released


async def test_a_setsid_grandchild_dies_with_its_tool_at_the_wall_time(
    hs: Settings, hands: Serving
) -> None:
    marker = "grandchild-" + uuid.uuid4().hex
    async with hands(hs) as (store, bus):
        (escaped,) = await start_tools(store, bus, [("escape", {"marker": marker})])
        running = asyncio.ensure_future(escaped)

        def grandchild() -> int | None:
            return next((pid for pid, (cmdline, _) in _processes().items()
                         if marker.encode() in cmdline.split(b"\0")), None)

        pid = await eventually(grandchild, timeout=60, message="the grandchild, started")
        try:
            result = await running
            assert (result.outcome, result.error_code) == ("error", "tool_timeout"), result
            await eventually(lambda: not _alive(pid), timeout=30,
                             message=f"the grandchild {pid} killed with its tool")
        finally:
            if _alive(pid):  # escaped: end it here, not at the end of the machine
                os.kill(pid, signal.SIGKILL)


async def test_only_a_tool_that_declares_network_reaches_the_network(
    hs: Settings, hands: Serving
) -> None:
    accepted = 0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with hands(hs) as (store, bus):
            cut_off, declared = await run_tools(store, bus, [
                ("dial", {"host": "127.0.0.1", "port": port}),
                ("dial_out", {"host": "127.0.0.1", "port": port})])
    finally:
        server.close()
        await server.wait_closed()
    assert cut_off.ok and cut_off.output.startswith("refused"), cut_off
    assert declared.ok and declared.output == "connected", declared
    assert accepted == 1


def _secure_home() -> tuple[Path, list[Path]]:
    """A `baton dev up --secure` stack's home as it writes it (its secrets 0600), in a directory
    any user may enter, with a file any user may read; owned by the Hands that is not root
    (for the one that is root, what a user of its own owns)."""
    home = Path(tempfile.mkdtemp(prefix="baton-home-"))
    home.chmod(0o755)
    (home / "tls").mkdir(mode=0o700)
    files = {home / "credentials.json": (json.dumps({"admin": PASSWORD}), 0o600),
             home / "tls" / "server.key": ("-----BEGIN PRIVATE KEY-----", 0o600),
             home / "dev.json": (json.dumps({"base_dir": str(home)}), 0o644)}
    for path, (text, mode) in files.items():
        path.write_text(text)
        path.chmod(mode)
    for path in (home, home / "tls", *files):
        os.chown(path, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    return home, list(files)


async def test_a_child_cannot_read_the_secure_dev_credentials(
    hs: Settings, hands: Serving, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, files = _secure_home()
    monkeypatch.setenv("BATON_HOME", str(home))
    try:
        async with hands(hs) as (store, bus):
            # Unmounting what covers them first: root of its own user namespace could.
            (peeked,) = await run_tools(store, bus, [
                ("peek", {"paths": [str(p) for p in files], "unmount": [str(home)]})])
    finally:
        shutil.rmtree(home)
    assert peeked.ok, peeked
    assert all(seen.startswith("refused") for seen in peeked.output.values()), peeked.output


async def test_without_namespaces_children_still_start_isolated_in_a_fresh_directory(
    hs: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a Hands that is not root gets (a Kubernetes pod without capabilities): the reason
    # is logged, and children still run `python -I` in a directory of their own.
    degraded = isolation.Confinement("", False, "the Hands is not root: (this test)")
    monkeypatch.setattr(isolation, "confinement", lambda: degraded)
    monkeypatch.chdir(tmp_path)
    with capture_logs() as logs:
        isolation.harden_worker()
    assert {"event": "tool_isolation_degraded", "reason": degraded.missing,
            "namespaces": "none", "log_level": "warning"} in logs
    async with serving(hs) as (store, bus):
        (planted,) = await run_tools(store, bus, [
            ("plant", {"name": "orjson", "source": "raise SystemExit('planted')\n"})])
        (after,) = await run_tools(store, bus, [("greet", {"text": "next"})])
    assert planted.ok and planted.output["cwd"] != str(tmp_path), planted
    assert after.ok and after.output == {"greeting": "hello next"}, after
