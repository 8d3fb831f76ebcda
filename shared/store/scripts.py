"""Loads Baton's Lua scripts (``shared/lua/*.lua``), each prefixed with ``_lib.lua``, and
runs the session scripts.

Scripts are registered with redis-py, which runs them by SHA and reloads them after a
server restart flushed its script cache. :class:`ScriptRunner` is the one way a session
transition reaches Redis: the store, the tool-run transitions and the operator decisions
all share it, so every transition maps Redis errors to Baton's error tree the same way.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal, get_args

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

from baton.errors import PayloadTooLarge, from_redis_error
from baton.settings import Settings
from baton.store.keys import SessionKeys
from baton.store.redis_client import REDIS_ERRORS, redis_user

SessionScript = Literal[
    "submit",
    "start",
    "acquire",
    "renew",
    "release",
    "commit",
    "claim",
    "heartbeat",
    "complete",
    "partial",
    "cancel",
    "approve",
]
SESSION_SCRIPTS: tuple[str, ...] = get_args(SessionScript)
SHARD_SCRIPTS = ("fire_timers", "relay_lease", "relay_ack")


@cache
def source(name: str, *, acl_checks: bool = True) -> str:
    """The full source of a script as sent to Redis.

    ``acl_checks``: whether the script checks, before its first write, that the caller's
    ACL allows every write it will make (see ``acl_refusal`` in _lib.lua). Needed only for
    a restricted ACL user; the checks cost tens of microseconds of server time per call.
    """
    lua = resources.files("baton.store") / "lua"
    body = (lua / f"{name}.lua").read_text()
    if name in SESSION_SCRIPTS:
        flag = f"local ACL_CHECKS = {'true' if acl_checks else 'false'}\n"
        return flag + (lua / "_lib.lua").read_text() + "\n" + body
    return body


class Scripts:
    """The registered scripts of one Redis client."""

    def __init__(self, redis: Redis, *, acl_checks: bool = True) -> None:
        self._scripts: dict[str, AsyncScript] = {
            name: redis.register_script(source(name, acl_checks=acl_checks))
            for name in SESSION_SCRIPTS + SHARD_SCRIPTS
        }

    def __getattr__(self, name: str) -> AsyncScript:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None


class ScriptRunner:
    """Runs session scripts over one session's keys; one per :class:`~baton.store.store.Store`.

    A named ACL user may lack a command a script runs later, so its scripts check that before
    writing (``acl_checks``); the default user skips the checks.
    """

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.role = redis_user(settings)
        self.registered = Scripts(redis, acl_checks=self.role != "default")
        self.namespace = settings.namespace
        self.max_payload_bytes = settings.max_payload_bytes

    async def run(
        self, script: SessionScript, sk: SessionKeys, args: list[Any], run_id: str = ""
    ) -> Any:
        """The script's reply; a Redis error becomes the matching :class:`BatonError`."""
        try:
            return await getattr(self.registered, script)(keys=sk.all(), args=args)
        except REDIS_ERRORS as exc:
            raise from_redis_error(
                exc, session_id=sk.session_id, run_id=run_id, role=self.role,
                namespace=self.namespace,
            ) from None

    async def queue(
        self, pipe: Pipeline, script: SessionScript, sk: SessionKeys, args: list[Any]
    ) -> None:
        """Queue the script in a MULTI/EXEC pipeline; its reply (or error) comes with the rest."""
        await getattr(self.registered, script)(keys=sk.all(), args=args, client=pipe)

    def check_size(self, payload: str | list[str], what: str) -> None:
        """``PayloadTooLarge`` when ``payload`` is over ``max_payload_bytes``."""
        size = len(payload) if isinstance(payload, str) else sum(map(len, payload))
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"{what} is {size} bytes, over the {self.max_payload_bytes} limit", size=size
            )
