"""The archive object (baton.archive): what encode writes decode reads back, and an object
that is not one this version reads is a CorruptStateError naming why."""

from __future__ import annotations

import orjson
import pytest
import zstandard

from baton import archive
from baton.archive import (
    ARCHIVE_VERSION,
    ArchivedSession,
    ArchiveSummary,
    IndexRow,
    decode,
    encode,
)
from baton.errors import CorruptStateError


def session(**changes: object) -> ArchivedSession:
    fields: dict[str, object] = {
        "namespace": "baton", "session_id": "s-1:a.b_c", "archived_ms": 1_800_000_000_123,
        "seq": 8, "fence": 2,
        "summary": ArchiveSummary(agent="notices", compat=1, status="completed",
                                  created_ms=1_700_000_000_000, settled_ms=1_700_000_000_500,
                                  submissions=1),
        "meta": {"agent": "notices", "compat": "1", "seq": "8", "fence": "2"},
        "entries": ['{"kind":"user","text":"h\u00e9llo \\"quoted\\""}', "{}"],
        "subs": {"sub-1": '{"status":"completed"}'},
        "receipts": [("1-0", {"kind": "submit", "seq": "0"}), ("1-1", {"kind": "lease"})],
        "nudge": None,
    }
    fields.update(changes)
    return ArchivedSession.model_validate(fields)


def test_encode_then_decode_gives_the_same_session() -> None:
    s = session()
    data = encode(s)
    assert data[:4] == b"\x28\xb5\x2f\xfd"  # a zstandard frame
    back = decode(data)
    assert back == s and back.v == ARCHIVE_VERSION
    assert back.receipts[0] == ("1-0", {"kind": "submit", "seq": "0"})
    assert decode(memoryview(data)) == s


def test_the_model_is_frozen_and_refuses_unknown_fields() -> None:
    s = session()
    with pytest.raises(ValueError, match="frozen"):
        s.seq = 9  # type: ignore[misc]
    with pytest.raises(ValueError, match="extra"):
        session(applied={"c-1": "ok"})  # the idempotency records are not archived


def _frame(doc: object) -> bytes:
    return zstandard.ZstdCompressor().compress(orjson.dumps(doc))


def test_an_object_archived_before_per_role_receipts_reads_and_restores_as_it_was() -> None:
    """An object written before each role had its own receipts stream holds them all in
    ``receipts``: it decodes, and restores them there (restore.lua's argument)."""
    from baton.store.retention import restore_keys

    doc = session().model_dump(mode="json")
    del doc["receipts_hands"], doc["receipts_client"]
    old = decode(_frame(doc))
    assert old.receipts == session().receipts
    assert old.receipts_hands == old.receipts_client == []
    assert old.last_receipts() == "1-1  "
    keys = orjson.loads(restore_keys(old))
    assert keys["receipts"] == [["1-0", ["kind", "submit", "seq", "0"]], ["1-1", ["kind", "lease"]]]
    assert keys["receipts_hands"] == keys["receipts_client"] == []
    # and a new one keeps each role's stream apart
    new = session(receipts=[("1-1", {"kind": "lease"})],
                  receipts_hands=[("1-2", {"kind": "claim"})],
                  receipts_client=[("1-0", {"kind": "submit"})])
    assert decode(encode(new)) == new and new.last_receipts() == "1-1 1-2 1-0"


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "not a zstandard frame"),
    (b"not an object at all", "not a zstandard frame"),
    (encode(session())[:-5], "not a whole zstandard frame"),
    (zstandard.ZstdCompressor().compress(b"{not json"), "not JSON"),
    (_frame([1, 2]), "not a JSON object"),
    (_frame({**session().model_dump(mode="json"), "v": 99}), "schema version 99"),
    (_frame({k: v for k, v in session().model_dump(mode="json").items() if k != "v"}),
     "schema version None"),
    (_frame({**session().model_dump(mode="json"), "seq": "eight"}), "seq"),
    (_frame({**session().model_dump(mode="json"), "surprise": 1}), "surprise"),
])
def test_an_object_this_version_cannot_read_is_a_corrupt_state_error(data: bytes,
                                                                     reason: str) -> None:
    with pytest.raises(CorruptStateError, match=reason) as caught:
        decode(data)
    assert not caught.value.retryable


def test_the_session_id_of_a_refused_version_is_named() -> None:
    with pytest.raises(CorruptStateError) as caught:
        decode(_frame({**session().model_dump(mode="json"), "v": 2}))
    assert caught.value.session_id == "s-1:a.b_c"


def test_an_object_past_the_bound_is_refused_before_it_is_decompressed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "MAX_OBJECT_BYTES", 1000)
    # A frame that states a size past the bound: refused from its header, nothing allocated.
    with pytest.raises(CorruptStateError, match="1001 bytes decompressed, past the bound"):
        decode(zstandard.ZstdCompressor().compress(b"\0" * 1001))
    # One that does not state its size is decompressed into at most the bound.
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 1001)
    with pytest.raises(CorruptStateError, match="frame of at most 1000 bytes"):
        decode(streamed)


def test_an_index_row_is_made_from_the_summary() -> None:
    row = IndexRow.of(session())
    assert row == IndexRow(session_id="s-1:a.b_c", agent="notices", status="completed",
                           created_ms=1_700_000_000_000, archived_ms=1_800_000_000_123)
