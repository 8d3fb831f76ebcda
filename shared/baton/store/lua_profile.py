"""Where a session script's own Lua time goes, line by line (``baton bench lua``).

Redis times a script call as a whole (SLOWLOG, ``INFO commandstats``) and each command it
runs, but not the Lua between them, which is most of a script's time (``baton bench
redis``). With ``BATON_LUA_PROFILE`` set in the environment of every process of a stack,
:func:`~baton.store.scripts.source` hands out each session script with a checkpoint before
each of its statements: the statements at the top of the script's body and those one level
inside a function or block (indented two spaces), never inside a multi-line expression.
A checkpoint reads the server's clock (``TIME``, microseconds) and charges the time since
the previous one to the previous checkpoint's line; when the script ends, the charges and
the number of times each line ran are added to the hash :data:`PROFILE_KEY`:

* ``<script>:<line>``: microseconds charged to the statement that starts at that line of
  ``<script>.lua`` (up to the next checkpoint: a statement that calls a function is charged
  with the function's time up to its own first checkpoint);
* ``<script>:<line>:n``: how many times that checkpoint ran;
* ``<script>:calls``: the calls of the script; ``<script>:prelude`` is what runs before the
  body (the helpers' definitions, the guard of ``corrupt_refusal``, the commit-id wrapper).

Each checkpoint costs time of its own (a ``TIME`` call from Lua), charged to the line it
follows: :func:`checkpoint_cost` measures it on the same server, so that a line's net time is
its charge minus its runs times that cost. For finding hot lines, never for the scripts'
absolute cost: a profiled stack is slower, and the profile key is written by every call.
It is kept on one server whose clients may write it (not a cluster: the key is outside the
session's hash slot; not per-role ACL users); elsewhere the writes are refused and the
profile lost, never the transition. Never set in production.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["ENV", "PROFILE_KEY", "checkpoint_cost", "enabled", "profiled", "profiling", "wrap"]

ENV = "BATON_LUA_PROFILE"
PROFILE_KEY = "baton-lua-profile"

#: Defined before the helpers: the checkpoint and the flush live in fields of KEYS (Redis
#: refuses new globals, and a local would count against the body's upvalue limit).
_HEAD = f"""KEYS.__prof_t, KEYS.__prof_n = {{}}, {{}}
KEYS.__prof_last, KEYS.__prof_at = nil, 0
KEYS.__tp = function(label)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local last = KEYS.__prof_last
  if last then
    KEYS.__prof_t[last] = (KEYS.__prof_t[last] or 0) + now - KEYS.__prof_at
    KEYS.__prof_n[last] = (KEYS.__prof_n[last] or 0) + 1
  end
  KEYS.__prof_last, KEYS.__prof_at = label, now
end
KEYS.__flush = function(script)
  KEYS.__tp(script .. ':end')  -- charges the last line; 'end' itself is never charged
  -- pcall: a profile the server refuses (a cluster's other slot, a role's ACL) is not kept,
  -- and the transition is not failed for it
  for k, v in pairs(KEYS.__prof_t) do
    redis.pcall('HINCRBY', '{PROFILE_KEY}', k, v)
    redis.pcall('HINCRBY', '{PROFILE_KEY}', k .. ':n', KEYS.__prof_n[k])
  end
  redis.pcall('HINCRBY', '{PROFILE_KEY}', script .. ':calls', 1)
end
"""

#: A line that starts a statement: a declaration, a loop or branch, a call or an assignment.
_STATEMENT = re.compile(
    r"^(?:  )?(?:local |for |if |while |repeat\b|return\b|[A-Za-z_][\w.\[\]']*\s*=[^=]"
    r"|[A-Za-z_][\w.:]*\s*\()")
#: How a line that does not end its statement ends: the next one continues it.
_CONTINUED = ("{", ",", "(", "=", " and", " or", "..", "+", "-", "*", "/")


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextlib.contextmanager
def profiling() -> Iterator[None]:
    """Profiled scripts from :func:`~baton.store.scripts.source` in this process while
    inside (and in the processes it starts meanwhile, which inherit the environment); the
    plain ones again after."""
    from baton.store.scripts import library_code, source  # that module imports this one

    previous = os.environ.get(ENV)
    os.environ[ENV] = "1"
    source.cache_clear()  # sources made before now are not profiled
    library_code.cache_clear()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
        source.cache_clear()
        library_code.cache_clear()


def profiled(name: str, body: str) -> str:
    """``body`` (the text of ``<name>.lua``) with a checkpoint before each statement at the
    top or one level in, each labelled ``<name>:<line>``; a statement that continues the
    previous line, or any line in the header's long comment, gets none."""
    lines: list[str] = []
    in_comment = False
    previous = ""
    for number, line in enumerate(body.splitlines(), 1):
        if line.startswith("--[==["):
            in_comment = True
        if (not in_comment and _STATEMENT.match(line)
                and not previous.endswith(_CONTINUED)):
            lines.append(f"KEYS.__tp('{name}:{number}')")
        lines.append(line)
        if in_comment:
            in_comment = "]==]" not in line
            continue
        code = line.split("--", 1)[0].rstrip()
        if code:
            previous = code
    return "\n".join(lines)


def wrap(name: str, head: str, wrapper: str) -> tuple[str, str]:
    """The script's head with the checkpoint's definitions and its first checkpoint (the
    prelude's), and the commit-id wrapper flushing the profile after the body."""
    for call, flushed in (
        ("return __script(ARGV)",
         f"local __reply = __script(ARGV); KEYS.__flush('{name}'); return __reply"),
        ("local reply = __script(ARGV)",
         f"local reply = __script(ARGV); KEYS.__flush('{name}')"),
    ):
        if call not in wrapper:
            raise ValueError(f"_applied.lua no longer calls {call!r}: update lua_profile.wrap")
        wrapper = wrapper.replace(call, flushed)
    return _HEAD + f"KEYS.__tp('{name}:prelude')\n" + head, wrapper


#: A script of checkpoints only: what one costs on a server (see :func:`checkpoint_cost`).
_CALIBRATE = _HEAD + """for _ = 1, tonumber(ARGV[1]) do KEYS.__tp('calibrate:loop') end
KEYS.__flush('calibrate')
return 1
"""


async def checkpoint_cost(redis: Any, n: int = 2000) -> float:
    """Microseconds one checkpoint adds, measured on ``redis`` (a script of ``n`` of them,
    as charged to their own label), removed from the profile key afterwards."""
    await redis.eval(_CALIBRATE, 0, n)
    charged, runs = await redis.hmget(PROFILE_KEY, "calibrate:loop", "calibrate:loop:n")
    await redis.hdel(PROFILE_KEY, "calibrate:loop", "calibrate:loop:n", "calibrate:end",
                     "calibrate:end:n", "calibrate:calls")
    return int(charged or 0) / max(1, int(runs or 0))
