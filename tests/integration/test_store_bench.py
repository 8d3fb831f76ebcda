"""``baton bench store`` drives the commit script as :meth:`Store.commit` does.

Its breakdown calls the registered commit script directly (the write-set JSON made
beforehand): the declared key and the argument layout must be the store's own, or the
benchmark fails in a user's hands (as it did once every session script took a commit id
first).
"""

from __future__ import annotations

from baton.bench import store_bench
from baton.store.store import Store


async def test_the_commit_breakdown_calls_the_commit_script_as_the_store_does(
    store: Store,
) -> None:
    cfg = store_bench.Config(split_n=5, warmup=4)
    out = await store_bench.split(store, "tools", cfg)
    # every variant ran: the script's own server time and the client-side p50s
    assert out["server_commit_script_usec"] > 0
    assert out["preserialized_p50_us"] > 0 and out["store_commit_p50_us"] > 0
    assert out["payload_bytes"] > 1_000
