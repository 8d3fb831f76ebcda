"""Custom-task apps for the task tests (in-process, and ``tests.task_apps:app`` for processes).

* ``fanout``: spawns one ``leaf`` per item of ``input["leaves"]``, waits with
  ``input["policy"]``, then completes with the children's outcomes, or fails on a failure.
* ``leaf``: fails, sleeps (a durable timer), or calls ``echo`` and completes with its output.
* ``sleeper``: sleeps ``input["seconds"]`` and completes with the time it woke.
* ``eager``: completes at once while the child it started still sleeps.
* ``raiser``: its phase raises every time.
* ``writer``: writes the typed "counter" document ``input["times"]`` times (one phase visit
  per version), or an invalid value when ``input["invalid"]``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from baton.app import Agent, App, ToolContext, tool
from baton.brain.tasks import DocumentType, PhaseContext, Step, TaskDef
from baton.models import Task


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


@tool(replay="safe")
async def echo(args: EchoArgs, ctx: ToolContext) -> dict[str, Any]:
    """Return the text."""
    return {"echo": args.text}


class Counter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    history: list[int] = []


fanout = TaskDef("fanout", start="spawn")


@fanout.phase("spawn")
async def _spawn(task: Task, ctx: PhaseContext) -> Step:
    ids = [ctx.spawn("leaf", leaf) for leaf in task.input["leaves"]]
    return Step.wait(ids, policy=task.input.get("policy", "allSettled"), then="gather",
                     children=ids)


@fanout.phase("gather")
async def _gather(task: Task, ctx: PhaseContext) -> Step:
    results = ctx.results(ctx.data["children"])
    failed = [r.reason for r in results.values() if not r.ok]
    if failed:
        return Step.fail(f"a leaf failed: {failed[0]}")
    return Step.complete({i: r.result for i, r in results.items()})  # type: ignore[union-attr]


leaf = TaskDef("leaf", start="start")


@leaf.phase("start")
async def _leaf(task: Task, ctx: PhaseContext) -> Step:
    if task.input.get("fail"):
        return Step.fail("asked to fail")
    if task.input.get("sleep_s"):
        return Step.sleep(seconds=task.input["sleep_s"], then="woke")
    run = ctx.call_tool("echo", {"text": task.input.get("text", "hi")})
    return Step.wait([run], then="echoed", run=run)


@leaf.phase("echoed")
async def _echoed(task: Task, ctx: PhaseContext) -> Step:
    result = ctx.results([ctx.data["run"]])[ctx.data["run"]]
    return Step.complete(result.output)  # type: ignore[union-attr]


@leaf.phase("woke")
async def _woke(task: Task, ctx: PhaseContext) -> Step:
    return Step.complete({"woke_ms": ctx.now})


sleeper = TaskDef("sleeper", start="start")


@sleeper.phase("start")
async def _sleep(task: Task, ctx: PhaseContext) -> Step:
    return Step.sleep(seconds=task.input["seconds"], then="woke", slept_at=ctx.now)


@sleeper.phase("woke")
async def _sleeper_woke(task: Task, ctx: PhaseContext) -> Step:
    return Step.complete({"slept_at": ctx.data["slept_at"], "woke_ms": ctx.now})


eager = TaskDef("eager", start="start")


@eager.phase("start")
async def _eager(task: Task, ctx: PhaseContext) -> Step:
    """Decides its result at once, while the child it started still sleeps."""
    ctx.spawn("leaf", {"sleep_s": task.input["child_sleep_s"]})
    return Step.complete({"decided_ms": ctx.now})


raiser = TaskDef("raiser", start="start")


@raiser.phase("start")
async def _raise(task: Task, ctx: PhaseContext) -> Step:
    raise RuntimeError("this phase always breaks")


writer = TaskDef("writer", start="write")


@writer.phase("write")
async def _write(task: Task, ctx: PhaseContext) -> Step:
    if task.input.get("invalid"):
        ctx.write_document("counter", {"n": "not a number"})
        return Step.complete()
    current: Counter | None = ctx.document("counter")
    n = current.n + 1 if current else 1
    history = [*(current.history if current else []), n][-5:]
    ctx.write_document("counter", Counter(n=n, history=history))
    if n < task.input["times"]:
        return Step.goto("write")
    return Step.complete({"n": n})


waiter = TaskDef("waiter", start="start")


@waiter.phase("start")
async def _wait_start(task: Task, ctx: PhaseContext) -> Step:
    """Waits on the ids it is given, or on a child of its own twice (the second time after
    its result was read and consumed)."""
    if "ids" in task.input:
        return Step.wait(task.input["ids"], then="done")
    child = ctx.spawn("leaf", {"text": "once"})
    return Step.wait([child], then="again", child=child)


@waiter.phase("again")
async def _wait_again(task: Task, ctx: PhaseContext) -> Step:
    read = ctx.results([ctx.data["child"]])
    return Step.wait([ctx.data["child"]], then="done", read=len(read))


@waiter.phase("done")
async def _wait_done(task: Task, ctx: PhaseContext) -> Step:
    return Step.complete({"read": ctx.data.get("read")})


spinner = TaskDef("spinner", start="spin")


@spinner.phase("spin")
async def _spin(task: Task, ctx: PhaseContext) -> Step:
    """Never waits: goes from phase to phase until cancelled."""
    return Step.goto("spin", n=ctx.data.get("n", 0) + 1)


meddler = TaskDef("meddler", start="start")


@meddler.phase("start")
async def _meddle(task: Task, ctx: PhaseContext) -> Step:
    ctx.data["_cancelled"] = "by me"  # Baton's own key: refused, not silently dropped
    return Step.goto("start")


AGENT = "tasks"
app = App(
    agents=[Agent(name=AGENT, tools=("echo",))],
    tools=[echo],
    tasks=[fanout, leaf, sleeper, eager, raiser, writer, waiter, spinner, meddler],
    documents=[DocumentType("counter", Counter)],
)

__all__ = ["AGENT", "Counter", "app", "only_tasks"]

# An app of tasks alone: no tool, so `baton dev up` starts no Hands for it.
only_tasks = App(agents=[Agent(name="batch")], tools=[], tasks=[leaf])
