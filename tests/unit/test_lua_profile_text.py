"""Where :func:`baton.store.lua_profile.profiled` puts its checkpoints (pure text)."""

from __future__ import annotations

from baton.bench.lua_bench import lines_by_script
from baton.store.lua_profile import profiled

BODY = """--[==[ demo.lua: a header
local x = 1   (inside the header: no checkpoint)
]==]
local a = redis.call('GET', K_META)
local t = {
  b = 1,
  c = 2,
}
local function f(v)
  if v then return 1 end
  return 2
end
if a and
    x then
  a = a .. 'x'
end
return f(a), t,
  x
"""


def checkpointed(text: str) -> list[int]:
    """The line numbers (of BODY) each checkpoint stands before."""
    out, number = [], 0
    for line in text.splitlines():
        if line.startswith("KEYS.__tp('demo:"):
            out.append(int(line.split(":")[1].rstrip("')")))
        else:
            number += 1
    return out


def test_checkpoints_stand_before_statements_only() -> None:
    text = profiled("demo", BODY)
    # statements at the top and one level in; never in the header, a table constructor or
    # the continuation of a statement
    assert checkpointed(text) == [4, 5, 9, 10, 11, 13, 15, 17]
    assert [line for line in text.splitlines() if not line.startswith("KEYS.__tp")] \
        == BODY.splitlines()


def test_lines_by_script_subtracts_the_checkpoints() -> None:
    profile = {"commit:calls": 4, "commit:prelude": 40, "commit:prelude:n": 4,
               "commit:12": 100, "commit:12:n": 8, "claim:calls": 2, "claim:9": 30,
               "claim:9:n": 10}
    got = lines_by_script(profile, 1.5, 2)
    assert got["commit"]["calls"] == 2
    assert got["commit"]["lines"]["12"] == {"net_us": (100 - 8 * 1.5) / 2, "runs": 4}
    assert got["commit"]["net_us"] == (40 - 6) / 2 + (100 - 12) / 2
    assert got["claim"]["net_us"] == (30 - 15) / 2
