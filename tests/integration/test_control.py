"""Approvals and cancellation with Brain, Hands and Relay in one event loop (real servers).

Approvals: an approval-gated tool's runs wait, unsent, until a person approves their exact
arguments; a wrong digest is refused and dispatches nothing; the right one dispatches once;
a second approval is refused. Cancellation: idempotent answers, a run never claimed is
cancelled by the Brain's commit, the submission settles cancelled.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from baton.app import Agent, App
from baton.brain.model import ModelRequest, ModelResponse
from baton.brain.worker import BrainWorker
from baton.cli.inspect import session_view
from baton.cli.trace import build_trace, render_text
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.errors import ConflictError, NotFoundError, WaitTimeout
from baton.hands.worker import HandsWorker
from baton.models import ToolCall
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.control import args_digest
from tests.control_apps import approval_app, slow_app
from tests.helpers import eventually, running

TWO = "Send the approved notice to ada@example.com and grace@example.com, then summarise."


async def _stats(mailbox: MailboxServer) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return dict((await http.get(f"{mailbox.url}/stats")).json())


async def test_approval_bound_to_arguments_dispatches_once(
    settings: Settings, mailbox: MailboxServer
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), approval_app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), approval_app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain), Client.connect(settings) as client:
        try:
            sub, _ = await client.submit(TWO, agent="notices")
            sid = sub.session_id

            async def awaiting() -> list[Any]:
                runs = (await client.store.load(sid)).runs.values()
                found = [r for r in runs if r.status == "awaiting_approval"]
                return found if len(found) == 2 else []
            runs = sorted(await eventually(awaiting, timeout=10), key=lambda r: r.run_id)
            # The public listing: what to approve, bound to which digest
            listed = await client.awaiting_approval(sid)
            assert sorted((a.run_id, a.tool, a.digest, a.arguments["to"]) for a in listed) == [
                (r.run_id, "send_email", r.intent.approval_digest, r.intent.arguments["to"])
                for r in runs]
            with pytest.raises(NotFoundError):
                await client.awaiting_approval("s-no-such-session")
            # a wait that ends first says what the session waits for (it asked whether a
            # Brain was running)
            with pytest.raises(WaitTimeout, match=r"2 tool run\(s\) await a decision"):
                await client.wait(sub, timeout=0.2)
            view = await session_view(client.store, sid)
            assert [a["run_id"] for a in view["awaiting_approval"]] == [r.run_id for r in runs]
            ada, grace = runs
            assert ada.intent.approval_digest == args_digest("send_email", ada.intent.arguments)
            assert view["awaiting_approval"][0]["arguments"] == ada.intent.arguments
            # Rendered narrow (output to a pipe): each approve command whole, to be copied.
            from rich.console import Console

            from baton.cli.inspect import render_session

            console = Console(width=60, record=True)
            render_session(view, console)
            shown = console.export_text().splitlines()
            for r in runs:
                assert (f"  baton approve {sid} --run {r.run_id} --args-digest "
                        f"{r.intent.approval_digest}") in shown

            # An approval for other arguments (grace's digest on ada's run) is refused.
            with pytest.raises(ConflictError, match="does not match"):
                await client.approve(sid, ada.run_id, grace.intent.approval_digest or "")
            assert (await client.store.runs.get(sid, ada.run_id)).status == "awaiting_approval"
            assert (await _stats(mailbox))["raw_requests"] == 0  # nothing dispatched

            await client.approve(sid, ada.run_id, ada.intent.approval_digest or "")
            with pytest.raises(ConflictError, match="approved already"):
                await client.approve(sid, ada.run_id, ada.intent.approval_digest or "")
            await eventually(lambda: _delivered(mailbox, "ada@example.com"), timeout=10)
            assert (await client.store.runs.get(sid, grace.run_id)).status == "awaiting_approval"
            await client.reject(sid, grace.run_id, "not this one")
            final = await client.wait(sub, timeout=15)
            # When, as a person reads it (it was the store's milliseconds).
            with pytest.raises(ConflictError, match=r"approved already \(at 20\d\d-\d\d-\d\dT"
                                                    r"\d\d:\d\d:\d\dZ\) and has ended"):
                await client.approve(sid, ada.run_id, ada.intent.approval_digest or "")
            receipts = await client.store.receipts(sid)
        finally:
            await client.close()
    assert final.status == "completed", final
    assert "ada@example.com: sent" in (final.answer or "")
    assert "grace@example.com: failed (rejected)" in (final.answer or "")
    stats = await _stats(mailbox)
    assert stats["deliveries"] == {"ada@example.com": 1} and stats["raw_requests"] == 1
    kinds = [r.kind for r in receipts]
    assert kinds.count("approve") == 1 and kinds.count("reject") == 1
    assert any(r.kind == "refused" and getattr(r.detail, "op", None) == "approve" for r in receipts)
    text = render_text(build_trace(sid, receipts))
    assert "APPROVED" in text and "REJECTED" in text and "REFUSED approval" in text


async def _delivered(mailbox: MailboxServer, to: str) -> bool:
    return (await _stats(mailbox))["deliveries"].get(to) == 1


async def test_cancel_before_claim_and_idempotent_answers(
    settings: Settings, mailbox: MailboxServer
) -> None:
    """No Hands: the runs are never claimed, so the Brain's commit cancels them itself."""
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), slow_app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, brain):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit(TWO, agent="notices")
            sid = sub.session_id

            async def dispatched() -> bool:
                return len((await client.store.load(sid)).runs) == 2
            await eventually(dispatched, timeout=10)
            first = await client.cancel(sid, reason="changed my mind")
            again = await client.cancel(sid)
            final = await client.wait(sub, timeout=10)
            after = await client.cancel(sid)
            task = await client.store.inbox.task(sid, sub.task_id)
            runs = await client.store.runs.applied(sid)
            view = await session_view(client.store, sid)
            text = render_text(build_trace(sid, await client.store.receipts(sid)))
        finally:
            await client.close()
    assert "CANCEL requested for the session" in text and "CANCEL carried out" in text
    assert first.status == "requested" and again.status == "pending"
    assert after.status == "finished"
    assert final.status == "cancelled", final
    assert task.state.name == "terminal" and task.state.outcome == "cancelled"
    assert task.state.reason == "changed my mind"  # the client's reason, on a generation too
    assert len(runs) == 2 and all(r.result and r.result.outcome == "cancelled"
                                  for r in runs.values())
    assert all(r.attempt == 0 for r in runs.values())  # never claimed
    assert view["tasks"][0]["outcome"] == "cancelled"
    assert (await _stats(mailbox))["raw_requests"] == 0


class _BadArgsModel:
    """Asks for one approval-gated mail with arguments that cannot run, then answers."""

    async def generate(self, request: ModelRequest) -> ModelResponse:
        results = [e for e in request.entries if e.kind == "tool_result"]
        if results:
            return ModelResponse(text=f"could not: {results[0].text}")
        return ModelResponse(tool_calls=(ToolCall(
            id="c1", name="send_email", arguments={"to": "nobody", "subject": "x"}),))


async def test_a_gated_call_whose_arguments_cannot_run_never_awaits_a_person(
    settings: Settings, mailbox: MailboxServer
) -> None:
    """Its arguments are checked before a person is asked: the model sees why at once (it
    was approved first, then failed as invalid_arguments)."""
    app = App(agents=[Agent(name="gated", model="bad-args", tools=("send_email",))],
              tools=list(approval_app.tools.values()), models={"bad-args": _BadArgsModel()})
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, brain):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit("mail nobody", agent="gated")
            final = await client.wait(sub, timeout=20)
            state = await client.store.load(sub.session_id)
        finally:
            await client.close()
    assert final.status == "completed", final
    assert state.runs == {} and state.decisions == {}  # nothing awaited a person
    result = next(e for e in state.entries if e.kind == "tool_result")
    assert result.is_error and "invalid_arguments" in result.text
    assert "invalid arguments for send_email: to: String should match pattern" in result.text
    assert "body: Field required" in result.text
