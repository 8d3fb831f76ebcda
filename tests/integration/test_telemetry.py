"""One OpenTelemetry trace across real processes, through a Hands takeover.

The demo's scenario on a DevStack (1 brain, 2 hands, 1 relay, the mail service holding each
reply 300 ms): five notices, and the Hands sending the 4th is SIGKILLed once the mail
service accepted it; the other Hands takes the run over. Every process writes its finished
spans to its own file (``BATON_OTEL_FILE``), the test process too (the client's submit);
merged, they must form one trace from the submit to the final commit, with the takeover in it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from baton.client import Client
from baton.devkit.demo import DEMO_ENV, FIVE_NOTICES, MAIL_DELAY_MS, _kill_after_fourth
from baton.devkit.devstack import DevStack
from baton.observability import telemetry
from tests.otel_host import host_telemetry

pytestmark = pytest.mark.slow

Span = dict[str, Any]


def _merge(directory: Path) -> list[Span]:
    spans = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                span = json.loads(line)
                span["process"] = path.stem
                spans.append(span)
    return spans


@pytest.mark.timeout(180)
async def test_one_trace_runs_from_submit_through_a_takeover_to_the_answer(
    tmp_path: Path,
) -> None:
    files = tmp_path / "spans"
    files.mkdir()
    stack = DevStack(tmp_path / "stack", brains=0, hands=0, relays=0,
                     mail_delay_ms=MAIL_DELAY_MS, env=DEMO_ENV)
    client_spans = telemetry.JsonLinesSpanExporter(str(files / "client.jsonl"))
    async with stack:
        for role, name in (("relay", "relay-1"), ("brain", "brain-1"),
                           ("hands", "hands-1"), ("hands", "hands-2")):
            await stack.spawn(role, name, env={telemetry.FILE_ENV: str(files / f"{name}.jsonl")})
        # This process plays the client's application, with its own global provider.
        with host_telemetry("baton-client") as host:
            host.tracer_provider.add_span_processor(SimpleSpanProcessor(client_spans))
            client = await Client.connect(stack.settings())
            try:
                sub, _ = await client.submit(FIVE_NOTICES, agent="notices")
                async with httpx.AsyncClient(base_url=stack.mail_url, timeout=2.0) as http:
                    kill = await _kill_after_fourth(stack, client.store, http, sub.session_id)
                final = await client.wait(sub, timeout=60)
                receipts = await client.store.receipts(sub.session_id)
            finally:
                await client.close()
        logs = {p.name: p.log_path.read_text() for p in stack.procs("hands")}
    assert final.status == "completed", final

    spans = _merge(files)
    [submit] = [s for s in spans if s["name"] == "submit"]
    assert submit["process"] == "client" and submit["parent_span_id"] is None
    assert submit["attributes"]["baton.session_id"] == sub.session_id
    trace_id = submit["trace_id"]
    trace = [s for s in spans if s["trace_id"] == trace_id]
    by_id = {s["span_id"]: s for s in trace}
    processes = Counter(s["process"] for s in trace)
    # client, relay, brain and both Hands (the killed one, and the one that took over).
    assert set(processes) == {"client", "relay-1", "brain-1", "hands-1", "hands-2"}, processes

    # The receipts carry the same trace: the submit's, and each commit's own span.
    assert receipts[0].kind == "submit"
    assert receipts[0].trace["traceparent"].split("-")[1] == trace_id

    # Parent links: every span's parent is in the merged set, except the root (the submit)
    # and spans of the killed Hands whose parent was still open when it died.
    for s in trace:
        if s is submit:
            continue
        if s["parent_span_id"] not in by_id:
            assert s["process"] == kill.worker, f"orphan span {s['name']} of {s['process']}"
    # Each hop: relay publish <- the commit (or submit) that wrote the row; a consumer <- the
    # relay's publish (the relay traces here), or the commit when the relay does not trace.
    for s in trace:
        parent = by_id.get(s["parent_span_id"] or "")
        if s["kind"] == "PRODUCER" and s["name"].startswith("publish "):
            assert parent is not None and parent["name"].split()[0] in (
                "submit", "commit", "complete"), (s["name"], parent)
        if s["kind"] == "CONSUMER" and s["attributes"].get("messaging.system") == "redis":
            # the signal of the group's last result to the Brain holding the lease
            # (brain.held): the child of that completion, no relay in between
            assert s["name"].startswith("process ") and ":held:" in s["name"], s
            assert parent is not None and parent["name"] == "complete send_email", s
        elif s["kind"] == "CONSUMER":
            assert parent is not None and parent["name"].startswith(("publish ", "commit ")), s

    # The takeover: the other Hands consumed the redelivered message in the same trace,
    # reclaimed the run from the killed worker, confirmed and completed it.
    survivor = "hands-2" if kill.worker == "hands-1" else "hands-1"
    [reclaim] = [s for s in trace if s["name"] == "claim"
                 and s["attributes"].get("baton.previous_worker") == kill.worker]
    assert reclaim["process"] == survivor
    assert reclaim["attributes"]["baton.run_id"] == kill.run_id
    taking = by_id[reclaim["parent_span_id"]]
    assert taking["kind"] == "CONSUMER" and taking["attributes"]["baton.delivery"] >= 2
    first = [s for s in trace if s["kind"] == "CONSUMER" and s["process"] == kill.worker]
    completes = [s for s in trace if s["name"] == "complete send_email"
                 and s["attributes"]["baton.run_id"] == kill.run_id]
    assert [c["process"] for c in completes] == [survivor]
    assert completes[0]["attributes"]["baton.recovery"] == "confirmed"
    # The takeover consumed the same publish as the killed Hands did (when it got that far).
    publishes = {taking["parent_span_id"]}
    killed_claims = [s for s in trace if s["name"] == "claim" and s["process"] == kill.worker
                     and s["attributes"].get("baton.run_id") == kill.run_id]
    for c in killed_claims:
        if c["parent_span_id"] in by_id:  # its consume span ended: it cannot have
            publishes.add(by_id[c["parent_span_id"]]["parent_span_id"])
    assert len(publishes) == 1 or first == []

    # The Brain's side: phases, the model call, commits, and the apply after the takeover.
    names = Counter(s["name"] for s in trace if s["process"] == "brain-1")
    assert names["phase generation.apply"] >= 1 and names["chat scripted"] >= 2, names
    assert names["commit tools"] >= 1 and names["commit final"] == 1, names
    # Two reads of the session: the lease its submit's wake brought, then the recheck
    # (span "look") after the results, by a signal to the Brain holding the lease (or, had
    # the hold run out before the takeover's result, a lease again).
    assert names["lease"] + names["look"] >= 2, names

    # Logs: the canonical line of each handled tool message names its trace and fence.
    handled = [json.loads(line) for line in logs[survivor].splitlines()
               if '"tool_message_handled"' in line and sub.session_id in line]
    assert handled and all(h["trace_id"] == trace_id for h in handled), handled
    assert any(h.get("fence", 0) >= 2 and h["run_id"] == kill.run_id for h in handled), handled
