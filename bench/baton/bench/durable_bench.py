"""``bench durable``: ``bench e2e`` on servers that fsync every write, beside durable baselines.

Redis runs with ``appendfsync always`` and JetStream with ``sync_interval: always``, as a
deployment that must not lose an acknowledged write in a power cut runs them; the plain
loop fsyncs its log at each step (lines written in one loop turn share an fsync) and
LangGraph's SQLite checkpointer runs with ``synchronous=FULL``. Everything else is
``bench e2e``'s (:mod:`baton.bench.e2e_bench`), but the scale-out pass: the same targets,
each a ratio to a baseline of the same run, so that what durability costs shows beside what
it costs the contenders. Figures, not assertions: ``bench/results/durable.json``.
"""

from __future__ import annotations

from rich.console import Console

from baton.bench import e2e_bench
from baton.bench.common import Result

NAME = e2e_bench.DURABLE
DESCRIPTION = "bench e2e on servers that fsync every write, beside durable baselines"


async def run(quick: bool = False, console: Console | None = None) -> Result:
    return await e2e_bench.run(quick, console, durable=True)
