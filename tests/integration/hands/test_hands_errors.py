"""The Hands worker: errors are results the model sees, and a message that does not match its
run never touches it."""

from __future__ import annotations

import gzip

import pytest

from baton.bus.bus import Bus
from baton.devkit.mailbox import MailboxServer
from baton.errors import ConfigError, ToolMismatchError
from baton.hands import HandsWorker
from baton.models import ToolDispatch
from baton.settings import Settings
from baton.store.deadletter import dead_letters
from baton.store.store import Store
from tests.integration.hands_app import (
    APP,
    HOOKS,
    OTHER_HANDS,
    commit_runs,
    dispatch,
    make_intent,
    new_id,
    outbox_rows,
    result_of,
    running,
    settled,
)
from tests.raw_http_server import Answer, raw_server

# ---------------------------------------------------------------- errors are results


async def test_errors_become_results_and_the_worker_keeps_serving(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    invalid = make_intent(bus, session, "send_email", {"to": "not-an-address"}, group="g")
    raising = make_intent(bus, session, "boom", {}, group="g")
    timing_out = make_intent(bus, session, "slow", {}, group="g")
    huge = make_intent(bus, session, "big", {}, group="g")
    after = make_intent(bus, session, "echo", {"text": "still here"}, group="g")
    everything = [invalid, raising, timing_out, huge, after]
    unknown = make_intent(bus, session, "ghost", {})  # a run for a tool no app declares
    await commit_runs(store, bus, session, [*everything, unknown],
                      groups={"g": len(everything)})
    async with running(hs):
        await bus.publish(bus.tool_subject("echo"), b"{not json", msg_id="garbage")
        await bus.publish(bus.tool_subject("echo"), b'{"v": 9, "session_id": "s"}', msg_id="v9")
        for intent in (invalid, raising, timing_out, huge):
            await dispatch(bus, intent)
        # A message naming a tool this app does not declare, on a served tool's subject.
        await dispatch(bus, unknown, subject_tool="echo")
        ghost_run = ToolDispatch(session_id=session, run_id="no-such-run", tool="echo")
        await bus.publish(bus.tool_subject("echo"), ghost_run.to_json().encode(), msg_id="gone")
        results = {i.run_id: await result_of(store, i) for i in everything[:-1]}
        await dispatch(bus, after)
        last = await result_of(store, after)
        await settled(bus, "send_email", "echo", "boom", "slow", "big")

    codes = {i.tool: (results[i.run_id].outcome, results[i.run_id].error_code)
             for i in everything[:-1]}
    assert codes == {
        "send_email": ("error", "invalid_arguments"),
        "boom": ("error", "tool_exception"),
        "slow": ("error", "timeout"),
        "big": ("ok", None),
    }
    assert "to" in (results[invalid.run_id].error or "")
    assert "kaboom" in (results[raising.run_id].error or "")
    truncated = results[huge.run_id]
    assert truncated.truncated and "[truncated" in truncated.output
    assert len(truncated.output) < 1200
    assert last.ok and last.output == {"echo": "still here"}
    assert mailbox.raw_requests == 0
    # Error results wake the Brain at once; the group's last completion wakes it too.
    wakes = [r.data for r in await outbox_rows(store, session) if '"tool:' in r.data]
    for intent in (invalid, raising, timing_out, after):
        assert any(intent.run_id in w for w in wakes), intent.tool
    assert not any(huge.run_id in w for w in wakes)
    ghost = await store.runs.get(session, unknown.run_id)  # misaddressed: never claimed
    assert ghost is not None and ghost.status == "dispatched" and ghost.attempt == 0
    reasons = sorted(d["reason"] for d in await dead_letters(store.redis, store.keys))
    assert len(reasons) == 4 and "unknown run" in reasons
    assert any("malformed" in r or "invalid ToolDispatch" in r for r in reasons)
    assert any("tool mismatch" in r and "ghost" in r for r in reasons)


async def test_a_tool_that_exits_or_interrupts_is_a_result_and_the_worker_serves_on(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    """SystemExit and KeyboardInterrupt from a tool left the event loop: the Hands ended,
    and each redelivery of the run ended the next one; another BaseException (GeneratorExit)
    escaped the result, and each redelivery ran the tool again."""
    session = new_id("s")
    runs = [make_intent(bus, session, "quits", {"text": how})
            for how in ("exit", "interrupt", "generator")]
    after = make_intent(bus, session, "echo", {"text": "still here"})
    await commit_runs(store, bus, session, [*runs, after])
    async with running(hs):
        for intent in runs:
            await dispatch(bus, intent)
        results = [await result_of(store, i) for i in runs]
        await dispatch(bus, after)
        assert (await result_of(store, after)).output == {"echo": "still here"}
    assert [(r.outcome, r.error_code, r.attempt) for r in results] == [
        ("error", "tool_exception", 1)] * 3
    assert "the tool raised SystemExit: 3" in (results[0].error or "")
    assert "the tool raised KeyboardInterrupt" in (results[1].error or "")
    assert "the tool raised GeneratorExit" in (results[2].error or "")


async def test_a_tool_message_on_another_tools_subject_never_touches_the_run(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    """The attack: a real send_email run's message re-addressed to http_get's subject."""
    session = new_id("s")
    mail = make_intent(bus, session, "send_email",
                       {"to": "c@example.com", "subject": "Notice", "body": "Hello"})
    await commit_runs(store, bus, session, [mail])
    forged = ToolDispatch(session_id=session, run_id=mail.run_id, tool="send_email")
    relabelled = ToolDispatch(session_id=session, run_id=mail.run_id, tool="http_get")
    async with running(hs, tools=["http_get"]):
        # The message names send_email but came on http_get's subject.
        await bus.publish(bus.tool_subject("http_get"), forged.to_json().encode(),
                          msg_id="forged")
        # Subject and message agree on http_get; the committed intent says send_email:
        # claim.lua refuses before any write.
        await bus.publish(bus.tool_subject("http_get"), relabelled.to_json().encode(),
                          msg_id="relabelled")
        await settled(bus, "http_get")

    run = await store.runs.get(session, mail.run_id)
    assert run is not None and run.status == "dispatched" and run.attempt == 0
    assert run.accepted_ms is None and run.result is None
    assert not [r for r in await store.receipts(session) if r.kind in ("claim", "reclaim")]
    letters = await dead_letters(store.redis, store.keys)
    reasons = {d["payload"]: d["reason"] for d in letters}
    assert "subject" in reasons[forged.to_json()] and "http_get" in reasons[forged.to_json()]
    committed = reasons[relabelled.to_json()]
    assert "tool mismatch" in committed and "'send_email'" in committed
    assert all(d["subject"] == bus.tool_subject("http_get") for d in letters)
    with pytest.raises(ToolMismatchError) as refused:  # the script's own check, directly
        await store.runs.claim(session, mail.run_id, OTHER_HANDS, tool="http_get")
    assert refused.value.committed == "send_email"

    async with running(hs, tools=["send_email"]):  # the real run is executed, once
        await dispatch(bus, mail)
        result = await result_of(store, mail)
        await settled(bus, "send_email")
    assert result.ok and result.attempt == 1 and result.output["status"] == "delivered"
    assert mailbox.raw_requests == 1 and len(mailbox.operations) == 1


async def test_a_hostile_server_ends_a_tool_call_as_a_coded_result(
    hs: Settings, store: Store, bus: Bus
) -> None:
    """What a tool's shared HTTP client refuses (hands.http) is the run's result, the
    message the model reads: a gzip bomb, a drip past the request's deadline, a reset."""
    bomb = gzip.compress(bytes(2**22), mtime=0)

    def script(head: bytes, n: int) -> Answer:
        path = head.split(b" ")[1].split(b"?")[0]
        if path == b"/bomb":
            return Answer(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d"
                          b"\r\n\r\n%s" % (len(bomb), bomb))
        if path == b"/drip":
            return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", drip=b"x")
        return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nxx", then="reset")

    bounded = hs.model_copy(update={"tool_http_max_bytes": 64 * 1024,
                                    "tool_http_deadline_s": 0.5})
    session = new_id("s")
    async with raw_server(script) as raw:
        runs = {path: make_intent(bus, session, "gate", {}) for path in ("bomb", "drip", "reset")}
        for path, intent in runs.items():
            HOOKS[intent.run_id] = lambda ctx, path=path: ctx.http.get(f"{raw.url}/{path}?k=s")
        fetch = make_intent(bus, session, "http_get", {"url": f"{raw.url}/bomb"})
        await commit_runs(store, bus, session, [*runs.values(), fetch])
        async with running(bounded, tools=["gate", "http_get"]):
            for intent in [*runs.values(), fetch]:
                await dispatch(bus, intent)
            results = {path: await result_of(store, intent) for path, intent in runs.items()}
            fetched = await result_of(store, fetch)
            await settled(bus, "gate", "http_get")
    codes = {path: (r.outcome, r.error_code, r.attempt) for path, r in results.items()}
    assert codes == {"bomb": ("error", "response_too_large", 1),
                     "drip": ("error", "request_deadline", 1),
                     "reset": ("error", "http_error", 1)}
    assert f"GET {raw.url}/bomb: the response's decoded body is larger than the 65536 " in (
        results["bomb"].error or "")
    assert "deadline of 0.5 s" in (results["drip"].error or "")
    assert f"GET {raw.url}/reset failed: " in (results["reset"].error or "")
    assert not any("k=s" in (r.error or "") for r in results.values())  # no query shown
    # http_get (a safe tool) returns the bound's own result, not a retry or its own wrap
    assert (fetched.outcome, fetched.error_code, fetched.attempt) == (
        "error", "response_too_large", 1)


def test_serving_an_undeclared_tool_is_a_config_error(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="nope"):
        HandsWorker(settings, APP, ["echo", "nope"])
