"""A generation's model attempts: their derived request ids and what each one cost and how
it ended (saved in receipts and checkpoints)."""

from __future__ import annotations

from typing import Any

from baton.brain.model import ModelResponse
from baton.models import Task

__all__ = ["attempt_record", "next_attempt", "request_id_of"]


def request_id_of(task: Task) -> str:
    """Derived, never random: ``<task id>:<turn>:<attempt>``."""
    data = task.checkpoint.data
    return f"{task.id}:{int(data.get('turn', 1))}:{int(data.get('attempt', 0))}"


def next_attempt(data: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint data of the request's next attempt (its retry wait over)."""
    out = {k: v for k, v in data.items() if k != "until_ms"}
    out["attempt"] = int(data.get("attempt", 0)) + 1
    return out


def attempt_record(
    task: Task, request_id: str, *, response: ModelResponse | None = None,
    error: Exception | None = None,
) -> dict[str, Any]:
    """What one model attempt cost and how it ended: saved in receipts and checkpoints."""
    usage = response.usage if response else getattr(error, "usage", None)
    out: dict[str, Any] = {
        "request_id": request_id,
        "attempt": int(task.checkpoint.data.get("attempt", 0)),
        "usage": usage.model_dump() if usage else {"input_tokens": 0, "output_tokens": 0},
    }
    if response is not None and response.provider_request_id:
        out["provider_request_id"] = response.provider_request_id
    if error is not None:
        out["error"] = str(error)[:500]
        if getattr(error, "status", None):
            out["status"] = error.status  # type: ignore[attr-defined]
    return out
