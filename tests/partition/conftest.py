"""Partition tests: servers and workers in their own Linux network namespaces, links cut.

Needs root and iproute2 (``ip netns``); elsewhere every test here skips with the reason.
The namespaces, veth pairs and bridge of a test are removed when it ends, pass or fail
(:class:`baton.devkit.netns.Netns`).
"""

from __future__ import annotations

import pytest

from baton.devkit.netns import unavailable

_REASON = unavailable()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if _REASON is None:
        return
    for item in items:
        if "tests/partition/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.skip(reason=_REASON))


# The crash suite's stack harness (DevStack per test, five-notice checks), for the stacks
# whose servers and services each run in a network namespace.
from tests.crash.conftest import crash  # noqa: E402,F401
