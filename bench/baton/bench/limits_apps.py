"""The notices example with its ``send_email`` tool declared four ways, for ``bench limits``
(:mod:`baton.bench.limits_bench`): the same tool, the same agent, only the tool's fleet-wide
limit differs. Importable by module path, so the Hands and Brains a bench stack starts serve
them (``baton.bench.limits_apps:capped``).

- ``uncapped``: no limit (the Hands never reach the limit code: ``ToolLimit.limited`` is
  false, so ``HandsWorker._process`` runs the claim at once);
- ``loose``: a cap and a rate far above what the bench's load reaches, so every run takes
  and gives back a slot (and an admission) and none ever waits: the cost of the path alone;
- ``capped``: at most :data:`CAP` runs at once across every Hands;
- ``rated``: at most :data:`RATE` starts a second across every Hands (burst 1).
"""

from __future__ import annotations

from typing import Any

from baton import App, Tool
from baton.examples.notices import notices
from baton.hands.tools import send_email

__all__ = ["CAP", "LOOSE_CAP", "LOOSE_RATE", "RATE", "capped", "loose", "rated", "uncapped"]

CAP = 3
RATE = 20.0
#: Never reached: a bench stack's three Hands run at most 3 x 64 sends at once, and a few
#: hundred a second; the burst lets a thousand start at once.
LOOSE_CAP = 10_000
LOOSE_RATE, LOOSE_BURST = 1_000.0, 1_000


def _email(**limit: Any) -> Tool:
    tool = Tool(send_email.fn, name="send_email", replay="confirm", timeout=30.0, **limit)
    assert send_email.confirm_fn is not None
    tool.confirm(send_email.confirm_fn)
    return tool


uncapped = App(agents=[notices], tools=[_email()])
loose = App(agents=[notices], tools=[_email(max_concurrency=LOOSE_CAP, rate=f"{LOOSE_RATE:g}/s",
                                            burst=LOOSE_BURST)])
capped = App(agents=[notices], tools=[_email(max_concurrency=CAP)])
rated = App(agents=[notices], tools=[_email(rate=f"{RATE:g}/s")])
