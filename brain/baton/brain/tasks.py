"""Custom durable tasks: the public API.

An application declares a task kind as phases; each phase is an async function that looks at
the task and its context and returns the next :class:`Step`. Everything a phase does (child
tasks, tool runs, document writes, the task's next state, timers) is committed in ONE commit
with that step; nothing is written while the phase runs::

    from baton.brain.tasks import PhaseContext, Step, TaskDef

    batch = TaskDef("notice-batch", start="plan")

    @batch.phase("plan")
    async def plan(task: Task, ctx: PhaseContext) -> Step:
        ids = [ctx.spawn("send-notice", {"to": to}) for to in task.input["recipients"]]
        return Step.wait(ids, policy="allSettled", then="summarise", children=ids)

    @batch.phase("summarise")
    async def summarise(task: Task, ctx: PhaseContext) -> Step:
        results = ctx.results(ctx.data["children"])
        return Step.complete({"sent": sum(r.ok for r in results.values())})

    app = App(agents=[...], tools=[...], tasks=[batch, send_notice])

A phase may run more than once: a worker that dies inside it (or a phase that raises) leaves
the task ``running``, and the next Brain runs the phase again; after
``Settings.restart_limit`` such runs in a row the task ends ``failed`` with the reason. So a
phase must be safe to repeat: it decides, and the commit makes the decision durable. Ids
that a phase creates (``spawn``, ``call_tool``) are derived from the task, the phase visit
and their position, so a repeated run creates the same ids.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from baton.brain.phases import PRIVATE, ChildResult, PhaseContext
from baton.errors import ConfigError
from baton.models import Task, WaitPolicy, is_task_kind
from baton.store.documents import DocumentType

__all__ = ["ChildResult", "DocumentType", "PhaseContext", "Step", "TaskDef"]

StepKind = Literal["goto", "wait", "sleep", "complete", "fail"]
Phase = Callable[[Task, PhaseContext], Awaitable["Step"]]
Migrate = Callable[[Task], Task]


@dataclass(frozen=True)
class Step:
    """What a phase decided: the task's next state. Build it with the constructors."""

    kind: StepKind
    phase: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    ids: tuple[str, ...] = ()
    policy: WaitPolicy = "allSettled"
    until_ms: int | None = None
    seconds: float | None = None
    result: Any = None
    reason: str = ""

    @classmethod
    def goto(cls, phase: str, **data: Any) -> Step:
        """Run ``phase`` next, at once (committed as ``running``); ``data`` joins ctx.data."""
        return cls("goto", phase=_phase_name("Step.goto", phase), data=_data("Step.goto", data))

    @classmethod
    def wait(
        cls, ids: list[str] | tuple[str, ...], policy: WaitPolicy = "allSettled", *,
        then: str, **data: Any,
    ) -> Step:
        """Wait for child tasks and/or tool runs, then run ``then``.

        ``allSettled``: until every child is terminal and every run completed. ``failFast``:
        also as soon as one of them failed (the phase's decision then aborts the others).
        """
        if policy not in ("allSettled", "failFast"):
            raise ConfigError(f"unknown wait policy {policy!r}")
        if isinstance(ids, str):  # tuple("run-1") would wait for "r", "u", "n", ...
            raise ConfigError(f"Step.wait takes a list of ids, not the string {ids!r}: "
                              f"Step.wait([{ids!r}], then=...)")
        if not all(isinstance(i, str) and i for i in ids):
            raise ConfigError(f"Step.wait ids must be the ids ctx.spawn and ctx.call_tool "
                              f"returned, not {list(ids)!r}")
        return cls("wait", phase=_phase_name("Step.wait", then), ids=tuple(ids), policy=policy,
                   data=_data("Step.wait", data))

    @classmethod
    def sleep(
        cls, *, until_ms: int | None = None, seconds: float | None = None, then: str,
        **data: Any,
    ) -> Step:
        """Sleep until a time (a durable timer wakes the session), then run ``then``.

        ``until_ms`` is a Unix time in milliseconds (a time past wakes at once); ``seconds``
        is a duration from the commit, zero or more."""
        if (until_ms is None) == (seconds is None):
            raise ConfigError("Step.sleep needs exactly one of until_ms and seconds")
        if until_ms is not None and (isinstance(until_ms, bool) or not isinstance(until_ms, int)
                                     or until_ms < 0):
            raise ConfigError(f"Step.sleep until_ms must be a Unix time in whole milliseconds, "
                              f"not {until_ms!r}")
        if seconds is not None and (isinstance(seconds, bool)
                                    or not isinstance(seconds, int | float)
                                    or not math.isfinite(seconds) or seconds < 0):
            raise ConfigError(f"Step.sleep seconds must be a finite number >= 0, not {seconds!r}")
        return cls("sleep", phase=_phase_name("Step.sleep", then), until_ms=until_ms,
                   seconds=seconds, data=_data("Step.sleep", data))

    @classmethod
    def complete(cls, result: Any = None) -> Step:
        """The task succeeded with ``result`` (JSON)."""
        return cls("complete", result=result)

    @classmethod
    def fail(cls, reason: str) -> Step:
        """The task failed; live children it owns are aborted."""
        if not isinstance(reason, str):
            raise ConfigError(f"Step.fail takes a reason as text, not {reason!r}")
        return cls("fail", reason=reason)


def _data(where: str, data: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint data a step adds: keys starting with ``_`` are Baton's own (a phase never
    sees them, and one of the same name would change how Baton ends the task)."""
    private = sorted(k for k in data if k.startswith(PRIVATE))
    if private:
        raise ConfigError(f"{where}: data keys starting with {PRIVATE!r} are Baton's own, "
                          f"rename {', '.join(private)}")
    return data


def _phase_name(where: str, phase: object) -> str:
    if not isinstance(phase, str) or not phase:
        raise ConfigError(f"{where} names the next phase by its name (a non-empty string), "
                          f"not {phase!r}")
    return phase


class TaskDef:
    """A task kind: its version, its phases by name, the first phase, an optional migration.

    ``migrate(task) -> task`` upgrades a task saved by an older version of this definition;
    it runs before the task's next phase and its result is committed with the phase's
    ``running`` mark.
    """

    def __init__(
        self, kind: str, version: int = 1, start: str = "start", migrate: Migrate | None = None
    ) -> None:
        if not is_task_kind(kind):
            raise ConfigError(f"invalid task kind {kind!r}")
        if version < 1:
            raise ConfigError(f"task {kind}: version must be >= 1")
        self.kind = kind
        self.version = version
        self.start = start
        self.migrate = migrate
        self.phases: dict[str, Phase] = {}

    def phase(self, name: str) -> Callable[[Phase], Phase]:
        """Decorator registering ``async def phase(task, ctx) -> Step`` under ``name``."""

        def register(fn: Phase) -> Phase:
            if name in self.phases:
                raise ConfigError(f"task {self.kind}: phase {name!r} declared twice")
            self.phases[name] = fn
            return fn

        return register

    def check(self) -> None:
        if self.start not in self.phases:
            raise ConfigError(f"task {self.kind}: no start phase {self.start!r}")

    def __repr__(self) -> str:
        return f"TaskDef({self.kind!r}, version={self.version}, phases={list(self.phases)})"
