"""A cancel seen at a lease renewal stops a long call of the task it concerns (the task, an
ancestor, or every task), and no other; a schedule starts with none seen."""

from __future__ import annotations

import asyncio

import pytest

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
    assert not watch.concerns(OTHER, TASKS) and not watch.changed.is_set()


async def test_a_call_is_stopped_by_a_cancel_of_its_task_and_not_by_another() -> None:
    watch = CancelWatch()
    stopped = asyncio.Event()

    async def answer_never() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "never"

    async def answer_soon(gate: asyncio.Event) -> str:
        await gate.wait()
        return "answer"

    call = asyncio.ensure_future(interruptible(answer_never(), CHILD, TASKS, watch))
    await asyncio.sleep(0)  # the call runs
    watch.saw(frozenset({"root"}))
    with pytest.raises(Interrupted):
        await call
    assert stopped.is_set()  # the call itself was cancelled

    watch.reset()
    gate = asyncio.Event()
    call = asyncio.ensure_future(interruptible(answer_soon(gate), CHILD, TASKS, watch))
    await asyncio.sleep(0)
    watch.saw(frozenset({"other"}))  # another task's cancel: the call goes on
    await asyncio.sleep(0)
    gate.set()
    assert await call == "answer"
    assert await interruptible(answer_soon(gate), CHILD, TASKS, None) == "answer"
