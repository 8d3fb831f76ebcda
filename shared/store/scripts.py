"""Loads Baton's Lua scripts (``shared/lua/*.lua``), each prefixed with ``_lib.lua``.

Scripts are registered with redis-py, which runs them by SHA and reloads them after a
server restart flushed its script cache.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

SESSION_SCRIPTS = (
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
)
SHARD_SCRIPTS = ("fire_timers",)


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
