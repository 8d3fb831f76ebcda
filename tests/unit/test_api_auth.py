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


def test_baton_api_refuses_to_start_open_off_loopback() -> None:
    from click.testing import CliRunner

    from baton.api.server import api_command

    result = CliRunner().invoke(api_command, ["--host", "0.0.0.0", "--dev"],
                                env={"BATON_API_TOKENS": ""})
    assert result.exit_code == 1
    assert result.output.startswith("error: no API tokens") and "Traceback" not in result.output


async def test_an_unexpected_error_is_a_problem_without_a_traceback() -> None:
    """No lifespan ran, so the API has no store: a bug-shaped failure, answered in one line."""
    import httpx

    from baton.api.app import create_app
    from baton.settings import Settings

    app = create_app(Settings(), Tokens.load(host="127.0.0.1", dev=True, env={}))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        r = await http.get("/v1/workers")
    assert r.status_code == 500 and r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == "internal" and body["instance"] == "/v1/workers"
    assert "Traceback" not in r.text and "KeyError" in body["detail"]
