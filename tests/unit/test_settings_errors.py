"""Invalid settings are a ConfigError naming the setting (its variable, from the
environment) and never its value: a bad BATON_REDIS_URL was 'unexpected ValueError ... (a bug
in baton)', and Settings(...) raised pydantic's own error."""

from __future__ import annotations

import pytest

from baton import ConfigError, Settings


@pytest.mark.parametrize("url", ["http://user:secret@127.0.0.1:1/0", "notaurl"])
def test_a_redis_url_of_another_scheme_names_the_variable_not_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match="BATON_REDIS_URL: a Redis URL starts with "
                                          "redis://") as caught:
        Settings.from_env({"BATON_REDIS_URL": url})
    assert "secret" not in str(caught.value)


def test_settings_made_in_code_name_the_field() -> None:
    with pytest.raises(ConfigError, match="invalid settings: namespace: String should match"):
        Settings(namespace="Bad NS")
    with pytest.raises(ConfigError, match="redis_url: Input should be a valid string"):
        Settings(redis_url=5)  # type: ignore[arg-type]
    for url in ("redis://h:1/0", "rediss://h:1/0", "unix:///r.sock", "redis+cluster://a:1,b:2",
                "rediss+cluster://a:1"):
        assert Settings(redis_url=url).redis_url == url
