"""Redis URLs in messages and logs carry the user, never the password."""

from __future__ import annotations

import pytest

from baton.store.redis_client import without_password


@pytest.mark.parametrize(("url", "shown"), [
    ("rediss://client:s3cret@127.0.0.1:6380/0", "rediss://client@127.0.0.1:6380/0"),
    ("redis://:s3cret@redis:6379/0", "redis://redis:6379/0"),  # no user: none shown
    ("rediss+cluster://brain:s3cret@h1:7000,h2:7001", "rediss+cluster://brain@h1:7000,h2:7001"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis+cluster://h1:7000,h2:7001", "redis+cluster://h1:7000,h2:7001"),
])
def test_without_password_keeps_the_user_and_drops_the_secret(url: str, shown: str) -> None:
    assert without_password(url) == shown
    assert "s3cret" not in without_password(url)
