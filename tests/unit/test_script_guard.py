"""Which session keys each script's corrupt_refusal checks (scripts.guarded_keys).

The property test tests/integration/test_script_atomicity.py proves the checks make every
script all-or-nothing; these pin how the checked keys are found in the scripts' text.
"""

from __future__ import annotations

from baton.store.scripts import SESSION_SCRIPTS, guarded_keys, source


def test_a_script_checks_the_keys_it_names_and_those_of_the_helpers_it_calls() -> None:
    # every commit writes meta (it reads the entries' count before writing); the keys only
    # some write-sets touch (timers through set_deadline, the outbox through outbox()) it
    # checks itself, and its receipt is its first write (receipt_first): no check either
    assert {"meta", "applied"} <= guarded_keys("commit")
    assert not {"entries", "tasks", "timers", "outbox", "receipts"} & guarded_keys("commit")
    assert "receipts" not in guarded_keys("claim") | guarded_keys("complete")
    # heartbeat writes the runs and, refused, a receipt; never the session's own state (it
    # reads the runs before writing: a WRONGTYPE there writes nothing, see its UNGUARDED line)
    heartbeat = guarded_keys("heartbeat")
    assert "applied" in heartbeat
    assert not heartbeat & {"runs", "meta", "tasks", "entries", "outbox", "timers"}


def test_keys_written_first_or_only_sometimes_are_checked_by_the_script_not_the_guard() -> None:
    # a receipt written first (receipt_first) or only by a refusal, the wakes stream only by
    # the completion that wakes the Brain, the nudge only tested and deleted: no TYPE call
    # before every call of these (the hot path of every tool result and lease)
    for name in ("submit", "partial", "renew", "heartbeat", "complete", "claim", "commit"):
        assert "receipts" not in guarded_keys(name), name
    assert "wakes" not in guarded_keys("complete")
    assert "nudge" not in guarded_keys("release")


def test_keys_named_only_for_acl_checks_are_not_checked() -> None:
    # acquire's log_checks() names the outbox and timers for acl_check_cmd, which reads no key
    assert "outbox" not in guarded_keys("acquire")
    assert "timers" not in guarded_keys("acquire")


def test_every_script_checks_its_applied_record_and_ships_its_guard() -> None:
    for name in SESSION_SCRIPTS:
        assert "applied" in guarded_keys(name), name
        assert "local function corrupt_refusal(with_applied)" in source(name), name
        assert "wrong_type(K_APPLIED, 'applied', 'hash')" in source(name), name


def test_a_script_gets_only_the_definitions_it_uses() -> None:
    claim = source("claim", acl_checks=False)
    assert "local K_RUNS = " in claim and "local function now_ms()" in claim
    # claim never touches the entries, the timers nor a session's meta
    assert "local K_ENTRIES" not in claim and "set_deadline" not in claim
    assert "meta_refusal" not in claim
    # commit's guard checks meta's fields as well as its type
    assert "meta_refusal()" in source("commit")


def test_a_self_guarded_key_is_checked_by_the_script_itself() -> None:
    import re

    from baton.store.scripts import KEY_TYPES

    for name in SESSION_SCRIPTS:
        text = source(name)
        line = re.search(r"^SELF-GUARDED:(.*)$", text, re.M)
        for key in line.group(1).split() if line else ():
            # a receipts stream: by receipt_first, whose failed XADD checks its stream's type
            assert f"wrong_type(K_{key.upper()}, '{key}', '{KEY_TYPES[key]}')" in text or (
                KEY_TYPES[key] == "stream" and f"receipt_first(K_{key.upper()}," in text
                and "return wrong_type(k, string.match(k, ':([a-z_]+)$'), 'stream')" in text
            ), (name, key)


def test_each_role_s_scripts_write_receipts_to_its_own_stream_only() -> None:
    """The Brains' scripts append to ``receipts``, the Hands' to ``receipts_hands``, the
    clients' to ``receipts_client``: the stream each role's ACL user alone may write."""
    import re

    from baton.store.scripts import HANDS_SCRIPTS, INBOX_SCRIPTS, TOMBSTONE_SCRIPTS

    calls = re.compile(r"\breceipt(?:_first)?\((K_\w+),|\{'XADD', (K_RECEIPTS\w*),")
    for name in (*SESSION_SCRIPTS, *TOMBSTONE_SCRIPTS):
        own = ("K_RECEIPTS_HANDS" if name in HANDS_SCRIPTS
               else "K_RECEIPTS_CLIENT" if name in INBOX_SCRIPTS else "K_RECEIPTS")
        body = source(name).split("local function __script(ARGV)")[-1]
        written = {a or b for a, b in calls.findall(body)}
        if name not in ("ask_restore", "reinstate", "archive"):  # they write no receipt
            assert written, name
        assert written <= {own}, (name, written)
