"""One agent at three code versions, for the rolling-upgrade test (``tests.version_apps:v1``).

``job`` sends ``input["count"]`` notices to ``input["to"]`` one after another (phases
``send`` -> ``sent`` -> ``send`` ...), then completes with the version of the code that
finished it. Each version's definition says which version it is:

* ``v1``: agent ``upgrade`` at compat 1; ``job`` v1.
* ``v2``: compat 2, takes over compat-1 sessions (``migrates_from=(1,)``); ``job`` v2 with a
  ``migrate`` that records the version it came from; ``extra`` v1, a kind v1 does not know.
* ``v3``: compat 3 (``migrates_from=(2,)``); ``job`` v3 with a ``migrate``.
"""

from __future__ import annotations

from baton.app import Agent, App
from baton.brain.tasks import PhaseContext, Step, TaskDef
from baton.hands.tools import deliver_notice
from baton.models import Task

__all__ = ["AGENT", "v1", "v2", "v3"]

AGENT = "upgrade"


def _job(version: int) -> TaskDef:
    def migrate(task: Task) -> Task:
        return task.model_copy(update={"input": {**task.input, "migrated_from": task.version}})

    job = TaskDef("job", version=version, start="send",
                  migrate=migrate if version > 1 else None)

    @job.phase("send")
    async def send(task: Task, ctx: PhaseContext) -> Step:
        n = int(ctx.data.get("n", 0))
        run = ctx.call_tool("deliver_notice", {
            "to": task.input["to"], "subject": f"part {n + 1}", "body": "Approved.",
            "operation_id": f"{ctx.session_id}:{task.id}:{n}"})
        return Step.wait([run], then="sent", run=run, n=n)

    @job.phase("sent")
    async def sent(task: Task, ctx: PhaseContext) -> Step:
        result = ctx.results([ctx.data["run"]])[ctx.data["run"]]
        if not result.ok:  # type: ignore[union-attr]
            return Step.fail(f"send failed: {result.error}")  # type: ignore[union-attr]
        n = ctx.data["n"] + 1
        if n < int(task.input.get("count", 1)):
            return Step.goto("send", n=n)
        return Step.complete({"finished_by": version, "sent": n,
                              "migrated_from": task.input.get("migrated_from")})

    return job


extra = TaskDef("extra", start="start")


@extra.phase("start")
async def _extra(task: Task, ctx: PhaseContext) -> Step:
    return Step.complete({"finished_by": 2})


def _app(compat: int, migrates_from: tuple[int, ...], *tasks: TaskDef) -> App:
    agent = Agent(name=AGENT, compat=compat, migrates_from=migrates_from,
                  tools=("deliver_notice",))
    return App(agents=[agent], tools=[deliver_notice], tasks=list(tasks))


v1 = _app(1, (), _job(1))
v2 = _app(2, (1,), _job(2), extra)
v3 = _app(3, (2,), _job(3))
