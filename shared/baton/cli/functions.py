"""``baton load-functions``: load this version's scripts into Redis as a function library.

Every role runs Baton's scripts with ``FCALL`` and may not load them (no ``FUNCTION LOAD``,
no ``EVAL``: see baton.auth). The admin loads them once per Baton version, before workers of
that version start (a deploy's setup step; ``baton dev up --secure`` does it itself): a
library's name carries its code's digest, so a new version's library is loaded beside the
old one, which the workers still running go on calling. Loading again is harmless. On a
Redis Cluster every primary gets it; replicas and restarts keep it with the data.
"""

from __future__ import annotations

import click

from baton.cli.common import emit, json_option, run, settings

__all__ = ["load_functions_command"]


@click.command("load-functions")
@json_option("the libraries loaded")
def load_functions_command(as_json: bool) -> None:
    """Load the scripts' function library (BATON_REDIS_URL with the admin's credentials)."""
    from baton.store.redis_client import connect_redis
    from baton.store.scripts import load_functions

    config = settings(log_level="warning", user="admin")

    async def go() -> list[str]:
        redis = connect_redis(config)
        try:
            return await load_functions(redis, config)
        finally:
            await redis.aclose()

    names = run(go())
    emit(as_json, {"libraries": names},
         f"loaded Redis function libraries {', '.join(names)} (with and without ACL checks)")
