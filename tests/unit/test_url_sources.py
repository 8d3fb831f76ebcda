"""A server that cannot be reached is named with where its URL came from, and ``baton dev
up`` warns of exported URLs that would win over the stack it started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.cli.failures import failure, url_source_hint
from baton.devkit.stack import bare_url, overriding_variables, servers
from baton.errors import NatsUnavailable, RedisUnavailable

OLD = "redis://127.0.0.1:56789/0"
NEW = "redis://127.0.0.1:40193/0"


def _home(tmp_path: Path, **stack: str) -> dict[str, str]:
    home = tmp_path / "home"
    if stack:
        home.mkdir(parents=True)
        (home / "dev.json").write_text(json.dumps(stack))
    return {"BATON_HOME": str(home)}


def test_a_url_from_the_environment_names_its_variable_and_the_stacks_own(
    tmp_path: Path,
) -> None:
    env = {**_home(tmp_path, redis_url=NEW, nats_url="nats://127.0.0.1:40194"),
           "BATON_REDIS_URL": OLD}
    assert url_source_hint("redis", OLD, env) == (
        f" (BATON_REDIS_URL from the environment; the local stack's is {NEW} if a stack "
        "runs: see `baton dev status`)")
    # the same servers, spelled with a user: the stack's own URL, which is down
    env["BATON_REDIS_URL"] = "redis://client:secret@127.0.0.1:40193/0"
    assert url_source_hint("redis", NEW, env) == (
        " (BATON_REDIS_URL from the environment, the local stack's: `baton dev status` "
        "says whether it runs)")
    env["BATON_NATS_URL"] = "nats://127.0.0.1:4222"
    assert url_source_hint("nats", "nats://127.0.0.1:4222", env).startswith(
        " (BATON_NATS_URL from the environment; the local stack's is nats://127.0.0.1:40194 ")


def test_a_url_from_the_environment_with_no_stack_or_from_the_stack(tmp_path: Path) -> None:
    assert url_source_hint("redis", OLD, {**_home(tmp_path), "BATON_REDIS_URL": OLD}) == (
        " (BATON_REDIS_URL from the environment)")
    env = _home(tmp_path / "s", redis_url=NEW)
    assert url_source_hint("redis", NEW, env) == (
        f" (the stack's, from {tmp_path / 's' / 'home' / 'dev.json'}: `baton dev status` "
        "says whether it runs)")
    assert "start one with `baton dev up`" in url_source_hint("redis", OLD, _home(tmp_path))


def test_the_cli_error_of_a_failed_connect_carries_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_HOME", str(tmp_path / "none"))
    monkeypatch.setenv("BATON_REDIS_URL", OLD)
    monkeypatch.setenv("BATON_NATS_URL", "nats://127.0.0.1:4999")
    redis = failure(RedisUnavailable(f"cannot reach Redis at {OLD}: refused", url=OLD))
    assert redis.exit_code == 3 and redis.format_message() == (
        f"cannot reach Redis at {OLD}: refused (BATON_REDIS_URL from the environment)")
    nats = failure(NatsUnavailable("cannot connect to NATS", url="nats://127.0.0.1:4999"))
    assert nats.format_message().endswith("(BATON_NATS_URL from the environment)")
    other = failure(RedisUnavailable("redis refused a write for want of replicas: x"))
    assert other.format_message() == "redis refused a write for want of replicas: x"


def test_dev_up_warns_of_exported_urls_that_name_other_servers() -> None:
    info = {"redis_url": NEW, "nats_url": "nats://127.0.0.1:40194"}
    assert overriding_variables(info, {}) == ""
    assert overriding_variables(info, {"BATON_REDIS_URL": "redis://:pw@127.0.0.1:40193/0",
                                       "BATON_NATS_URL": "nats://127.0.0.1:40194"}) == ""
    one = overriding_variables(info, {"BATON_REDIS_URL": "redis://:pw@127.0.0.1:56789/0"})
    assert one == ("warning: BATON_REDIS_URL (redis://127.0.0.1:56789/0) in this environment "
                   "names other servers than this stack's and wins over it in commands run "
                   'from this shell: unset it, or run eval "$(baton dev status --env)"')
    both = overriding_variables(info, {"BATON_REDIS_URL": OLD,
                                       "BATON_NATS_URL": "nats://127.0.0.1:4222"})
    assert both.startswith(f"warning: BATON_REDIS_URL ({OLD}) and BATON_NATS_URL "
                           "(nats://127.0.0.1:4222) in this environment name other servers")
    assert "\n" not in both and "unset them" in both


def test_urls_compare_by_their_servers_and_show_no_credential() -> None:
    assert servers("nats://a:1,nats://u:p@b:2") == {("a", 1), ("b", 2)}
    assert servers("redis://:pw@127.0.0.1:6379/0") == servers("redis://127.0.0.1:6379/1")
    assert bare_url("nats://u:p@a:1, nats://tok@b:2") == "nats://a:1,nats://b:2"
