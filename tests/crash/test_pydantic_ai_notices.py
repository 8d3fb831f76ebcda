"""The five notices as a PydanticAI agent (baton.examples.pydantic_notices), SIGKILLed where
it hurts: Hands right after the fourth mail was delivered (its reply never saved), and a
Brain after the tool results completed or during the model call; and the same agent on
PydanticAI's OpenAI model (against tests.model_server) with its Brain killed mid-stream.
Another replica carries on, completed tool results are reused, and every recipient gets
exactly one mail.
"""

from __future__ import annotations

import signal

import pytest

from baton.receipts import Receipt
from tests.crash.conftest import Opener
from tests.crash.test_fault_points import ONE_AT_A_TIME, Case
from tests.crash.test_model_stream import PREAMBLE
from tests.helpers import eventually
from tests.model_server import Behaviour, ModelServer

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

APP = "baton.examples.pydantic_notices:app"

CASES = [
    Case("hands.after_effect", "hands", 4, "mail 4 delivered, its reply never saved",
         fates=(("margaret@example.com", "confirmed after recovery"),)),
    Case("brain.after_wake", "brain", 2, "tool results completed, not yet applied"),
    Case("brain.during_model", "brain", 1, "the first model call is running"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.point for c in CASES])
async def test_pydantic_ai_agent_killed_sends_each_mail_once(crash: Opener, case: Case) -> None:
    counts = {"brains": 1, "hands": 1, "relays": 1}
    counts[{"brain": "brains", "hands": "hands"}[case.role]] = 0
    c = await crash(app_spec=APP, **counts)
    sub, armed, clean = await c.run_armed(case.role, case.spec, env=ONE_AT_A_TIME,
                                          fates=dict(case.fates))
    runs = await c.runs(sub.session_id)
    if case.role == "hands":
        fourth = runs[3]
        assert fourth.worker == clean.name and fourth.result is not None
        assert fourth.result.recovery == "confirmed", fourth.result
    else:
        # Every tool result was produced once, by the first attempt, and reused after the
        # takeover (none executed again).
        assert all(r.result and r.result.recovery == "none" and r.attempt == 1 for r in runs)
        takeovers = await c.receipts(sub.session_id, "takeover")
        assert takeovers and takeovers[0].detail.previous_holder == armed.name, takeovers


async def test_brain_killed_mid_stream_over_the_openai_wire(crash: Opener) -> None:
    """PydanticAI's own OpenAI client streams from tests.model_server; the Brain is SIGKILLed
    mid-answer. The next Brain records the saved text as interrupted, PydanticAI shows it to
    the model as a cut-off assistant message, and the notices still go out once each."""
    async with ModelServer() as server:
        server.script(Behaviour(preamble=PREAMBLE, chunk_delay_s=0.2))  # about 5 s of text
        c = await crash(brains=1, hands=1, relays=1, app_spec="tests.pydantic_ai_openai_app:app",
                        env={"BATON_OPENAI_BASE_URL": server.openai_url,
                             "BATON_OPENAI_API_KEY": server.key,
                             "BATON_MODEL_PARTIAL_INTERVAL_MS": "50"})
        sub = await c.submit()

        async def streaming() -> list[Receipt]:
            return await c.receipts(sub.session_id, "partial")

        await eventually(streaming, timeout=30, message="a partial receipt")
        c.stack.kill("brain-1", respawn=False)  # mid-stream: the answer is still coming
        assert await c.stack.wait_exit("brain-1") == -signal.SIGKILL
        saved = await c.store.partial(sub.session_id)
        assert saved is not None and saved.text and PREAMBLE.startswith(saved.text)
        assert len(saved.text) < len(PREAMBLE)

        await c.stack.spawn("brain", "brain-2")
        final = await c.settle(sub)
        again = server.requests[1].body["messages"]

    await c.check_interrupted_transcript(final, saved.text)
    cut = next(i for i, m in enumerate(again) if m["role"] == "assistant")
    assert again[cut]["content"] == saved.text and not again[cut].get("tool_calls")
    assert again[cut + 1]["role"] == "user" and "interrupted" in again[cut + 1]["content"]
    await c.check_exactly_once(raw_requests=5)
    assert await c.store.partial(sub.session_id) is None
