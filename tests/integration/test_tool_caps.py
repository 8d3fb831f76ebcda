"""A tool capped for the whole fleet (``max_concurrency=3``) on real Redis, NATS and the
mail service, which counts the sends in flight: four Hands of eight slots each never put
more than three on it, and the runs beyond the cap wait in line in Redis, not in NATS. And
a tool at a rate (``rate="20/s"``): three Hands' sends reach the mail service no faster.

The mail service's hold (``POST /hold``: every send is recorded and waits for the
release) stops the fleet at a known point instead of racing a delay: with every slot taken
and nothing answered, exactly three sends are in, whatever the machine's load.
"""

from __future__ import annotations

import io
from collections import Counter
from datetime import datetime

import httpx
import pytest
from opentelemetry.trace import SpanKind
from rich.console import Console

from baton.brain.worker import BrainWorker
from baton.bus.bus import Bus
from baton.cli.inspect import cluster_view, render_cluster, session_view
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.hands.worker import HandsWorker
from baton.models import ToolDispatch
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.limits import Limits
from baton.store.redis_client import connect_redis
from tests.helpers import eventually, running
from tests.integration.capped_apps import CAP, RATE, app, capped_email, rated_app
from tests.otel_host import host_telemetry

pytestmark = pytest.mark.slow

HANDS, SLOTS = 4, 8


def notice(n: int) -> str:
    to = ", ".join(f"c{n}-{i}@example.com" for i in range(5))
    return f"Send the approved notice to {to}, then summarise."


async def test_four_hands_never_put_more_than_the_cap_on_the_mail_service(
    settings: Settings,
) -> None:
    async with MailboxServer(delay_ms=20) as mailbox, httpx.AsyncClient(
            base_url=mailbox.url) as http:
        s = settings.model_copy(update={"mail_url": mailbox.url, "hands_concurrency": SLOTS})

        def named(name: str) -> Settings:
            return s.model_copy(update={"worker_name": name})

        hands = [HandsWorker(named(f"hands-{i}"), app) for i in range(HANDS)]
        services = [Relay(named("relay-1")), *hands, BrainWorker(named("brain-1"), app)]
        redis = connect_redis(s)
        limits = Limits(redis, Keys(s.namespace, s.shards), slot_ms=s.attempt_ttl_ms)
        async with running(*services):
            client = await Client.connect(s)
            try:
                # Held: 8 sessions of 5 sends (40 runs); 3 slots taken, nothing answered.
                await http.post("/hold")
                subs = [(await client.submit(notice(n), agent="notices"))[0] for n in range(8)]
                await eventually(lambda: mailbox.held == CAP, timeout=60,
                                 message="the cap's sends held at the mail service")

                async def queued() -> bool:
                    usage = await limits.look("send_email", capped_email.limit)
                    assert usage.in_use == CAP, usage
                    # every Hands' slots full: the rest of its runs wait in line in Redis
                    return usage.waiting == HANDS * SLOTS - CAP
                await eventually(queued, timeout=60, message="the runs beyond the cap queued")
                assert len(mailbox.operations) == CAP and mailbox.max_in_flight == CAP
                # What an operator sees: baton inspect's cluster view, from the Hands'
                # announcements (each says which tools it caps) and the limit's keys.
                async def announced() -> bool:
                    view = await cluster_view(client.store)
                    return view["tool_limits"] == [{
                        "tool": "send_email", "limit": "3 at once", "max_concurrency": CAP,
                        "per_second": 0.0, "burst": 1, "in_use": CAP,
                        "waiting": HANDS * SLOTS - CAP, "rate_wait_ms": 0}]
                await eventually(announced, timeout=60, message="the limit in inspect")
                out = io.StringIO()
                render_cluster(await cluster_view(client.store),
                               Console(file=out, width=200, color_system=None))
                assert "Fleet-wide tool limits" in out.getvalue()
                assert "3 of 3" in out.getvalue() and str(HANDS * SLOTS - CAP) in out.getvalue()
                # And a session's view says which of its runs wait, and where in line.
                waiting = []
                for sub in subs:
                    view = await session_view(client.store, sub.session_id)
                    waiting += [r["waiting_for"] for r in view["runs"] if "waiting_for" in r]
                assert len(waiting) == HANDS * SLOTS - CAP
                assert sorted(int(w.split("(")[1].split()[0]) for w in waiting) == list(
                    range(1, HANDS * SLOTS - CAP + 1))
                assert all(w.startswith("a send_email slot (") for w in waiting)
                await http.post("/release")
                finals = [await client.wait(sub, timeout=120) for sub in subs]
                assert {f.status for f in finals} == {"completed"}

                # Then 32 sessions at once, unheld: 160 more sends, never more than 3 at once.
                more = [(await client.submit(notice(n), agent="notices"))[0]
                        for n in range(8, 40)]
                finals = [await client.wait(sub, timeout=180) for sub in more]
                assert {f.status for f in finals} == {"completed"}
            finally:
                await client.close()
        usage = await limits.look("send_email", capped_email.limit)
        await redis.aclose()
        assert (usage.in_use, usage.waiting) == (0, 0)  # every slot and place given back
        assert mailbox.max_in_flight == CAP
        deliveries = Counter(op.to for op in mailbox.operations.values())
        assert len(deliveries) == 40 * 5 and set(deliveries.values()) == {1}


async def test_three_hands_send_no_faster_than_the_rate(settings: Settings) -> None:
    """Checked against the mail service's own timestamps, causally: a send arrives after its
    admission, and admissions at 20/s from the test's start (before any) admit at most
    ``burst + 1 + 20 * t`` sends by time ``t``; so must the arrivals, however the machine's
    load delays them (a delay only makes arrivals later). Without the limit the thirty sends
    would arrive within a fraction of a second."""
    async with MailboxServer() as mailbox:
        s = settings.model_copy(update={"mail_url": mailbox.url, "hands_concurrency": SLOTS})

        def named(name: str) -> Settings:
            return s.model_copy(update={"worker_name": name})

        services = [Relay(named("relay-1")), BrainWorker(named("brain-1"), rated_app),
                    *(HandsWorker(named(f"hands-{i}"), rated_app) for i in range(3))]
        async with running(*services):
            client = await Client.connect(s)
            try:
                sec, usec = await client.store.redis.time()
                start_ms = int(sec) * 1000 + int(usec) // 1000
                subs = [(await client.submit(notice(n), agent="notices"))[0] for n in range(6)]
                finals = [await client.wait(sub, timeout=120) for sub in subs]
                assert {f.status for f in finals} == {"completed"}
            finally:
                await client.close()
        arrivals = sorted(datetime.fromisoformat(op.delivered_at).timestamp() * 1000
                          for op in mailbox.operations.values())
        assert len(arrivals) == 30
        interval_ms = 1000 / RATE
        for k, at in enumerate(arrivals, start=1):
            assert k <= 1 + 1 + (at - start_ms) / interval_ms, (k, at - start_ms)


async def test_a_runs_wait_for_a_slot_is_a_span_of_its_trace(settings: Settings) -> None:
    """With telemetry on, each run that waited in line has a ``wait for send_email slot``
    span under its message's CONSUMER span, with its place in line."""
    with host_telemetry("capped") as host:
        async with MailboxServer(delay_ms=20) as mailbox:
            s = settings.model_copy(update={"mail_url": mailbox.url,
                                            "hands_concurrency": SLOTS})

            def named(name: str) -> Settings:
                return s.model_copy(update={"worker_name": name})

            services = [Relay(named("relay-1")), BrainWorker(named("brain-1"), app),
                        HandsWorker(named("hands-1"), app)]
            async with running(*services):
                client = await Client.connect(s)
                try:
                    subs = [(await client.submit(notice(n), agent="notices"))[0]
                            for n in range(2)]
                    finals = [await client.wait(sub, timeout=60) for sub in subs]
                    assert {f.status for f in finals} == {"completed"}
                finally:
                    await client.close()
        spans = host.spans.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}
    waits = [span for span in spans if span.name == "wait for send_email slot"]
    assert waits, "10 runs on 3 slots: some waited"
    for wait in waits:
        assert wait.parent is not None
        parent = by_id[wait.parent.span_id]
        assert parent.kind == SpanKind.CONSUMER and "send_email" in parent.name
        assert dict(wait.attributes or {})["baton.limit.position"] >= 1


async def test_a_duplicate_of_a_finished_run_takes_no_place_in_line(settings: Settings) -> None:
    """A second copy (or a redelivery) of a capped tool's run that already ended is settled
    by its claim at once ("done": acked, not executed again), though every slot is taken by
    holders that keep them. In line it would wait for a slot only to hear that, its message
    held in progress meanwhile."""
    async with MailboxServer() as mailbox:
        # Slots live as long as an attempt: the holders below keep theirs through the test.
        s = settings.model_copy(update={"mail_url": mailbox.url, "attempt_ttl_ms": 600_000})

        def named(name: str) -> Settings:
            return s.model_copy(update={"worker_name": name})

        services = [Relay(named("relay-1")), BrainWorker(named("brain-1"), app),
                    HandsWorker(named("hands-1"), app)]
        redis = connect_redis(s)
        limits = Limits(redis, Keys(s.namespace, s.shards), slot_ms=s.attempt_ttl_ms)
        async with running(*services):
            client = await Client.connect(s)
            try:
                sub = (await client.submit(notice(0), agent="notices"))[0]
                assert (await client.wait(sub, timeout=120)).status == "completed"
                run_id = min(await client.store.runs.applied(sub.session_id))
                for i in range(CAP):
                    held = await limits.acquire("send_email", capped_email.limit,
                                                f"holder-{i}/elsewhere/0/default")
                    assert held.granted
                bus = await Bus.connect(s, "test-duplicate")
                try:
                    js, names = bus.nc.jetstream(), bus.names
                    dispatch = ToolDispatch(session_id=sub.session_id, run_id=run_id,
                                            tool="send_email")
                    ack = await js.publish(names.tool_subject("send_email"),
                                           dispatch.model_dump_json().encode())

                    async def acked() -> bool:
                        info = await js.consumer_info(names.tool_stream,
                                                      names.tool_durable("send_email"))
                        return (info.delivered.stream_seq >= ack.seq
                                and not info.num_ack_pending and not info.num_pending)
                    await eventually(acked, timeout=60, message="the duplicate acked")
                finally:
                    await bus.close()
                usage = await limits.look("send_email", capped_email.limit)
                assert (usage.in_use, usage.waiting) == (CAP, 0), usage
                assert len(mailbox.operations) == 5  # the first copy's sends only
            finally:
                await client.close()
                await redis.aclose()


async def test_a_run_outlasting_its_slot_time_keeps_its_slot(settings: Settings) -> None:
    """A holder's slot lasts ``attempt_ttl_ms`` unless renewed; the renewal starts only once
    a third of that passed (most runs end sooner), and then keeps the slot while the run
    executes: sends held at the mail service for over twice the slot time still hold all
    three slots, the two runs beyond the cap still wait, and all finish once answered."""
    async with MailboxServer() as mailbox, httpx.AsyncClient(base_url=mailbox.url) as http:
        s = settings.model_copy(update={"mail_url": mailbox.url})
        slot_ms = s.attempt_ttl_ms

        def named(name: str) -> Settings:
            return s.model_copy(update={"worker_name": name})

        services = [Relay(named("relay-1")), BrainWorker(named("brain-1"), app),
                    HandsWorker(named("hands-1"), app)]
        redis = connect_redis(s)
        limits = Limits(redis, Keys(s.namespace, s.shards), slot_ms=slot_ms)
        async with running(*services):
            client = await Client.connect(s)
            try:
                await http.post("/hold")
                sub = (await client.submit(notice(0), agent="notices"))[0]
                await eventually(lambda: mailbox.held == CAP, timeout=60,
                                 message="the cap's sends held at the mail service")
                sec, usec = await redis.time()
                until = int(sec) * 1000 + int(usec) // 1000 + 2 * slot_ms

                async def outlasted() -> bool:
                    usage = await limits.look("send_email", capped_email.limit)
                    assert (usage.in_use, usage.waiting) == (CAP, 5 - CAP), usage
                    sec, usec = await redis.time()  # on Redis' clock, as the slots
                    return int(sec) * 1000 + int(usec) // 1000 > until
                await eventually(outlasted, timeout=60, message="twice the slot time passed")
                assert len(mailbox.operations) == CAP and mailbox.max_in_flight == CAP
                await http.post("/release")
                assert (await client.wait(sub, timeout=120)).status == "completed"
            finally:
                await client.close()
        usage = await limits.look("send_email", capped_email.limit)
        await redis.aclose()
        assert (usage.in_use, usage.waiting) == (0, 0)
        assert mailbox.max_in_flight == CAP and len(mailbox.operations) == 5
