"""A Redis primary cut off from the rest of its cluster, with a Brain-like writer beside it.

Six cluster nodes, each in its own network namespace; the writer runs as its own process in
the namespace of the primary serving its sessions, so once the cut falls it reaches that
primary only: the minority side. The majority promotes the primary's replica. Every write
the writer makes on the minority side fails (no replica acknowledges it: in doubt, then
refused by the split-brain guard) instead of being acknowledged; after the heal the old
primary rejoins as a replica (dropping what it applied alone) and the writer goes on. The
writer logs every acknowledgement it got; each one must be in the store afterwards, exactly
once, with no fence going backwards.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from baton.devkit.netns import Netns
from baton.devkit.redis_cluster import (
    RedisClusterNode,
    RedisClusterServers,
    parse_cluster_nodes,
)
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.store import Store
from tests.helpers import eventually

pytestmark = pytest.mark.partition

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "part"
SESSIONS = 4


def _log_file(path: Path) -> IO[bytes]:
    return path.open("wb")


def _acks(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def _promoted_elsewhere(node: RedisClusterNode, old: RedisClusterNode, slot: int) -> bool:
    """Whether ``node`` (on the majority side) sees a primary other than ``old`` serving
    ``slot`` and the cluster state ok."""
    async with Redis(host=node.host, port=node.port, decode_responses=True,
                     socket_connect_timeout=0.5, socket_timeout=1.0) as r:
        topo = parse_cluster_nodes(await r.execute_command("CLUSTER", "NODES"))
        info = await r.execute_command("CLUSTER", "INFO")
    ok = "cluster_state:ok" in str(info) or (isinstance(info, dict)
                                             and info.get("cluster_state") == "ok")
    return ok and any(i.role == "primary" and i.address != old.address and not i.failed
                      and i.serves(slot) for i in topo)


async def test_a_primary_cut_off_with_its_writer_acknowledges_nothing_split_brain(
    tmp_path: Path,
) -> None:
    members = [f"r{i}" for i in range(6)]
    with Netns(members) as net:
        cluster = RedisClusterServers(tmp_path / "redis", node_timeout_ms=1_000,
                                      min_replicas_max_lag_s=3)
        for node, member in zip(cluster.nodes, members, strict=True):
            net.place(node, member)
        async with cluster:
            keys = Keys(NAMESPACE, 16)
            # Sessions that all live on one primary: the one the writer will sit beside.
            first = await cluster.primary_for_key(keys.session("p0").meta)
            sids = []
            n = 0
            while len(sids) < SESSIONS:
                sid = f"p{n}"
                if await cluster.primary_for_key(keys.session(sid).meta) is first:
                    sids.append(sid)
                n += 1
            slot = key_slot(keys.session(sids[0]).meta.encode())
            victim = first
            side = members[cluster.nodes.index(victim)]
            majority = [nd for nd in cluster.nodes if nd is not victim]
            ack_log, err = tmp_path / "acks.jsonl", _log_file(tmp_path / "writer.log")
            writer = await asyncio.create_subprocess_exec(
                *net.wrapper(side), sys.executable, "-m", "tests.partition.writer",
                cluster.url, NAMESPACE, str(ack_log), *sids, cwd=ROOT,
                stdout=asyncio.subprocess.DEVNULL, stderr=err)
            try:
                def entries_per_session(at_least: int) -> bool:
                    got = Counter(a["sid"] for a in _acks(ack_log) if a["kind"] == "entry")
                    return all(got[s] >= at_least for s in sids)

                await eventually(lambda: entries_per_session(5), timeout=30)
                net.split([side])  # the writer stays with its primary: the minority side
                cut_at = len(_acks(ack_log))
                # The majority promotes the replica (its own view, asked on its side).
                await eventually(lambda: _promoted_elsewhere(majority[0], victim, slot),
                                 timeout=30)

                def failed_since_cut() -> bool:
                    return any(a["kind"] == "fail" for a in _acks(ack_log)[cut_at:])

                await eventually(failed_since_cut, timeout=30)
                net.heal()
                await cluster.wait_ready(timeout=60)
                healed_at = len(_acks(ack_log))
                await eventually(
                    lambda: sum(1 for a in _acks(ack_log)[healed_at:] if a["kind"] == "entry")
                    >= 2 * SESSIONS, timeout=60)
                writer.terminate()
                async with asyncio.timeout(60):
                    assert await writer.wait() == 0, (tmp_path / "writer.log").read_text()[-3000:]
            finally:
                if writer.returncode is None:
                    writer.kill()
                    await writer.wait()
                err.close()

            acks = _acks(ack_log)
            store = await Store.connect(Settings(redis_url=cluster.url, namespace=NAMESPACE,
                                                 shards=16))
            try:
                entries: dict[str, list[str]] = defaultdict(list)
                fences: dict[str, list[int]] = defaultdict(list)
                for a in acks:
                    if a["kind"] == "entry":
                        entries[a["sid"]].append(a["text"])
                    elif a["kind"] == "lease":
                        fences[a["sid"]].append(a["fence"])
                for sid in sids:
                    assert any(a["kind"] == "submit" and a["sid"] == sid for a in acks)
                    assert await store.redis.hget(store.keys.session(sid).subs, f"sub-{sid}")
                    stored = Counter(e.text for e in await store.entries(sid))
                    for text in entries[sid]:
                        assert stored[text] == 1, (sid, text, stored[text])
                    assert fences[sid] == sorted(set(fences[sid])), (sid, fences[sid])
                # The old primary came back as a replica of the promoted one.
                topo = await cluster.topology()
                assert any(i.address == victim.address and i.role == "replica" for i in topo)
            finally:
                await store.close()
