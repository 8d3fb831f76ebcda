"""Apps whose notices agent uses a real model client, pointed at tests.model_server.

Loaded in-process or by Brain/Hands processes as ``tests.model_apps:<name>``; the server's
address and key come from the environment (BATON_OPENAI_BASE_URL / BATON_ANTHROPIC_BASE_URL
and the keys), like any deployment's.
"""

from __future__ import annotations

from baton.app import Agent, App
from baton.hands.tools import send_email

__all__ = ["ANTHROPIC_MODEL", "OPENAI_MODEL", "anthropic_app", "openai_app"]

OPENAI_MODEL = "openai-compatible:test-model"
ANTHROPIC_MODEL = "anthropic:claude-test"
INSTRUCTIONS = ("You send an approved notice to each customer named in the request, one e-mail "
                "per recipient, then summarise the outcome for each recipient.")


def _app(model: str) -> App:
    agent = Agent(name="notices", compat=1, model=model, tools=("send_email",),
                  instructions=INSTRUCTIONS)
    return App(agents=[agent], tools=[send_email])


openai_app = _app(OPENAI_MODEL)
anthropic_app = _app(ANTHROPIC_MODEL)
