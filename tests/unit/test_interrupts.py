"""A cancel seen at a lease renewal stops a long call of the task it concerns (the task, an
ancestor, or every task), and no other; a schedule starts with none seen."""

from __future__ import annotations

import asyncio
from typing import Any

from baton.brain.interrupts import CancelWatch, Interrupted, interruptible
from baton.models import Task

ROOT = Task(id="root", kind="batch", owner="s")
CHILD = Task(id="child", kind="generation", owner="root", parent="root")
OTHER = Task(id="other", kind="generation", owner="s")
TASKS = {t.id: t for t in (ROOT, CHILD, OTHER)}


def test_a_cancel_concerns_its_target_its_descendants_or_everything() -> None:
    watch = CancelWatch()
    assert not watch.concerns(CHILD, TASKS)
    watch.saw(frozenset({"root"}))
    assert watch.concerns(CHILD, TASKS) and watch.concerns(ROOT, TASKS)
    assert not watch.concerns(OTHER, TASKS)
    watch.saw(frozenset({"*"}))
    assert watch.concerns(OTHER, TASKS)
    watch.reset()  # a schedule took them up
    assert not watch.concerns(OTHER, TASKS)


async def test_a_call_is_stopped_by_a_cancel_of_its_task_and_not_by_another() -> None:
    """The call runs in the pass's task; the renewer (here: this test) tells the watch."""
    watch = CancelWatch()
    started, stopped, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def answer_never() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "never"

    async def answer_when_let(started: asyncio.Event) -> str:
        started.set()
        await gate.wait()
        return "answer"

    async def a_pass(call: Any, task: Task) -> Any:
        try:
            return await interruptible(call, task, TASKS, watch)
        except Interrupted:
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0  # the pass is not cancelled
            return "interrupted"

    one = asyncio.ensure_future(a_pass(answer_never(), CHILD))
    await started.wait()
    watch.saw(frozenset({"root"}))  # a renewal: a cancel of the child's parent
    assert await one == "interrupted" and stopped.is_set()

    watch.reset()
    begun = asyncio.Event()
    two = asyncio.ensure_future(a_pass(answer_when_let(begun), CHILD))
    await begun.wait()
    watch.saw(frozenset({"other"}))  # another task's cancel: the call goes on
    gate.set()
    assert await two == "answer"
    watch.saw(frozenset({"child"}))  # seen before the call starts: it never starts
    assert await a_pass(answer_when_let(asyncio.Event()), CHILD) == "interrupted"
    assert await interruptible(answer_when_let(asyncio.Event()), CHILD, TASKS, None) == "answer"
