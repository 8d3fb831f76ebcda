"""A host application's trace runs through Baton: its provider records every hop.

The test process plays an application that has configured OpenTelemetry itself (a global
TracerProvider with an in-memory exporter) and submits the five-notice task inside a span
of its own, as a web handler would. Relay, Brain and Hands run in this process too, so the
one host provider sees all of Baton's spans: they must form one trace rooted at the host's
span, submit -> relay publish -> brain consume -> hands consume/execute -> relay -> brain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.keys import Keys
from tests.helpers import running
from tests.otel_host import Host, host_telemetry

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")


@pytest.fixture
def host() -> Iterator[Host]:
    with host_telemetry("notices-web") as h:
        yield h


def _hex(span_id: int) -> str:
    return f"{span_id:016x}"


def _attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.mark.parametrize("hold_ms", [1_000, 0], ids=["held", "relayed"])
async def test_the_hosts_span_is_the_root_of_one_trace_through_relay_brain_and_hands(
    settings: Settings, mailbox: MailboxServer, host: Host, hold_ms: int
) -> None:
    # held: results reach the Brain that holds the session's lease over Redis; relayed
    # (brain_hold_ms=0, or a hold outlived): they wake the session through the relay.
    settings = settings.model_copy(update={"mail_url": mailbox.url, "brain_hold_ms": hold_ms})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    web = trace.get_tracer("notices-web")
    async with running(relay, hands, brain):
        client = await Client.connect(settings)
        try:
            with web.start_as_current_span("POST /notices", kind=SpanKind.SERVER) as request:
                sub, created = await client.submit(FIVE, agent="notices")
            final = await client.wait(sub, timeout=30)
            receipts = await client.store.receipts(sub.session_id)
        finally:
            await client.close()
    # The services have stopped: every span they opened has ended.
    assert created and final.status == "completed", final

    trace_id = request.get_span_context().trace_id
    spans = [s for s in host.spans.get_finished_spans() if s.context.trace_id == trace_id]
    by_id = {_hex(s.context.span_id): s for s in spans}
    parent: dict[str, Any] = {
        _hex(s.context.span_id): by_id.get(_hex(s.parent.span_id)) if s.parent else None
        for s in spans}

    # One root, the host's span; every other span hangs below it (a connected tree).
    [root] = [s for s in spans if s.parent is None]
    assert root.name == "POST /notices" and root.resource.attributes["service.name"] == (
        "notices-web")
    for s in spans:
        if s is not root:
            assert parent[_hex(s.context.span_id)] is not None, f"orphan span {s.name}"
    scopes = Counter(getattr(s.instrumentation_scope, "name", None) for s in spans)
    assert scopes == {"baton": len(spans) - 1, "notices-web": 1}, scopes

    # The submit is the host span's child; its context went on with the submission.
    [submit] = [s for s in spans if s.name == "submit"]
    assert parent[_hex(submit.context.span_id)] is root
    assert _attrs(submit)["baton.session_id"] == sub.session_id
    assert receipts[0].kind == "submit"
    assert receipts[0].trace["traceparent"].split("-")[1] == f"{trace_id:032x}"

    def chain(s: Any) -> list[str]:
        """Names from the span up to the root."""
        names = []
        node: Any = s
        while node is not None:
            names.append(node.name)
            node = parent[_hex(node.context.span_id)]
        return names

    wake = f"{settings.namespace}.wake.notices.1"
    tool = f"{settings.namespace}.tool.send_email"
    # submit -> relay publish -> brain consume
    first_wake = [s for s in spans if s.kind is SpanKind.CONSUMER and s.name == f"process {wake}"
                  and chain(s)[1:] == [f"publish {wake}", "submit", "POST /notices"]]
    assert first_wake, Counter(s.name for s in spans)
    # brain commit -> relay publish -> hands consume -> claim / execute / complete
    executes = [s for s in spans if s.name == "execute send_email"]
    assert len(executes) == 5
    for ex in executes:
        names = chain(ex)
        assert names[:3] == ["execute send_email", f"process {tool}", f"publish {tool}"], names
        assert names[3] == "commit tools" and names[-2:] == ["submit", "POST /notices"], names
    # hands complete -> the signal to the Brain that held its lease (brain.held: no relay
    # hop) -> look (the recheck), apply ... -> the final commit. On a loaded machine the
    # one event loop these services share can stall past the Brain's hold; the signal then
    # goes through the relay as a wake (complete -> publish wake -> process wake). Either
    # way one trace.
    keys = Keys(settings.namespace, settings.shards)
    held = f"process {keys.hold_channel(keys.shard_of(sub.session_id), 'brain-1')}"
    woken = (held, f"process {wake}")
    applied = [s for s in spans if s.kind is SpanKind.CONSUMER and s.name in woken
               and "complete send_email" in chain(s)[1:3]]
    assert applied, Counter(s.name for s in spans)
    [final_commit] = [s for s in spans if s.name == "commit final"]
    names = chain(final_commit)
    assert names[:2] == ["commit final", "phase generation.request"] and names[2] in woken, names
    assert "complete send_email" in names, names
    if applied[0].name == held:
        assert "look" in [s.name for s in spans if parent[_hex(s.context.span_id)] is applied[0]]

    # Messaging attributes on every hop.
    for s in spans:
        attrs = _attrs(s)
        if s.name == held:  # the signal came over Redis pub/sub
            assert attrs["messaging.system"] == "redis", attrs
            assert attrs["baton.session_id"] == sub.session_id, attrs
            continue
        if s.kind in (SpanKind.PRODUCER, SpanKind.CONSUMER):
            assert attrs["messaging.system"] == "nats", s.name
            assert attrs["messaging.destination.name"] in (wake, tool), s.name
            assert attrs["messaging.operation.type"] in ("create", "send", "process"), s.name
            assert attrs["baton.session_id"] == sub.session_id, s.name
        if s.kind is SpanKind.CONSUMER:
            assert attrs["messaging.message.id"], s.name
            assert attrs["messaging.consumer.group.name"], s.name
        if s.name.startswith("publish "):
            assert attrs["messaging.operation.type"] == "send", s.name
    # The model calls, with the GenAI conventions.
    chats = [s for s in spans if s.kind is SpanKind.CLIENT and s.name.startswith("chat ")]
    assert len(chats) >= 2
    assert all(_attrs(c)["gen_ai.operation.name"] == "chat" for c in chats)
    # Baton's own ids on its spans.
    assert all(_attrs(s)["baton.fence"] >= 1 for s in spans if s.name.startswith("commit "))
    assert all(_attrs(s)["baton.run_id"] for s in executes)
