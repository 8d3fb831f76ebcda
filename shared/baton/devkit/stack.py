"""Where a running stack is described: ``.baton/dev.json``.

``baton dev`` writes it (in the current directory, or ``$BATON_HOME``); other commands read
it to find Redis, NATS and the mail service when the environment does not say.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


def servers(url: str) -> set[tuple[str, int | None]]:
    """The ``(host, port)`` pairs a Redis or NATS URL (or a comma-separated list) names:
    what two spellings of the same servers share, with or without a user or password."""
    found = set()
    for one in url.split(","):
        try:
            parts = urlsplit(one.strip())
            found.add(((parts.hostname or "").lower(), parts.port))
        except ValueError:  # a port that is no number: compared as written
            found.add((one.strip(), None))
    return found


def bare_url(url: str) -> str:
    """``url`` (or a comma-separated list) without user or password: fit for any message."""
    return ",".join(f"{scheme}{sep}{rest.rpartition('@')[2]}"
                    for scheme, sep, rest in (one.strip().partition("://")
                                              for one in url.split(",")))


def overriding_variables(info: dict[str, Any], env: dict[str, str] | None = None) -> str:
    """A warning when ``BATON_REDIS_URL`` or ``BATON_NATS_URL`` in ``env`` names other
    servers than the stack ``info`` describes (its dev.json), else "". Set, they win over
    the stack in every command run with that environment (:func:`settings_from_env_or_stack`),
    typically left exported for a stack that has since been replaced."""
    env = dict(os.environ) if env is None else env
    other = [f"{name} ({bare_url(env[name])})"
             for key, name in (("redis_url", "BATON_REDIS_URL"), ("nats_url", "BATON_NATS_URL"))
             if env.get(name) and info.get(key)
             and servers(env[name]) != servers(str(info[key]))]
    if not other:
        return ""
    them = "it" if len(other) == 1 else "them"
    return (f"warning: {' and '.join(other)} in this environment "
            f"{'names' if len(other) == 1 else 'name'} other servers than this stack's and "
            f"{'wins' if len(other) == 1 else 'win'} over it in commands run from this shell: "
            f'unset {them}, or run eval "$(baton dev status --env)"')


#: What an operator's credential replaces for the read-only commands: ``BATON_OPERATOR_<X>``
#: is used as ``BATON_<X>`` when set (see :func:`settings_from_env_or_stack`).
OPERATOR_ENV = ("REDIS_URL", "NATS_USER", "NATS_PASSWORD", "NATS_CREDS")


def settings_from_env_or_stack(user: str = "client", **overrides: Any) -> Settings:
    """Settings from ``BATON_*``; URLs not set there come from a running ``baton dev``.

    ``user="operator"`` (the read-only commands: inspect, trace, watch) takes the operator's
    credential where one is configured: ``BATON_OPERATOR_REDIS_URL`` and
    ``BATON_OPERATOR_NATS_USER``/``_PASSWORD``/``_CREDS``, or a secure stack's ``operator``
    user (baton.devkit.secure); else the client's, as every other command.
    """
    env = dict(os.environ)
    if user == "operator":
        env |= {f"BATON_{x}": env[f"BATON_OPERATOR_{x}"] for x in OPERATOR_ENV
                if env.get(f"BATON_OPERATOR_{x}")}
    stack = read_stack(env) or {}
    # A secure stack's servers speak TLS with the stack's own CA (baton.devkit.tls).
    tls_ca = {"BATON_REDIS_URL": "BATON_REDIS_TLS_CA", "BATON_NATS_URL": "BATON_NATS_TLS_CA"}
    for key, name in (("redis_url", "BATON_REDIS_URL"), ("nats_url", "BATON_NATS_URL"),
                      ("mail_url", "BATON_MAIL_URL"), ("namespace", "BATON_NAMESPACE"),
                      ("archive_url", "BATON_ARCHIVE_URL")):
        if not env.get(name) and stack.get(key):
            env[name] = str(stack[key])
            if stack.get("secure"):
                env |= _stack_user(stack, name, user, env)
            if name in tls_ca and stack.get("tls_ca") and not env.get(tls_ca[name]):
                env[tls_ca[name]] = str(stack["tls_ca"])
    return Settings.from_env(env, **overrides)


def _stack_user(stack: dict[str, Any], name: str, user: str,
                env: dict[str, str]) -> dict[str, str]:
    """A secure stack's credential (baton.devkit.secure) for the server of ``name``: Redis
    as ``user`` when the stack has that user, else as ``client``; NATS as ``operator`` for
    the operator (clients use no NATS subject), unless the environment names a NATS user."""
    from baton.devkit.secure import load_credentials, with_user

    found = load_credentials(Path(str(stack.get("base_dir", "")))) or {}
    if name == "BATON_REDIS_URL":
        for who in (user, "client"):
            if who in found:
                return {name: with_user(env[name], who, found[who])}
    elif (name == "BATON_NATS_URL" and user == "operator" and "operator" in found
          and not (env.get("BATON_NATS_USER") or env.get("BATON_NATS_CREDS"))):
        return {"BATON_NATS_USER": "operator", "BATON_NATS_PASSWORD": found["operator"]}
    return {}
