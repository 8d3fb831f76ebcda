"""Receipts decode into typed details: every layout the scripts write, and what they may not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from baton.receipts import (
    ApprovalDetail,
    CancelDetail,
    Carrier,
    ClaimDetail,
    CommitDetail,
    CompleteDetail,
    LeaseDetail,
    OtherDetail,
    PartialDetail,
    Receipt,
    RefusedDetail,
    StartDetail,
    SubmitDetail,
)

BRAIN = json.dumps({"role": "brain", "name": "brain-1", "pid": 10})
HANDS = json.dumps({"role": "hands", "name": "hands-2", "pid": 11})
CARRIER = {"relay": "relay-1", "published_ms": 1_700_000_000_123, "row_id": "s-1/4/0",
           "stream_seq": 42, "delivery": 2}


def entry(kind: str, data: dict[str, Any], *, worker: str = BRAIN, seq: int = 0,
          fence: int = 1) -> dict[str, str]:
    """One receipts-stream entry as the scripts' receipt() helper writes it."""
    return {"seq": str(seq), "kind": kind, "worker": worker, "fence": str(fence),
            "ts": "1700000000000", "data": json.dumps(data)}


# What each script (or its Python caller) passes as the receipt's data, kind by kind.
CASES: list[tuple[str, dict[str, Any], type, dict[str, Any]]] = [
    ("lease", {"previous_holder": "", "previous_fence": 0, "carrier": CARRIER}, LeaseDetail,
     {"previous_fence": 0}),
    ("takeover", {"previous_holder": "brain-0", "previous_fence": 3}, LeaseDetail,
     {"previous_holder": "brain-0", "carrier": None}),
    ("claim", {"run_id": "t-1-0", "attempt": 1, "previous_attempt": 0,
               "previous_status": "dispatched", "previous_worker": "", "accepted_mark": 1,
               "delivery": 1, "carrier": CARRIER}, ClaimDetail,
     {"accepted_mark": True, "run_id": "t-1-0"}),
    ("reclaim", {"run_id": "t-1-0", "attempt": 2, "previous_attempt": 1,
                 "previous_status": "running", "previous_worker": "hands-1", "accepted_mark": 0,
                 "delivery": 2}, ClaimDetail, {"previous_worker": "hands-1", "delivery": 2}),
    ("complete", {"marks": [{"run_id": "t-1-0", "mark": "completed", "attempt": 2}],
                  "detail": {"run_id": "t-1-0", "tool": "send_email", "outcome": "ok",
                             "recovery": "confirmed", "duration_ms": 3.5, "delivery": 2},
                  "trace": {"traceparent": "00-ab-cd-01"}}, CompleteDetail,
     {"recovery": "confirmed", "duration_ms": 3.5}),
    ("refused", {"current": 4, "op": "commit"}, RefusedDetail, {"op": "commit", "current": 4}),
    ("refused", {"run_id": "r", "current": 2, "status": "running", "op": "heartbeat"},
     RefusedDetail, {"op": "heartbeat", "status": "running"}),
    ("refused", {"run_id": "r", "op": "approve", "presented": "abc", "expected": "def"},
     RefusedDetail, {"presented": "abc"}),
    ("submit", {"detail": {"submission_id": "sub-1", "request_id": "req-1", "task_id": "t"},
                "changes": {"entries": 1, "tasks": 1}, "trace": {}}, SubmitDetail,
     {"submission_id": "sub-1"}),
    ("start", {"detail": {"task_id": "t", "kind": "notice", "request_id": "r"},
               "changes": {"tasks": 1}}, StartDetail, {"task_kind": "notice"}),
    ("partial", {"detail": {"task_id": "t", "request_id": "t:1:0", "delta": "Hel",
                            "chars": 3}}, PartialDetail, {"delta": "Hel", "chars": 3}),
    ("cancel", {"detail": {"target": "*", "reason": "user"}}, CancelDetail, {"target": "*"}),
    ("approve", {"detail": {"run_id": "r", "tool": "pay", "digest": "d",
                            "decision": "approve"}}, ApprovalDetail, {"digest": "d"}),
    ("reject", {"detail": {"run_id": "r", "tool": "pay", "decision": "reject",
                           "reason": "no"}}, ApprovalDetail, {"reason": "no"}),
    ("commit", {"kind": "tools", "marks": [], "changes": {"entries": 1, "runs": 2},
                "detail": {"task_id": "t", "turn": 1, "runs": ["t-1-0", "t-1-1"],
                           "request_id": "t:1:0", "attempt": 0,
                           "usage": {"input_tokens": 5, "output_tokens": 7}}, "trace": {}},
     CommitDetail, {"step": "tools", "runs": ("t-1-0", "t-1-1")}),
    ("commit", {"kind": "phase:send", "detail": {"task_id": "t", "phase": "send",
                                                  "step": "wait", "runs": ["r"]}},
     CommitDetail, {"step": "phase:send", "phase_step": "wait"}),
    ("commit", {"kind": "migrate", "detail": {"from": 1, "to": 2, "wake_subject": "w",
                                               "migrated": {"t": [1, 2]}}},
     CommitDetail, {"compat_from": 1, "compat_to": 2, "migrated": {"t": (1, 2)}}),
    ("commit", {"kind": "blocked", "detail": {"blocked": {"t": "no v3"}, "cleared": []}},
     CommitDetail, {"blocked": {"t": "no v3"}}),
    ("commit", {"kind": "retry", "detail": {"task_id": "t", "request_id": "t:1:0",
                                             "attempt": 1, "error": "boom", "status": 503,
                                             "until_ms": 5, "retry_in_ms": 4}},
     CommitDetail, {"status": 503, "retry_in_ms": 4}),
    ("commit", {"kind": "cancel", "detail": {"intents": ["*"], "targets": ["t"],
                                              "runs": []}}, CommitDetail,
     {"targets": ("t",)}),
    ("commit", {"kind": "run", "detail": {"tasks": ["a", "b"]}}, CommitDetail,
     {"tasks": ("a", "b")}),
]


@pytest.mark.parametrize(("kind", "data", "model", "expect"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_kind_the_scripts_write_decodes_to_its_model(
    kind: str, data: dict[str, Any], model: type, expect: dict[str, Any]
) -> None:
    r = Receipt.from_stream("1-0", entry(kind, data))
    assert isinstance(r.detail, model), r.detail
    assert r.kind == kind and r.stream_id == "1-0"
    for name, value in expect.items():
        assert getattr(r.detail, name) == value, name
    # Saved and read back (``baton trace --receipts``) it is the same receipt.
    assert Receipt.model_validate(json.loads(r.model_dump_json())) == r


def test_envelope_fields_and_the_accepted_mark_of_a_first_claim() -> None:
    first = Receipt.from_stream("1-0", entry("claim", {
        "run_id": "t-1-0", "attempt": 1, "accepted_mark": 1, "carrier": CARRIER},
        worker=HANDS))
    assert [(m.run_id, m.mark, m.attempt) for m in first.marks] == [("t-1-0", "accepted", 1)]
    assert first.worker is not None and first.worker.name == "hands-2"
    assert isinstance(first.detail, ClaimDetail) and first.detail.carrier == Carrier(**CARRIER)
    again = Receipt.from_stream("1-1", entry("reclaim", {"run_id": "t-1-0", "attempt": 2,
                                                         "accepted_mark": 0}))
    assert again.marks == ()
    commit = Receipt.from_stream("1-2", entry("commit", {
        "kind": "apply", "marks": [{"run_id": "r", "mark": "applied"}],
        "changes": {"entries": 1}, "detail": {"task_id": "t", "applied": ["r"]},
        "trace": {"traceparent": "x"}}, seq=7))
    assert commit.seq == 7 and commit.changes == {"entries": 1}
    assert commit.trace == {"traceparent": "x"} and commit.marks[0].mark == "applied"
    assert commit.detail.task_ref == "t" and commit.detail.run_refs == frozenset()


def test_unknown_kind_from_a_newer_writer_is_kept_not_fatal() -> None:
    r = Receipt.from_stream("9-0", entry("rebalance", {"shard": 3, "note": "moved"}))
    assert isinstance(r.detail, OtherDetail) and r.kind == "rebalance"
    assert r.detail.fields == {"shard": 3, "note": "moved"} and not r.detail.undecodable
    assert Receipt.model_validate(json.loads(r.model_dump_json())) == r


def test_a_known_kind_that_does_not_validate_falls_back_with_the_reason() -> None:
    r = Receipt.from_stream("9-1", entry("claim", {"attempt": "many"}))
    assert isinstance(r.detail, OtherDetail) and r.kind == "claim"
    assert "run_id" in r.detail.undecodable


def test_fields_added_by_a_newer_writer_are_ignored() -> None:
    r = Receipt.from_stream("9-2", entry("lease", {"previous_holder": "b", "zone": "eu-1"}))
    assert isinstance(r.detail, LeaseDetail) and r.detail.previous_holder == "b"


def test_the_earlier_saved_layout_still_loads() -> None:
    """Receipts saved by ``baton demo`` before details were typed: kind beside a dict."""
    old = {"v": 1, "seq": 3, "ts_ms": 5, "kind": "complete", "worker": None, "fence": 2,
           "marks": [], "changes": {}, "trace": {},
           "detail": {"stream_id": "5-0", "run_id": "r", "tool": "t", "outcome": "ok"}}
    r = Receipt.model_validate(old)
    assert isinstance(r.detail, CompleteDetail) and r.stream_id == "5-0"


@pytest.mark.parametrize("bad", [
    {"relay": "relay 1"}, {"relay": "x" * 200}, {"published_ms": -1},
    {"published_ms": 2**60}, {"row_id": "a b"}, {"delivery": 0}, {"stream_seq": -3},
    {"extra": "field"},
])
def test_carrier_fields_are_bounded(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Carrier(**{**CARRIER, **bad})


def test_carrier_names_the_commit_that_wrote_its_row() -> None:
    assert Carrier(row_id="s-1/12/0").source_seq == 12
    timer = Carrier(row_id="t/deadline|s-1|-|baton.wake.a.1/1700000000000")
    assert timer.timer and timer.source_seq is None
    assert Carrier(row_id="odd").source_seq is None


class _Msg:
    """The parts of a JetStream message carrier_of reads."""

    def __init__(self, headers: dict[str, str], seq: int = 42, delivered: int = 1) -> None:
        self.headers, self.subject = headers, "t.tool.send_email"
        self.metadata = type("Meta", (), {
            "sequence": type("Seq", (), {"stream": seq})(), "num_delivered": delivered})()


def test_carrier_of_reads_the_relay_headers_and_drops_what_does_not_fit() -> None:
    from typing import cast

    from nats.aio.msg import Msg

    from baton.bus.messages import carrier_headers, carrier_of

    headers = {**carrier_headers("relay-1", 1_700_000_000_123), "Nats-Msg-Id": "s-1/4/0"}
    c = carrier_of(cast(Msg, _Msg(headers, delivered=3)))
    assert c == Carrier(relay="relay-1", published_ms=1_700_000_000_123, row_id="s-1/4/0",
                        stream_seq=42, delivery=3)
    bare = carrier_of(cast(Msg, _Msg({})))  # an older relay: no carrier headers
    assert bare is not None and bare.relay == "" and bare.stream_seq == 42
    for bad in ({"Baton-Relay": "relay 1\u00e9"}, {"Baton-Relay": "r" * 5000},
                {"Nats-Msg-Id": "a b"}):
        assert carrier_of(cast(Msg, _Msg(bad))) is None
    assert carrier_of(cast(Msg, _Msg({"Baton-Published-At": "soon"}))).published_ms == 0


CLIENT = json.dumps({"role": "client", "name": "client-1", "pid": 12})


def test_a_receipt_is_attributed_to_the_role_of_its_stream() -> None:
    """The Hands' and clients' streams take only their role's writes: what a receipt there
    claims does not change whose it is, and an act of another role is flagged, not read."""
    claim = Receipt.from_stream("1-0", entry("claim", {"run_id": "r"}, worker=HANDS), "hands")
    assert (claim.role, claim.mismatch, claim.foreign) == ("hands", False, False)
    # a Hands forging a Brain's final commit: still the Hands', flagged twice
    fake = Receipt.from_stream("1-1", entry("commit", {"kind": "final"}), "hands")
    assert (fake.role, fake.mismatch, fake.foreign) == ("hands", True, True)
    # a client claiming to be a Hands that claimed a run
    fake = Receipt.from_stream("1-2", entry("claim", {"run_id": "r"}, worker=HANDS), "client")
    assert (fake.role, fake.mismatch, fake.foreign) == ("client", True, True)
    # a client's own request, whatever name it gives
    cancel = Receipt.from_stream("1-3", entry("cancel", {}, worker=CLIENT), "client")
    assert (cancel.role, cancel.mismatch, cancel.foreign) == ("client", False, False)
    # saved and read back, it keeps its stream's role
    assert Receipt.model_validate(json.loads(fake.model_dump_json())).role == "client"


def test_a_session_written_before_per_role_streams_reads_as_it_was() -> None:
    """Before per-role streams every role appended to the Brains' stream: a Hands' claim
    there keeps its claimed role (flagged as not vouched for by its stream) and is read as
    a claim; a receipt saved without its stream is read as its worker says."""
    old = Receipt.from_stream("1-0", entry("claim", {"run_id": "r"}, worker=HANDS), "brain")
    assert (old.role, old.mismatch, old.foreign) == ("hands", True, False)
    commit = Receipt.from_stream("1-1", entry("commit", {"kind": "final"}), "brain")
    assert (commit.role, commit.mismatch, commit.foreign) == ("brain", False, False)
    saved = Receipt.from_stream("1-2", entry("claim", {"run_id": "r"}, worker=HANDS))
    assert (saved.role, saved.mismatch, saved.foreign) == ("hands", False, False)


def test_receipts_merge_by_id_then_role() -> None:
    from baton.store.state import merge_receipts

    merged = merge_receipts([
        ("brain", [("5-0", entry("lease", {})), ("7-3", entry("commit", {}))]),
        ("hands", [("6-1", entry("claim", {"run_id": "r"}, worker=HANDS))]),
        ("client", [("1-2", entry("submit", {}, worker=CLIENT)),
                    ("7-3", entry("cancel", {}, worker=CLIENT))])])
    assert [(r.stream_id, r.role) for r in merged] == [
        ("1-2", "client"), ("5-0", "brain"), ("6-1", "hands"), ("7-3", "brain"),
        ("7-3", "client")]
