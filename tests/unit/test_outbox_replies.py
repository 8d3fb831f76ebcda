"""The relay's raw Redis replies are read the same in either protocol version."""

from __future__ import annotations

from baton.models import OutboxRow
from baton.store.outbox import parse_row


def test_a_row_is_read_as_the_model_validates_it_and_a_malformed_one_is_kept_raw() -> None:
    fields = {"id": "s/1/0", "subj": "ns.tool.x", "data": "{}", "hdr": '{"a": "b"}',
              "sid": "s", "ts": "12"}
    row = parse_row(3, "1-0", fields, "w")
    assert row == OutboxRow(id="s/1/0", subject="ns.tool.x", data="{}", headers={"a": "b"},
                            session_id="s", ts_ms=12, stream_id="3:w:1-0")
    assert parse_row(3, "1-0", {**fields, "hdr": ""}).headers == {}
    for bad in ({"hdr": '["a"]'}, {"hdr": '{"a": 1}'}, {"hdr": "{not json"}, {"ts": "x"},
                {"id": None}):
        broken = parse_row(3, "1-0", {**fields, **bad})
        assert broken.subject == "" and broken.stream_id == "3:1-0"  # dead-lettered, raw
    missing = dict(fields)
    del missing["subj"]
    assert parse_row(3, "1-0", missing).subject == ""
