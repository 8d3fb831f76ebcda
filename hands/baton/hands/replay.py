"""The replay policy: what a Hands worker does with a run whose earlier attempt left no result.

Pure logic, no I/O. An attempt that ended without a result (its worker died, hung or lost
its connection) may or may not have acted on the outside world. The tool's declared replay
policy decides the run's fate (DESIGN 4.6):

    saved  current  confirm_fn  ->  action
    safe   safe     -               reexecute        (reading twice is harmless)
    confirm safe|confirm  yes       confirm          (ask the outside system by operation id)
    anything else                   interrupt        (unsafe, or the policy got weaker)

Both the policy saved with the intent and the policy of the code running now must allow a
replay: a tool whose policy became weaker since the intent was saved is not replayed.

A run whose recovery would act again (reexecute, or confirm and maybe execute) on the last
delivery JetStream allows ends ``fail`` instead: a tool that kills its worker every time must
not go on to kill every worker. Interrupting acts on nothing, so it is never turned into a
failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from baton.models import ReplayPolicy

Action = Literal["execute", "reexecute", "confirm", "interrupt", "fail"]

__all__ = ["Action", "ReplayDecision", "decide"]


@dataclass(frozen=True, slots=True)
class ReplayDecision:
    """What to do with a claimed attempt, and why (the reason is shown to the model)."""

    action: Action
    reason: str = ""

    @property
    def acts(self) -> bool:
        """True when the decision may run the tool's effect."""
        return self.action in ("execute", "reexecute", "confirm")


def decide(
    *,
    recovering: bool,
    saved: ReplayPolicy,
    current: ReplayPolicy,
    has_confirm: bool,
    delivery: int,
    max_deliver: int,
) -> ReplayDecision:
    """Decide the fate of a claimed attempt.

    ``recovering``: an earlier attempt ended without a result. ``saved``: the policy stored
    with the intent; ``current``: the policy of the tool as loaded now. ``delivery``: this
    message's delivery count (1 first), ``max_deliver``: the consumer's limit.
    """
    if not recovering:
        return ReplayDecision("execute")
    if saved == "safe" and current == "safe":
        decision = ReplayDecision("reexecute", "safe to replay: executing again")
    elif saved == "confirm" and current != "unsafe" and has_confirm:
        decision = ReplayDecision("confirm", "confirming the earlier attempt by its operation id")
    else:
        if saved == "confirm" and current != "unsafe":  # so: no confirm function
            why = "the tool has no confirm function"
        elif saved == current:
            why = f"the tool's replay policy is {current!r}"
        else:
            why = f"the replay policy changed from {saved!r} to {current!r}"
        return ReplayDecision(
            "interrupt",
            f"an earlier attempt ended without a result and the tool is not safe to replay "
            f"({why}); it may or may not have taken effect",
        )
    if delivery >= max_deliver:
        return ReplayDecision(
            "fail",
            f"{delivery} deliveries without a result (max_deliver {max_deliver}): "
            f"not executing again",
        )
    return decision
