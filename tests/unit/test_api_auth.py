"""Bearer tokens of the HTTP API: roles, digests, and when an open API is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.api.auth import OPERATE, READ, Tokens, is_loopback
from baton.errors import ConfigError, ForbiddenError, UnauthenticatedError

OP = "operate-0123456789abcdef"
RD = "read-0123456789abcdef"


def test_tokens_map_to_roles_and_unknown_ones_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    file.write_text(f"# the console\nread:{RD}\n")
    tokens = Tokens.load(host="0.0.0.0", dev=False, file=file,
                         env={"BATON_API_TOKENS": f"operate:{OP}"})
    assert tokens.role_of(f"Bearer {OP}", "10.0.0.1") == OPERATE
    assert tokens.role_of(f"bearer {RD}", "10.0.0.1") == READ
    with pytest.raises(UnauthenticatedError, match="unknown"):
        tokens.role_of("Bearer " + "z" * 20, "127.0.0.1")
    with pytest.raises(UnauthenticatedError, match="required"):
        tokens.role_of(None, "127.0.0.1")  # tokens exist: loopback is no exception
    assert OP not in repr(tokens) and RD not in repr(tokens)  # digests only
    Tokens.require(OPERATE, OPERATE, "POST /v1/submissions")
    with pytest.raises(ForbiddenError, match="operate role"):
        Tokens.require(READ, OPERATE, "POST /v1/submissions")


def test_an_open_api_needs_dev_mode_and_loopback() -> None:
    open_ = Tokens.load(host="127.0.0.1", dev=True, env={})
    assert open_.role_of(None, "127.0.0.1") == OPERATE
    with pytest.raises(UnauthenticatedError):
        open_.role_of(None, "192.168.1.9")  # a request from elsewhere
    for host, dev in (("0.0.0.0", True), ("127.0.0.1", False), ("10.1.2.3", True)):
        with pytest.raises(ConfigError, match="no API tokens"):
            Tokens.load(host=host, dev=dev, env={})
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("example.com")


@pytest.mark.parametrize("spec", ["admin:" + "x" * 20, "operate:short", "no-colon-here" * 2])
def test_bad_token_specs_are_one_line_errors(spec: str) -> None:
    with pytest.raises(ConfigError, match="BATON_API_TOKENS"):
        Tokens.load(host="127.0.0.1", dev=True, env={"BATON_API_TOKENS": spec})
