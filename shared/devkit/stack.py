"""Where a running stack is described: ``.baton/dev.json``.

``baton dev`` writes it (in the current directory, or ``$BATON_HOME``); other commands read
it to find Redis, NATS and the mail service when the environment does not say.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from baton.settings import Settings


def home(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env.get("BATON_HOME") or Path.cwd() / ".baton")


def stack_file(env: dict[str, str] | None = None) -> Path:
    return home(env) / "dev.json"


def read_stack(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    path = stack_file(env)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def write_stack(info: dict[str, Any], env: dict[str, str] | None = None) -> Path:
    path = stack_file(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(path)
    return path


def settings_from_env_or_stack(**overrides: Any) -> Settings:
    """Settings from ``BATON_*``; URLs not set there come from a running ``baton dev``."""
    env = dict(os.environ)
    stack = read_stack(env) or {}
    # A secure stack's servers speak TLS with the stack's own CA (baton.devkit.tls).
    tls_ca = {"BATON_REDIS_URL": "BATON_REDIS_TLS_CA", "BATON_NATS_URL": "BATON_NATS_TLS_CA"}
    for key, name in (("redis_url", "BATON_REDIS_URL"), ("nats_url", "BATON_NATS_URL"),
                      ("mail_url", "BATON_MAIL_URL"), ("namespace", "BATON_NAMESPACE")):
        if not env.get(name) and stack.get(key):
            env[name] = str(stack[key])
            if name == "BATON_REDIS_URL" and stack.get("secure"):
                env[name] = _client_url(stack)
            if name in tls_ca and stack.get("tls_ca") and not env.get(tls_ca[name]):
                env[tls_ca[name]] = str(stack["tls_ca"])
    return Settings.from_env(env, **overrides)


def _client_url(stack: dict[str, Any]) -> str:
    """A secure stack's Redis URL as its ``client`` user (baton.devkit.secure)."""
    from baton.devkit.secure import load_credentials, with_user

    found = load_credentials(Path(str(stack.get("base_dir", "")))) or {}
    url = str(stack["redis_url"])
    return with_user(url, "client", found["client"]) if "client" in found else url
