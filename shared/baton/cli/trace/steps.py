"""What a Brain's commit says in a session's timeline (:mod:`baton.cli.trace`): its step in
words, the flags that draw a person's eye, and the model call it recorded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from baton.cli.trace.model import Event, ModelAttempt
from baton.receipts import CommitDetail

__all__ = ["commit_text", "gated_runs", "model_attempt"]


def commit_text(d: CommitDetail, changes: Mapping[str, Any],
                short: Callable[[str], str]) -> tuple[str, list[str]]:
    """The commit's step in words, and its flags; ``changes``: the receipt's change counts
    (what an unnamed step says), ``short``: a run id's label in this timeline."""
    step, runs = d.step, list(d.runs)
    if step in ("tools", "redispatch"):
        gated = gated_runs(d, changes)
        if step == "redispatch":
            what = "RE-DISPATCHED (no progress)"
        elif not gated:
            what = "dispatched"
        elif gated == len(runs):
            what = "awaiting approval"
        else:  # which ones the receipt does not say: their approvals will
            what = f"saved ({len(runs) - gated} dispatched, {gated} awaiting approval)"
        text = f"{len(runs)} tool run(s) {what}: {', '.join(short(x) for x in runs)}"
        return text, ["retry"] if step == "redispatch" else []
    if step == "decisions":
        parts = [*(f"{short(x)} approved, dispatched" for x in d.approved),
                 *(f"{short(x)} rejected, ended" for x in d.rejected)]
        return "decisions carried out: " + ("; ".join(parts) or "none left to carry out"), []
    if step == "retry":
        return "", ["retry"]
    if step == "resume":
        return f"retry wait over: next model attempt {d.request_id}", []
    if step == "reenter":
        return f"phase re-entered after a worker died in it (crash {d.crashes})", ["retry"]
    if step == "prepare":
        return f"generation started (turn {d.turn or 1})", []
    if step == "cancel":
        return (f"CANCEL carried out: cancel_requested on {len(d.targets)} "
                f"task(s), {len(runs)} tool run(s) told to stop"), ["cancel"]
    if step == "migrate":
        return (f"MIGRATED the session from compat {d.compat_from} to {d.compat_to}; "
                + (", ".join(f"{t} v{a}->v{b}" for t, (a, b) in d.migrated.items())
                   or "no task needed a migrate")), ["version"]
    if step == "blocked":
        return "; ".join([*(f"BLOCKED task {t}: {why}" for t, why in d.blocked.items()),
                          *(f"task {t} no longer blocked" for t in d.cleared)]), ["version"]
    if step == "final":
        text = f"final: task {d.outcome or '?'}"
        return (text + f" ({d.reason})" if d.reason else text), []
    return f"{step}: " + (", ".join(f"{k} {v}" for k, v in changes.items())
                          or "no changes"), []


def gated_runs(d: CommitDetail, changes: Mapping[str, Any]) -> int:
    """How many of a ``tools`` commit's new runs wait for a person's approval: the runs it
    saved without an outbox row (a gated run gets its row from the commit that carries the
    approval out, baton.brain.decisions). 0 when the receipt does not count its runs."""
    if d.step != "tools" or "runs" not in changes:
        return 0
    return max(int(changes["runs"]) - int(changes.get("outbox", 0)), 0)


def model_attempt(ev: Event, d: CommitDetail) -> ModelAttempt:
    """The model call a commit (``tools``, ``final`` or ``retry``) recorded: how it ended,
    the wait before the next attempt, the usage."""
    failed = bool(d.error)
    if d.step == "retry":
        outcome = "retry" if d.until_ms else "failed"
    elif failed:
        outcome = "failed"
    else:
        outcome = "tool calls" if d.step == "tools" else "answered"
    usage = d.usage
    return ModelAttempt(
        event=ev.index, t_ms=ev.t_ms, task_id=d.task_id, request_id=d.request_id,
        attempt=d.attempt,
        status=str(d.status) if d.status is not None else ("error" if failed else "ok"),
        error=d.error, wait_ms=d.retry_in_ms if d.step == "retry" and d.until_ms else None,
        input_tokens=usage.input_tokens if usage else 0,
        output_tokens=usage.output_tokens if usage else 0,
        provider_request_id=d.provider_request_id, outcome=outcome)
