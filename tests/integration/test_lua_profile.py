"""``baton bench lua``'s profiled scripts: every session script still compiles and answers
as before, each call adds its lines' time and runs to the profile key, and a server that
refuses that key fails no transition (real Redis)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from redis import asyncio as aioredis

from baton.bench.lua_bench import lines_by_script
from baton.client import Client
from baton.models import WorkerRef
from baton.settings import Settings
from baton.store import lua_profile
from baton.store.runs import worker_json
from baton.store.scripts import SESSION_SCRIPTS, library_code, load_functions, source
from baton.store.store import Store
from tests.integration.confinement import OWN, Confined

BRAIN = WorkerRef(role="brain", name="brain-profiled", pid=os.getpid())


@pytest.fixture
def profiling() -> Iterator[None]:
    with lua_profile.profiling():
        yield


async def test_every_profiled_session_script_compiles(profiling: None,
                                                      redis: aioredis.Redis) -> None:
    for name in SESSION_SCRIPTS:
        for acl_checks in (False, True):
            text = source(name, acl_checks=acl_checks)
            assert f"KEYS.__tp('{name}:prelude')" in text
            await redis.script_load(text)  # a syntax error fails here
    for acl_checks in (True, False):  # and as the function library it is loaded as
        await redis.function_load(library_code(acl_checks)[1], replace=True)


async def test_a_profiled_session_runs_and_is_profiled(profiling: None, settings: Settings,
                                                       redis: aioredis.Redis) -> None:
    before = {k.decode(): int(v) for k, v in (await redis.hgetall(lua_profile.PROFILE_KEY)).items()}
    client = await Client.connect(settings)
    store = await Store.connect(settings)
    try:
        sub, created = await client.submit("hello", agent="profiled")
        assert created
        lease, state = await store.acquire_and_load(sub.session_id, BRAIN, 30_000)
        assert lease.fence == 1 and not lease.takeover
        assert state.meta.agent == "profiled"  # the session opened for the submitted request
        cost = await lua_profile.checkpoint_cost(redis)
    finally:
        await store.close()
        await client.store.close()
    after = {k.decode(): int(v) for k, v in (await redis.hgetall(lua_profile.PROFILE_KEY)).items()}
    added = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert added["submit:calls"] == 1 and added["acquire:calls"] == 1
    assert added["acquire:prelude:n"] == 1
    lines = {k for k in added if k.startswith("acquire:") and k.split(":")[1].isdigit()}
    assert lines, added  # the body's statements were charged
    assert not any(k.startswith("calibrate:") for k in after)  # the calibration cleaned up
    assert 0 < cost < 1000
    scripts = lines_by_script(added, 0.0, 1)
    assert scripts["acquire"]["calls"] == 1
    assert scripts["acquire"]["net_us"] == sum(
        v for k, v in added.items() if k.startswith("acquire:") and k.count(":") == 1
        and not k.endswith(":calls"))


async def test_a_profile_the_server_refuses_fails_no_transition(profiling: None,
                                                                confined: Confined) -> None:
    """A role whose ACL may not write the profile key (every role of a deployment) still
    takes its lease: the profile is lost, not the transition."""
    admin = confined.connect("admin")
    try:  # the profiled library, as an admin would load it for the bench
        await load_functions(admin, Settings())
    finally:
        await admin.aclose()
    store = await Store.connect(confined.settings("brain"))
    try:
        # the lease alone (page 0): the seeded session's records are not a Brain's to load
        fence, _holder, _takeover = await store.scripts.run(
            "acquire", confined.keys.session(OWN),
            [BRAIN.name, 30_000, worker_json(BRAIN), "", 0])
    finally:
        await store.close()
    assert fence == 6
    admin = confined.connect("admin")
    try:
        assert not await admin.exists(lua_profile.PROFILE_KEY)
    finally:
        await admin.aclose()
