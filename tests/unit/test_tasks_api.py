"""Pure parts of custom tasks: Step constructors, JSON merge patch, document changes, the
registry's choice of handler."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from baton.brain.custom import CustomTask
from baton.brain.phases import child_id
from baton.brain.registry import Registry
from baton.brain.tasks import DocumentType, Step, TaskDef
from baton.errors import ConfigError, ValidationError
from baton.models import Document, Task
from baton.store.documents import merge_diff, merge_patch, next_change


def test_step_constructors() -> None:
    assert Step.goto("b", x=1) == Step("goto", phase="b", data={"x": 1})
    wait = Step.wait(["a", "b"], "failFast", then="c")
    assert wait.ids == ("a", "b") and wait.policy == "failFast" and wait.phase == "c"
    assert Step.sleep(seconds=1.5, then="d").seconds == 1.5
    assert Step.complete({"ok": True}).result == {"ok": True}
    assert Step.fail("no").reason == "no"
    with pytest.raises(ConfigError):
        Step.sleep(then="d")
    with pytest.raises(ConfigError):
        Step.sleep(seconds=1, until_ms=5, then="d")
    with pytest.raises(ConfigError):
        Step.wait(["a"], "anyOf", then="c")  # type: ignore[arg-type]
    # One id given as a string would be waited for as its characters.
    with pytest.raises(ConfigError, match=r"Step.wait\(\['run-1'\]"):
        Step.wait("run-1", then="c")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ids must be the ids"):
        Step.wait(["a", None], then="c")  # type: ignore[list-item]
    # Refused when the step is made, not when the Brain applies it.
    assert Step.sleep(seconds=0, then="d").seconds == 0
    assert Step.sleep(until_ms=1, then="d").until_ms == 1
    for bad in (-5, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ConfigError, match="seconds must be a finite number"):
            Step.sleep(seconds=bad, then="d")  # type: ignore[arg-type]
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="until_ms must be"):
            Step.sleep(until_ms=bad, then="d")  # type: ignore[arg-type]
    for make in (lambda p: Step.goto(p), lambda p: Step.wait(["a"], then=p),
                 lambda p: Step.sleep(seconds=1, then=p)):
        for bad in (3, "", None):
            with pytest.raises(ConfigError, match="names the next phase"):
                make(bad)
    for make in (lambda: Step.goto("b", _cancelled=1), lambda: Step.wait(["a"], then="c", _x=1),
                 lambda: Step.sleep(seconds=1, then="d", _y=2, ok=3)):
        with pytest.raises(ConfigError, match="are Baton's own, rename _"):
            make()
    with pytest.raises(ConfigError, match="reason as text"):
        Step.fail(ValueError("x"))  # type: ignore[arg-type]


def test_merge_patch_follows_rfc_7386() -> None:
    # Examples from RFC 7386, appendix A.
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": "b", "b": "c"}, {"a": None}) == {"b": "c"}
    assert merge_patch({"a": ["b"]}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch([1, 2], {"a": "b", "c": None}) == {"a": "b"}
    assert merge_patch({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}


@pytest.mark.parametrize("old,new", [
    ({"a": 1, "b": {"c": [1, 2], "d": "x"}}, {"a": 2, "b": {"c": [1, 2, 3]}, "e": True}),
    ({"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 1, "d": 2}}}),
    ({"a": 1}, {}),
])
def test_merge_diff_round_trips(old: dict, new: dict) -> None:
    assert merge_patch(old, merge_diff(old, new)) == new


def test_document_changes_are_deltas_between_baselines() -> None:
    doc = None
    modes = []
    for n in range(1, 35):
        change = next_change(doc, "d", {"n": n, "same": "x"}, n, every=16)
        modes.append(change.mode)
        doc = change.document
    assert [v for v, m in enumerate(modes, 1) if m == "b"] == [1, 17, 33]
    delta = next_change(doc, "d", {"n": 99, "same": "x"}, 0, every=16)
    assert delta.mode == "d" and '"patch":{"n":99}' in delta.payload
    # A null member cannot travel in a merge patch: that version is stored in full.
    nulled = next_change(doc, "d", {"n": None, "same": "x"}, 0, every=16)
    assert nulled.mode == "b" and nulled.document.value == {"n": None, "same": "x"}


def test_typed_documents_validate() -> None:
    class Plan(BaseModel):
        recipients: list[str]

    kind = DocumentType("plan", Plan)
    assert kind.dump(Plan(recipients=["a"])) == {"recipients": ["a"]}
    assert kind.dump({"recipients": ["b"]}) == {"recipients": ["b"]}
    with pytest.raises(ValidationError, match="invalid document plan: recipients"):
        kind.dump({"recipients": "nope"})
    with pytest.raises(ConfigError):
        DocumentType("Bad Name", Plan)
    for bad in (dict, Plan(recipients=[]), "Plan"):
        with pytest.raises(ConfigError, match="must be a pydantic model class"):
            DocumentType("plan", bad)  # type: ignore[arg-type]
    assert Document(name="plan").version == 1


def test_registry_picks_handlers_by_kind_and_version() -> None:
    def defn(version: int, migrate: bool = False) -> TaskDef:
        d = TaskDef("job", version=version, migrate=(lambda t: t) if migrate else None)
        d.phase("start")(_noop)
        return d

    def task(version: int) -> Task:
        return Task(id="t", kind="job", version=version, owner="s")

    reg = Registry([defn(1), defn(3, migrate=True)])
    assert reg.kinds() == {"generation": [1], "job": [1, 3]}
    assert reg.get(task(1)).version == 1  # its own version is still known
    assert reg.get(task(2)).version == 3  # migrated by the newest
    assert reg.get(task(4)) is None  # newer than anything known: left alone
    assert reg.get(Task(id="x", kind="unknown", owner="s")) is None
    assert reg.get(Task(id="g", kind="generation", owner="s")) is reg.generation
    assert isinstance(reg.get(task(3)), CustomTask)
    assert Registry([defn(2)]).get(task(1)) is None  # no migration: not runnable
    with pytest.raises(ConfigError, match="twice"):
        Registry([defn(1), defn(1)])
    with pytest.raises(ConfigError, match="no start phase"):
        Registry([TaskDef("empty")])


def test_child_ids_are_derived_from_parent_visit_and_position() -> None:
    assert child_id("leaf", "p", 1, 0) == child_id("leaf", "p", 1, 0)
    assert len({child_id("leaf", "p", s, i) for s in range(3) for i in range(3)}) == 9
    assert child_id("leaf", "p", 0, 0).startswith("leaf-")


async def _noop(task: Task, ctx: object) -> Step:
    return Step.complete()
