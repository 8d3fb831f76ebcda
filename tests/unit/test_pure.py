"""Pure logic: settings, fault specs, write-sets, wire decoding, the scripted model."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError as PydanticValidationError

from baton.brain.model import ModelRequest
from baton.brain.scripted import ScriptedModel
from baton.errors import ConfigError, ValidationError
from baton.faults import Faults
from baton.models import Entry, SessionMeta, ToolCall, ToolDispatch, Wake, decode
from baton.settings import Settings
from baton.store.writes import Writes


def test_settings_from_env_are_typed_and_frozen() -> None:
    s = Settings.from_env({"BATON_LEASE_MS": "1200", "BATON_NAMESPACE": "prod"})
    assert s.lease_ms == 1200 and s.namespace == "prod"
    with pytest.raises(PydanticValidationError, match="frozen"):
        s.lease_ms = 5  # type: ignore[misc]
    with pytest.raises(ConfigError, match="BATON_LEASE_MS"):
        Settings.from_env({"BATON_LEASE_MS": "soon"})
    assert Settings.from_env(s.to_env()) == s


def test_fault_specs() -> None:
    assert not Faults("")
    f = Faults("hands.after_effect@3, relay.after_publish")
    assert f
    f.hit("brain.during_model")  # not armed: nothing happens
    with pytest.raises(ValueError, match="unknown fault point"):
        Faults("hands.nowhere")


def test_wire_messages_reject_unknown_schema_and_fields() -> None:
    ok = decode(Wake, b'{"v":1,"session_id":"s1","reason":"submit"}')
    assert ok.session_id == "s1"
    with pytest.raises(ValidationError, match="v"):
        decode(Wake, b'{"v":2,"session_id":"s1"}')
    with pytest.raises(ValidationError, match="Extra inputs"):
        decode(ToolDispatch, b'{"v":1,"session_id":"s","run_id":"r","tool":"t","x":1}')
    with pytest.raises(ValidationError):
        decode(ToolDispatch, b"not json")


def test_write_set_serialises_for_the_commit_script() -> None:
    w = Writes(entries=[Entry(kind="model", text="hi")], applied=["r1"], deadline_ms=-1)
    args = w.to_script()
    index, receipt = json.loads(args[0]), json.loads(args[1])
    assert index["a"] == ["r1"] and index["dl"] == -1 and index["ne"] == 1
    assert json.loads(args[2])["text"] == "hi" and len(args) == 3
    assert receipt["marks"] == [{"run_id": "r1", "mark": "applied", "attempt": 0}]
    assert not Writes()


async def test_scripted_model_sends_one_mail_per_address_then_summarises() -> None:
    model = ScriptedModel()
    tools = ({"name": "send_email"},)
    user = Entry(kind="user", text="Notify a@x.io, b@y.io and a@x.io again.")
    first = await model.generate(ModelRequest(model="scripted", entries=(user,), tools=tools,
                                              request_id="t:1:0"))
    assert [c.arguments["to"] for c in first.tool_calls] == ["a@x.io", "b@y.io"]
    calls = (ToolCall(id="call_0", name="send_email", arguments={"to": "a@x.io"}),
             ToolCall(id="call_1", name="send_email", arguments={"to": "b@y.io"}))
    entries = (
        user,
        Entry(kind="model", tool_calls=calls),
        Entry(kind="tool_result", tool_call_id="call_0",
              text=json.dumps({"outcome": "ok", "recovery": "confirmed"})),
        Entry(kind="tool_result", tool_call_id="call_1", is_error=True,
              text=json.dumps({"outcome": "interrupted", "recovery": "interrupted"})),
    )
    second = await model.generate(ModelRequest(model="scripted", entries=entries, tools=tools,
                                               request_id="t:2:0"))
    assert not second.tool_calls
    assert "a@x.io: confirmed after recovery" in second.text
    assert "b@y.io: interrupted" in second.text


def test_model_copy_is_pydantics_shallow_copy() -> None:
    """Model.model_copy's fast path gives what pydantic's own gives: the same fields and
    fields set, frozen, the original untouched; a deep copy still goes pydantic's way."""
    from pydantic import BaseModel

    meta = SessionMeta(session_id="s", agent="a", compat=1, wake_subject="w", groups={"g": 2})
    update = {"seq": 3, "dirty": True, "groups": {"g": 1}}
    fast, slow = meta.model_copy(update=update), BaseModel.model_copy(meta, update=update)
    assert fast == slow and fast.model_fields_set == slow.model_fields_set
    assert fast.to_json() == slow.to_json()
    assert meta.seq == 0 and meta.groups == {"g": 2} and meta.model_fields_set == {
        "session_id", "agent", "compat", "wake_subject", "groups"}
    plain = meta.model_copy()
    assert plain == meta and plain.__dict__ is not meta.__dict__
    with pytest.raises(PydanticValidationError):
        fast.seq = 4  # type: ignore[misc]
    deep = meta.model_copy(deep=True)
    assert deep == meta and deep.groups is not meta.groups


def test_brain_only_fields_in_the_runs_hash_are_dropped() -> None:
    """A field of the Hands' runs hash whose last dotted part is one the Brain alone writes
    (or that is such a name bare) never reaches the merged state; look-alikes stay."""
    from baton.store.state import with_intents

    runs = {k: "1" for k in (
        "r.intent", "intent", "cancel", "x.y.cancel", "a.digest", "r.approved", "grp:g",
        "r.status", "x.cancelled", "r.intent.x", "rintent", "approved.r", "r.")}
    assert sorted(with_intents(runs, {})) == [
        "approved.r", "r.", "r.intent.x", "r.status", "rintent", "x.cancelled"]


def test_baton_dev_hints_a_first_command_the_app_answers() -> None:
    import json
    import shlex

    from baton.devkit.dev import _first_submit

    assert shlex.split(_first_submit("baton.examples.notices:app"))[:3] == [
        "baton", "submit", "--wait"]
    # The notice-batch app's agent only hosts its task: the hint starts the task.
    words = shlex.split(_first_submit("baton.examples.notice_batch:app"))
    assert words[:4] == ["baton", "start", "notice-batch", "--wait"]
    task_input = json.loads(words[words.index("--input") + 1])
    assert set(task_input) == {"recipients", "subject", "body"} and task_input["recipients"]


def test_a_detached_start_that_failed_names_the_worker_and_why_first() -> None:
    from baton.devkit.dev import start_failure

    log = "\n".join(["error: hands-2 not ready within 30s; end of hands-2.log:",
                     *(f"  traceback line {i}" for i in range(40))])
    said = start_failure(log)
    assert said.splitlines()[0] == (
        "the stack did not start: hands-2 not ready within 30s; end of hands-2.log:")
    assert said.splitlines()[-1] == "  traceback line 39" and len(said.splitlines()) == 31
    assert start_failure("boom").splitlines() == ["the stack did not start", "boom"]


def test_a_tool_output_json_cannot_carry_keeps_its_structure() -> None:
    """Only the values JSON has no form for become their text; dates stay dates (ISO)."""
    import datetime

    import orjson

    from baton.hands.execute import ToolExecution, json_with_text
    from baton.models import ToolResult
    from baton.settings import Settings

    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    when = datetime.datetime(2026, 12, 3, 7, 50, tzinfo=datetime.UTC)
    output = {"when": when, "obj": Thing(), "n": [1, {2: "two"}]}
    assert orjson.loads(json_with_text(output)) == {
        "when": "2026-12-03T07:50:00+00:00", "obj": "<thing>", "n": [1, {"2": "two"}]}
    execution = ToolExecution(Settings(), {}, None, None, None)  # type: ignore[arg-type]
    limited = execution.limit(ToolResult(outcome="ok", output=output))
    assert limited.output["obj"] == "<thing>" and limited.output["when"].startswith("2026-12-03")
    assert not limited.truncated


def test_a_tool_output_of_models_and_non_finite_numbers_is_its_json() -> None:
    """A pydantic model returned as is is its data (was its repr() string); NaN and
    infinities become null, as orjson writes them, and the output says so too."""
    from pydantic import BaseModel

    from baton.hands.execute import ToolExecution, json_with_text
    from baton.models import ToolResult
    from baton.settings import Settings

    class Reserved(BaseModel):
        sku: str
        qty: int

    execution = ToolExecution(Settings(), {}, None, None, None)  # type: ignore[arg-type]
    for output, want in (
        (Reserved(sku="A", qty=2), {"sku": "A", "qty": 2}),
        ({"items": [Reserved(sku="B", qty=1)], "left": 3}, {"items": [{"sku": "B", "qty": 1}],
                                                            "left": 3}),
        ({"x": float("nan"), "y": [float("inf")], "z": None}, {"x": None, "y": [None],
                                                                "z": None}),
        ({"set": {1}, "m": Reserved(sku="C", qty=0)}, {"set": "{1}",
                                                      "m": {"sku": "C", "qty": 0}}),
    ):
        assert execution.limit(ToolResult(outcome="ok", output=output)).output == want
    assert execution.limit(ToolResult(outcome="ok", output=1.5)).output == 1.5
    assert json_with_text(Reserved(sku="D", qty=4)) == b'{"sku":"D","qty":4}'
