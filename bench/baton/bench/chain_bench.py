"""The raw hop chain Baton's pipeline is built from, without Baton: the floor to compare with.

One chain, on a private ``redis-server`` and ``nats-server`` (fast mode: no AOF, JetStream's
default sync), in this one process::

    fenced commit (Lua: check fence + HSET + HINCRBY + XADD outbox row)
      -> relay: blocking XREADGROUP -> js.publish_async with Nats-Msg-Id, PubAck
         -> one pipeline XACK + XDEL
      -> pull consumer: fetch (batch up to 64, as Baton's workers fetch) -> fenced commit (Lua)
         -> msg.ack()

Measured per chain (the producer waits until the consumer has committed and acked) at one
flow (p50 / p99) and at 16 concurrent flows (chains/s), plus the single hops on the same
servers: PING, the fenced commit, js.publish with its PubAck. ``bench e2e`` runs the same
chain in its own run, next to Baton's tool round trip.
Figures, not assertions: a table on stdout and ``bench/results/chain.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from redis.asyncio import Redis
from rich.console import Console

from baton.bench.common import Probe, Result, Row, concurrent, environment, print_rows, sequential
from baton.devkit.servers import EmbeddedStack

NAME = "chain"
DESCRIPTION = "raw hop chain: Lua commit -> relay -> JetStream -> pull fetch -> Lua commit -> ack"

# A fenced commit: all checks before the first write, then state, sequence and one stream
# row (the outbox row on the producer side, a result row on the consumer side).
# KEYS: 1 meta hash, 2 stream.  ARGV: 1 fence, 2 state, 3 subject, 4 data, 5 stream maxlen
COMMIT_LUA = """
local fence = redis.call('HGET', KEYS[1], 'fence')
if fence ~= ARGV[1] then
  return redis.error_reply('STALE_FENCE ' .. ARGV[1] .. ' ' .. tostring(fence))
end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local args = {'XADD', KEYS[2]}
if ARGV[5] ~= '' then table.insert(args, 'MAXLEN'); table.insert(args, '~');
  table.insert(args, ARGV[5]) end
table.insert(args, '*')
for _, v in ipairs({'id', KEYS[1] .. '/' .. seq, 'subj', ARGV[3], 'data', ARGV[4]}) do
  table.insert(args, v)
end
redis.call(unpack(args))
return seq
"""

GROUP = "relay"
COMMIT_HOP = "fenced commit (Lua + XADD)"
FULL_CHAIN = "full chain"
_BLOCK_MS = 500  # longest block of the relay's read and the consumer's fetch
STATE = '{"phase":"apply","turn":1,"group":"g-1","runs":["g-1-0"]}'


@dataclass(frozen=True)
class Config:
    hop_n: int = 2_000
    chains: int = 1_000  # sequential chains at one flow
    warmup: int = 100
    flows: int = 16
    per_flow: int = 150
    flow_warmup: int = 10


QUICK = Config(hop_n=300, chains=200, warmup=30, per_flow=40, flow_warmup=5)


class Chain:
    """Relay and consumer loops over one outbox stream, one JetStream stream and consumer."""

    def __init__(self, redis_url: str, nats_url: str, prefix: str) -> None:
        self.redis_url = redis_url
        self.nats_url = nats_url
        self.prefix = prefix
        self.outbox = f"{prefix}:outbox"
        self.results = f"{prefix}:results"
        self.stream = prefix.upper().replace("-", "_")
        self.subject = f"{prefix}.tool.work"
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.rows = 0
        self.batches = 0
        self.fetches = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        # The loops stop on this event: redis-py may swallow a cancellation that lands in a
        # blocked XREADGROUP (redis/redis-py#2028), so cancelling alone can hang stop().
        self.stopping = asyncio.Event()

    async def start(self) -> None:
        # One client per role, as separate processes would have; the relay's blocking read
        # holds its connection for the whole block, so it gets its own client.
        self.producer = Redis.from_url(self.redis_url, decode_responses=True)
        self.relay_redis = Redis.from_url(self.redis_url, decode_responses=True)
        self.consumer_redis = Redis.from_url(self.redis_url, decode_responses=True)
        self.commit = self.producer.register_script(COMMIT_LUA)
        self.consumer_commit = self.consumer_redis.register_script(COMMIT_LUA)
        self.relay_nc: NatsClient = await nats.connect(self.nats_url, name="chain-relay")
        self.consumer_nc: NatsClient = await nats.connect(self.nats_url, name="chain-consumer")
        self.js = self.relay_nc.jetstream()
        cjs = self.consumer_nc.jetstream()
        await self.js.add_stream(StreamConfig(
            name=self.stream, subjects=[f"{self.prefix}.tool.>"],
            retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
            duplicate_window=120.0))
        await self.js.add_consumer(self.stream, ConsumerConfig(
            durable_name="work", ack_policy=AckPolicy.EXPLICIT, ack_wait=5.0,
            max_ack_pending=1000, filter_subject=self.subject))
        with contextlib.suppress(Exception):
            await self.relay_redis.xgroup_create(self.outbox, GROUP, id="0", mkstream=True)
        self.sub = await cjs.pull_subscribe_bind(durable="work", stream=self.stream)
        self._spawn(self._relay_loop())
        self._spawn(self._consume_loop())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        self.stopping.set()
        tasks = set(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=_BLOCK_MS / 1000 + 1)  # loops end within a block
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        for nc in (self.relay_nc, self.consumer_nc):
            with contextlib.suppress(Exception):
                await nc.close()
        for r in (self.producer, self.relay_redis, self.consumer_redis):
            await r.aclose()

    async def open_flow(self, k: int) -> Flow:
        """A flow: a producer-side session and a consumer-side run, each under fence 1."""
        flow = Flow(self, f"{self.prefix}:s{k}", f"{self.prefix}:r{k}")
        await self.producer.hset(flow.session, "fence", "1")
        await self.producer.hset(flow.run, "fence", "1")
        return flow

    async def _relay_loop(self) -> None:
        r = self.relay_redis
        while not self.stopping.is_set():
            reply = await r.xreadgroup(GROUP, "relay-1", {self.outbox: ">"}, count=256,
                                       block=_BLOCK_MS)
            entries = [e for _, per in _items(reply) for e in per]
            if not entries:
                continue
            futures = [
                await self.js.publish_async(f["subj"], f["data"].encode(),
                                            headers={"Nats-Msg-Id": f["id"]})
                for _, f in entries
            ]
            await asyncio.gather(*futures)
            ids = [sid for sid, _ in entries]
            async with r.pipeline(transaction=False) as p:
                p.xack(self.outbox, GROUP, *ids)
                p.xdel(self.outbox, *ids)
                await p.execute()
            self.rows += len(ids)
            self.batches += 1

    async def _consume_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                msgs = await self.sub.fetch(64, timeout=_BLOCK_MS / 1000)
            except TimeoutError:
                continue
            self.fetches += 1
            for msg in msgs:
                self._spawn(self._handle(msg))

    async def _handle(self, msg: Msg) -> None:
        token, run = msg.data.decode().split("|", 1)
        await self.consumer_commit(keys=[run, self.results], args=["1", STATE, "", token, "1000"])
        await msg.ack()
        future = self.waiting.pop(token, None)
        if future is not None and not future.done():
            future.set_result(None)


@dataclass
class Flow:
    chain: Chain
    session: str
    run: str

    async def once(self, _i: int) -> None:
        """One full chain: commit here, return once the consumer committed and acked."""
        c = self.chain
        token = uuid.uuid4().hex
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        c.waiting[token] = done
        await c.commit(keys=[self.session, c.outbox],
                       args=["1", STATE, c.subject, f"{token}|{self.run}", ""])
        async with asyncio.timeout(10):
            await done


def _items(reply: Any) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    items = list(reply.items()) if isinstance(reply, dict) else list(reply or [])
    out = []
    for key, entries in items:
        if len(entries) == 1 and entries[0] and not isinstance(entries[0][0], str):
            entries = entries[0]  # RESP3 wraps the entry list once more
        out.append((key, entries))
    return out


HOPS = ("ping", "commit", "publish")  # the single hops measure() can time


async def measure(redis_url: str, nats_url: str, cfg: Config, mode: str = "fast",
                  hops: Collection[str] = HOPS, probe: Probe | None = None) -> list[Row]:
    """Chain rows (and the single-hop rows named in ``hops``) on already running servers.

    ``probe`` reads the servers' CPU seconds (``bench e2e`` reads them from /proc): the rows
    of the fenced commit and of the chain at many flows then carry the servers' CPU per call
    beside this process's, so a chain's whole cost is known.
    """
    chain = Chain(redis_url, nats_url, f"chain-{uuid.uuid4().hex[:8]}")
    await chain.start()
    rows: list[Row] = []
    try:
        r = chain.producer
        if "ping" in hops:
            rows.append(Row.from_run(mode, "PING (redis-py)", await sequential(
                lambda _: r.ping(), cfg.hop_n, cfg.warmup)))
        if "commit" in hops:
            await r.hset(f"{chain.prefix}:hop", "fence", "1")
            keys = [f"{chain.prefix}:hop", f"{chain.prefix}:hop-log"]
            rows.append(Row.from_run(mode, COMMIT_HOP, await sequential(
                lambda _: chain.commit(keys=keys, args=["1", STATE, "x", "y", "1000"]),
                cfg.hop_n, cfg.warmup, probe)))
        if "publish" in hops:
            js = chain.js
            side = f"{chain.prefix}.side"
            await js.add_stream(StreamConfig(name=f"{chain.stream}_SIDE", subjects=[side],
                                             storage=StorageType.FILE, max_msgs=10_000))
            rows.append(Row.from_run(mode, "js.publish + PubAck (Msg-Id)", await sequential(
                lambda i: js.publish(side, b"x" * 100, headers={"Nats-Msg-Id": f"m{i}"}),
                cfg.hop_n, cfg.warmup)))
        flow = await chain.open_flow(0)
        rows.append(Row.from_run(mode, FULL_CHAIN, await sequential(
            flow.once, cfg.chains, cfg.warmup)))
        flows = [await chain.open_flow(k + 1) for k in range(cfg.flows)]
        run = await concurrent([f.once for f in flows], cfg.per_flow, cfg.flow_warmup, probe)
        rows.append(Row.from_run(mode, FULL_CHAIN, run, writers=cfg.flows,
                                 note=f"{cfg.flows} concurrent flows"))
    finally:
        await chain.stop()
    return rows


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    started = time.perf_counter()
    async with EmbeddedStack() as servers:  # private temp dirs, removed on stop
        rows = await measure(servers.redis_url, servers.nats_url, cfg)
    elapsed = time.perf_counter() - started
    ping = rows[0].p50_us
    for row in rows:
        if row.writers == 1:
            row.ratio = row.p50_us / ping
    print_rows("Raw hop chain, fast mode (µs; one process; ratio = p50 / PING p50)", rows,
               console)
    console.print(f"[dim]load average {env['loadavg_1m']:.2f}; {elapsed:.1f} s[/dim]")
    return Result(NAME, rows, env=env, extra={"config": asdict(cfg),
                                              "elapsed_s": round(elapsed, 2)})

