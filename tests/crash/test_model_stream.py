"""A Brain SIGKILLed while a real model client streams its answer (over HTTP, from
tests.model_server): another Brain takes over, shows the saved partial text to the model as
an interrupted entry (never as a response: no tool ran from it) and issues the request
again as the next attempt of the same derived request id.

Topologies: every test runs on one Redis server;
test_brain_killed_mid_stream_resumes_with_the_partial_as_interrupted (openai wire) also runs
on a 3+6 Redis Cluster (DevStack(cluster=True)), the file's representative case (a cluster
stack takes seconds to start; the suite's time allows one per file).
"""

from __future__ import annotations

import signal

import pytest

from baton.receipts import Receipt
from tests.crash.conftest import Opener
from tests.helpers import eventually
from tests.model_server import Behaviour, ModelServer

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

PREAMBLE = ("I will now send the approved notice to each of the five recipients, one e-mail "
            "per recipient, and then summarise the outcome for each of them. ")


@pytest.mark.parametrize(("wire", "topology"),
                         [("openai", "single"), ("anthropic", "single"), ("openai", "cluster")])
async def test_brain_killed_mid_stream_resumes_with_the_partial_as_interrupted(
    crash: Opener, wire: str, topology: str
) -> None:
    async with ModelServer() as server:
        server.script(Behaviour(preamble=PREAMBLE, chunk_delay_s=0.2))  # about 5 s of text
        env = {
            "openai": {"BATON_OPENAI_BASE_URL": server.openai_url,
                       "BATON_OPENAI_API_KEY": server.key},
            "anthropic": {"BATON_ANTHROPIC_BASE_URL": server.anthropic_url,
                          "BATON_ANTHROPIC_API_KEY": server.key},
        }[wire]
        c = await crash(brains=1, hands=2, relays=1, app_spec=f"tests.model_apps:{wire}_app",
                        env={**env, "BATON_MODEL_PARTIAL_INTERVAL_MS": "50"})
        sub = await c.submit()

        async def streaming() -> list[Receipt]:
            return await c.receipts(sub.session_id, "partial")
        partials = await eventually(streaming, timeout=20, message="a partial receipt")
        c.stack.kill("brain-1", respawn=False)  # mid-stream: the answer is still coming
        assert await c.stack.wait_exit("brain-1") == -signal.SIGKILL
        saved = await c.store.partial(sub.session_id)
        assert saved is not None and saved.text and PREAMBLE.startswith(saved.text)
        assert saved.request_id == f"{sub.task_id}:1:0" == partials[0].detail.request_id
        assert len(saved.text) < len(PREAMBLE)  # killed before the answer was complete

        await c.stack.spawn("brain", "brain-2")
        final = await c.settle(sub)

    entries = await c.check_interrupted_transcript(final, saved.text)
    assert len(entries[2].tool_calls) == 5
    # The takeover's re-entry commit turned the partial into the interrupted entry.
    reenter = next(r for r in await c.receipts(sub.session_id, "commit")
                   if getattr(r.detail, "step", None) == "reenter")
    assert reenter.worker is not None and reenter.worker.name == "brain-2"
    assert reenter.detail.interrupted == f"{sub.task_id}:1:0"
    # Same derived id prefix, next attempt; the model saw the cut-off text as interrupted.
    ids = [r.request_id for r in server.requests]
    assert ids == [f"{sub.task_id}:1:0", f"{sub.task_id}:1:1", f"{sub.task_id}:2:0"], ids
    again = server.requests[1].body["messages"]
    if wire == "openai":
        assert again[2] == {"role": "assistant", "content": saved.text}
        assert again[3]["role"] == "user" and "interrupted" in again[3]["content"]
    else:
        assert again[1] == {"role": "assistant", "content": [{"type": "text",
                                                              "text": saved.text}]}
        assert "interrupted" in again[2]["content"][0]["text"]
    await c.check_exactly_once(raw_requests=5)
    assert await c.store.partial(sub.session_id) is None
