"""The scripted model's address finder: the plain pattern's answers, in linear time."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from baton.brain.scripted import find_emails

# The pattern the finder replaces: right on short text, quadratic on long runs.
PLAIN = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


def plain(text: str) -> list[str]:
    return list(dict.fromkeys(PLAIN.findall(text)))


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="aB1.@-%+ ,", max_size=60))
def test_finds_what_the_plain_pattern_finds(text: str) -> None:
    assert find_emails(text) == plain(text)


def test_the_five_notices() -> None:
    text = ("Send the approved notice 'Our terms change on 1 March' to ada@example.com, "
            "grace@example.com, linus@example.com, margaret@example.com and "
            "barbara@example.com, then summarise.")
    assert find_emails(text) == [f"{n}@example.com" for n in
                                 ("ada", "grace", "linus", "margaret", "barbara")]


# One megabyte each, shaped to make a backtracking pattern rescan: runs of address characters
# without an "@", many "@" without a domain, domains without a top-level label. The finder
# must answer (its CPU cost is a benchmark figure, not asserted here).
ADVERSARIAL = {
    "one run": "a" * 1_000_000,
    "at signs": "a@" * 500_000,
    "dots": "a@" + "a." * 500_000,
    "labels": "a@a." * 250_000,
    "no tld": ("x" * 64 + "@" + "y" * 255 + "-") * 3_000,
    "addresses": "p@example.com " * 70_000,
}


def test_adversarial_megabytes_are_answered() -> None:
    assert find_emails(ADVERSARIAL["one run"]) == []
    assert find_emails(ADVERSARIAL["at signs"]) == []
    assert find_emails(ADVERSARIAL["dots"]) == []
    assert find_emails(ADVERSARIAL["labels"]) == []
    assert find_emails(ADVERSARIAL["no tld"]) == []
    assert find_emails(ADVERSARIAL["addresses"]) == ["p@example.com"]
