"""The entries a generation writes for the model to read: tool results (run, refused) and
text an attempt streamed before it was cut off."""

from __future__ import annotations

from baton.brain.context import TaskContext
from baton.models import Entry, Task, ToolCall, ToolResult, ToolRun, dumps

__all__ = ["interrupted_entry", "refusal_entry", "result_entry", "result_text"]


def result_text(result: ToolResult) -> str:
    """How a tool result appears to the model: its JSON, with the recovery it went through."""
    return dumps(
        {
            "outcome": result.outcome,
            "recovery": result.recovery,
            "output": result.output,
            "error_code": result.error_code,
            "error": result.error,
        }
    )


def result_entry(task: Task, run: ToolRun, ctx: TaskContext) -> Entry:
    """A completed run's result, as the model reads it on its next turn."""
    result = run.result
    assert result is not None
    return Entry(kind="tool_result", text=result_text(result), run_id=run.run_id,
                 tool_call_id=run.intent.tool_call_id, tool_name=run.intent.tool,
                 is_error=not result.ok, task_id=task.id,
                 submission_id=task.submission_id, ts_ms=ctx.now())


def refusal_entry(task: Task, call: ToolCall, ctx: TaskContext, code: str = "unknown_tool",
                  error: str = "") -> Entry:
    """A call that is not run: the model sees why on its next turn."""
    result = ToolResult(outcome="error", error_code=code,
                        error=error or f"tool {call.name!r} is not available to this agent")
    return Entry(kind="tool_result", text=result_text(result), tool_call_id=call.id,
                 tool_name=call.name, is_error=True, task_id=task.id,
                 submission_id=task.submission_id, ts_ms=ctx.now())


def interrupted_entry(task: Task, text: str, ctx: TaskContext) -> Entry:
    """Text streamed by an attempt that produced no response: never a response itself."""
    return Entry(kind="interrupted", text=text, task_id=task.id,
                 submission_id=task.submission_id, ts_ms=ctx.now())
