"""Baton's benchmarks: figures, not assertions (``baton bench``, ``make bench``).

Each benchmark is a module with ``NAME``, ``DESCRIPTION`` and ``async def run(quick, console)
-> Result``, registered in :data:`BENCHES`. Results are printed as a table and written to
``bench/results/<name>.json`` (gitignored).
"""

from __future__ import annotations

#: name -> module implementing it, imported only when selected.
BENCHES: dict[str, str] = {
    "store": "baton.bench.store_bench",
    "chain": "baton.bench.chain_bench",
    "e2e": "baton.bench.e2e_bench",
    "durable": "baton.bench.durable_bench",
    "docs": "baton.bench.doc_bench",
    "takeover": "baton.bench.takeover_bench",
    "history": "baton.bench.history_bench",
    "cli": "baton.bench.cli_bench",
    "replica": "baton.bench.replica_bench",
    "topology": "baton.bench.topology_bench",
    "fanout": "baton.bench.fanout_bench",
    "models": "baton.bench.model_bench",
    "adversarial": "baton.bench.adversarial_bench",
    "sse": "baton.bench.sse_bench",
    "cold": "baton.bench.cold_bench",
    "obs": "baton.bench.obs_bench",
    "redis": "baton.bench.redis_time_bench",
    "lua": "baton.bench.lua_bench",
    "holds": "baton.bench.holds_bench",
    "soak": "baton.bench.soak_bench",
    "nodeloss": "baton.bench.node_loss_bench",
    "limits": "baton.bench.limits_bench",
}

__all__ = ["BENCHES"]
