"""Per-role credentials: NATS users with subject permissions and Redis ACL users; TLS.

A private NATS server is started with the authorization block of :mod:`baton.auth`, and a
private Redis with one ACL user per role. The five-notice flow runs with every service
under its own users; each forbidden action is refused and reported as a ForbiddenError
naming the role and the action, and wrong credentials as a CredentialsError.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats.js.errors
import pytest
import redis.asyncio as aioredis
from nats.js.api import ConsumerConfig
from redis.exceptions import NoPermissionError

from baton.auth import ROLES, nats_users_config, redis_acl
from baton.brain.worker import BrainWorker
from baton.budgets import ModelBudget
from baton.bus.bus import Bus
from baton.bus.consumers import ConsumerMaker, ConsumerRequest, request_consumer
from baton.bus.fallback import is_fallback
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import (
    ConfigError,
    CredentialsError,
    ForbiddenError,
    NatsUnavailable,
    from_redis_error,
)
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.limits import ToolLimit
from baton.models import Entry, Submission, Task
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.budgets import Budgets
from baton.store.keys import Keys
from baton.store.limits import Limits
from baton.store.outbox import Outbox
from baton.store.redis_client import connect_redis
from baton.store.scripts import library_code, load_functions
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import contents
from tests.integration.test_e2e_inprocess import FIVE, running

PASSWORDS = {role: f"{role}-secret" for role in ROLES}


@dataclass
class Secured:
    namespace: str
    nats: NatsServer
    redis: RedisServer

    def settings(self, role: str, **extra: object) -> Settings:
        redis_url = self.redis.url.replace("redis://", f"redis://{role}:{PASSWORDS[role]}@")
        return Settings(
            redis_url=redis_url, nats_url=self.nats.url, namespace=self.namespace,
            nats_user=role, nats_password=PASSWORDS[role], worker_name=f"{role}-1",
            **extra,  # type: ignore[arg-type]
        )


@pytest.fixture(scope="module")
async def secured() -> AsyncIterator[Secured]:
    namespace = "sec" + uuid.uuid4().hex[:6]
    config = nats_users_config(namespace, PASSWORDS, admin_password="admin-secret")
    async with NatsServer(extra_config=config) as nats_server, RedisServer() as redis_server:
        admin = aioredis.Redis.from_url(redis_server.url)
        for role in ROLES:
            await admin.execute_command("ACL", "SETUSER", role,
                                        *redis_acl(role, namespace, PASSWORDS[role]))
        await load_functions(admin, Settings())  # the roles may not: the admin does
        await admin.aclose()
        yield Secured(namespace, nats_server, redis_server)


async def connect(secured: Secured, role: str) -> Bus:
    return await Bus.connect(secured.settings(role), f"{role}-test", role)


async def five_notices_as_roles(secured: Secured, mailbox: MailboxServer) -> Submission:
    """One five-notice session with every service and the client on its own role's user;
    the settled submission."""
    def s(role: str) -> Settings:
        return secured.settings(role, mail_url=mailbox.url)

    relay, brain, hands = Relay(s("relay")), BrainWorker(s("brain"), app), HandsWorker(
        s("hands"), app)
    async with running(relay):  # the relay creates the streams: nobody else may
        async with running(hands, brain):
            client = await Client.connect(s("client"))
            try:
                sub, _ = await client.submit(FIVE, agent="notices")
                return await client.wait(sub, timeout=20)
            finally:
                await client.close()


async def test_five_notices_complete_with_every_role_under_its_own_users(
    secured: Secured,
) -> None:
    async with MailboxServer() as mailbox:
        final = await five_notices_as_roles(secured, mailbox)
        assert final.status == "completed", final
        assert mailbox.raw_requests == 5


async def test_hands_may_not_publish_wakes_nor_consume_the_wake_stream(secured: Secured) -> None:
    relay = await connect(secured, "relay")
    await relay.ensure_streams()
    await relay.close()
    async with await connect(secured, "hands") as hands:
        names = hands.names
        with pytest.raises(ForbiddenError) as exc:
            await hands.publish(names.wake_subject("notices", 1), b"{}", msg_id="forged")
        assert exc.value.fields["role"] == "hands" and exc.value.fields["action"] == "publish to"
        assert "wake" in exc.value.fields["target"]
        with pytest.raises(ForbiddenError, match="hands may not read the consumer"):
            await hands.ensure_consumer(names.wake_stream, names.wake_durable("notices", 1),
                                        names.wake_subject("notices", 1))
        # Even a pull from an existing wake consumer (made here by the admin) is refused.
        admin = await Bus.connect(
            secured.settings("relay").model_copy(
                update={"nats_user": "admin", "nats_password": "admin-secret"}), "admin")
        await admin.ensure_consumer(names.wake_stream, names.wake_durable("notices", 1),
                                    names.wake_subject("notices", 1))
        await admin.close()
        puller = await hands.pull(names.wake_stream, names.wake_durable("notices", 1))
        with pytest.raises(ForbiddenError, match="hands may not pull from"):
            await puller.fetch(1, timeout=2.0)
        await puller.close()
        # Its own stream is fine: a relay makes the consumer it asks for.
        async with await connect(secured, "relay") as relay:
            await ConsumerMaker(relay).listen()
            info = await hands.ensure_consumer(names.tool_stream, names.tool_durable("echo"),
                                               names.tool_subject("echo"))
        assert info.config.durable_name == names.tool_durable("echo")


async def test_brains_may_not_consume_tool_messages_nor_publish_work(secured: Secured) -> None:
    relay = await connect(secured, "relay")
    await relay.ensure_streams()
    await relay.close()
    async with await connect(secured, "brain") as brain:
        names = brain.names
        with pytest.raises(ForbiddenError, match="brain may not read the consumer"):
            await brain.ensure_consumer(names.tool_stream, names.tool_durable("send_email"),
                                        names.tool_subject("send_email"))
        for subject in (names.tool_subject("send_email"), names.wake_subject("notices", 1)):
            with pytest.raises(ForbiddenError, match="brain may not publish to"):
                await brain.publish(subject, b"{}", msg_id=f"forged-{subject}")
        # Neither may it change the streams: only the relay manages them.
        js = brain.nc.jetstream()
        with pytest.raises(ForbiddenError, match="brain may not manage the stream"):
            await brain.guarded("manage the stream", "$JS.API.STREAM.",
                                js.purge_stream(names.tool_stream))


async def test_no_worker_may_make_a_consumer_that_routes_its_stream_elsewhere(
    secured: Secured,
) -> None:
    """CONSUMER.CREATE lets its holder say where a stream delivers: a Hands could make a
    push consumer of the tool stream delivering onto a wake subject. Brains and Hands hold
    no CONSUMER.CREATE now (Redis-like: the server refuses it), and the relay that makes
    their consumers refuses a request outside the asking role's stream."""
    async with await connect(secured, "relay") as relay:
        await relay.ensure_streams()
        maker = ConsumerMaker(relay)
        await maker.listen()
        names = relay.names
        push = ConsumerConfig(durable_name="evil", deliver_subject=names.wake_subject("n", 1),
                              filter_subject=names.tool_subject("send_email"))
        for role in ("hands", "brain"):
            async with await connect(secured, role) as worker:
                with pytest.raises(ForbiddenError, match=f"{role} may not make"):
                    await worker.guarded("make", "$JS.API.CONSUMER.",
                                         worker.nc.jetstream().add_consumer(
                                             names.tool_stream, push))
        async with await connect(secured, "hands") as hands:
            # Asking the relay for a consumer of the wake stream: refused, nothing made.
            wake = ConsumerRequest(durable="wake_forged",
                                   filter_subject=names.wake_subject("notices", 1),
                                   ack_wait_s=5, max_deliver=5, max_ack_pending=10)
            with pytest.raises(NatsUnavailable, match=r"a hands consumes .*_TOOLS only"):
                await request_consumer(hands, "hands", wake, wait_s=10)
            # Nor may it ask in the Brains' name: that subject is the Brains' alone.
            with pytest.raises(ForbiddenError, match="hands may not ask for a consumer"):
                await request_consumer(hands, "brain", wake, wait_s=10)
        assert maker.made == 0
        js = relay.nc.jetstream()
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.consumer_info(names.wake_stream, "wake_forged")


async def test_copies_around_a_leaderless_stream_reach_their_own_role_only(
    secured: Secured,
) -> None:
    """The paths around a stream or consumer without a leader (baton.bus.fallback), under
    the roles' users: the relay may send copies, a Hands takes the tool ones and a Brain the
    wake ones, each may read its own stream directly, and neither the other's."""
    async with await connect(secured, "relay") as relay:
        await relay.ensure_streams()
        await ConsumerMaker(relay).listen()
        names = relay.names
        tool, wake = names.tool_subject("echo"), names.wake_subject("notices", 1)
        async with await connect(secured, "hands") as hands, \
                await connect(secured, "brain") as brain:
            await hands.ensure_consumer(names.tool_stream, names.tool_durable("echo"), tool)
            await brain.ensure_consumer(names.wake_stream, names.wake_durable("notices", 1),
                                        wake)
            tools = await hands.pull(names.tool_stream, names.tool_durable("echo"), tool)
            wakes = await brain.pull(names.wake_stream, names.wake_durable("notices", 1), wake)
            for bus in (hands, brain):
                await bus.nc.flush()  # the copies' subscriptions are in place
            for subject in (tool, wake):  # each taker answers the relay (allow_responses)
                answer = await relay.nc.request(names.fallback_subject(subject), b"copy",
                                                timeout=10,
                                                headers={"Nats-Msg-Id": f"row-{subject}"})
                assert answer.data == b""
            for puller, subject in ((tools, tool), (wakes, wake)):
                got = await puller.fetch(1, timeout=10)
                assert [(m.subject, m.data, is_fallback(m)) for m in got] == [
                    (subject, b"copy", True)]
            for bus, own, other in ((hands, names.tool_stream, names.wake_stream),
                                    (brain, names.wake_stream, names.tool_stream)):
                js = bus.nc.jetstream(timeout=2)
                with pytest.raises(nats.js.errors.NotFoundError):  # allowed: nothing there
                    await bus.guarded("read", f"$JS.API.DIRECT.GET.{own}", js.get_msg(
                        own, seq=0, subject=f"{names.namespace}.>", direct=True, next=True))
                with pytest.raises(ForbiddenError, match="may not read"):
                    await bus.guarded("read", f"$JS.API.DIRECT.GET.{other}", js.get_msg(
                        other, seq=0, subject=f"{names.namespace}.>", direct=True, next=True))
            await tools.close()
            await wakes.close()
        # Only the relay may send copies: a Hands' would be refused by the server.
        async with await connect(secured, "hands") as hands:
            with pytest.raises(ForbiddenError, match="hands may not publish to"):
                await hands.guarded("publish to", names.fallback_subject(wake),
                                    hands.nc.request(names.fallback_subject(wake), b"x",
                                                     timeout=5))


async def test_clients_use_no_nats_subject_at_all(secured: Secured) -> None:
    async with await connect(secured, "client") as client:
        with pytest.raises(ForbiddenError, match="client may not"):
            await client.ensure_streams()
        with pytest.raises(ForbiddenError, match="client may not publish to"):
            await client.publish(client.names.wake_subject("notices", 1), b"{}", msg_id="c")


async def test_wrong_credentials_are_refused_clearly(secured: Secured) -> None:
    wrong = secured.settings("hands").model_copy(update={"nats_password": "guess"})
    with pytest.raises(CredentialsError, match="refused the credentials of user hands"):
        await Bus.connect(wrong, "intruder", "hands")
    # Another role's user (a Brain started with the Hands' credentials): its reply inbox is
    # refused, so no JetStream answer can come. Said as such, not as a server not answering.
    async with await Bus.connect(secured.settings("hands"), "brain-1", "brain") as misrun:
        with pytest.raises(ForbiddenError, match=r"hands may not subscribe to _inbox\.brain"):
            await misrun.ensure_consumer(misrun.names.tool_stream,
                                         misrun.names.tool_durable("echo"),
                                         misrun.names.tool_subject("echo"))
    bad_redis = secured.settings("hands").model_copy(
        update={"redis_url": secured.redis.url.replace("redis://", "redis://hands:guess@")})
    with pytest.raises(CredentialsError, match="redis refused the credentials of user hands"):
        await Store.connect(bad_redis)


async def test_redis_acls_refuse_each_role_what_it_does_not_do(secured: Secured) -> None:
    stores = {role: await Store.connect(secured.settings(role)) for role in ROLES}
    try:
        admin = aioredis.Redis.from_url(secured.redis.url)
        session = "s-" + uuid.uuid4().hex[:8]
        client, brain, hands, relay = (stores[r] for r in ("client", "brain", "hands", "relay"))
        await client.inbox.submit(
            session, agent="notices", compat=1, wake_subject=f"{secured.namespace}.wake.n.1",
            request_id="r1", text="go", task=Task(id="t1", kind="generation", owner=session),
            worker=worker_ref("client", "c"), submission_id="sub-1",
        )
        lease = await brain.acquire(session, worker_ref("brain", "b"), 5000)
        sk = brain.keys.session(session)
        before = await _digest(admin, sk.all())

        # Hands may not commit a Brain's write-set, even with the right fence: the script
        # refuses before its first write, so nothing changes.
        writes = Writes(entries=[Entry(kind="model", text="forged")])
        with pytest.raises(ForbiddenError) as exc:
            await hands.commit(session, lease.fence, writes, worker_ref("hands", "h"))
        assert exc.value.fields["role"] == "hands"  # it may not even declare the meta key
        assert await _digest(admin, sk.all()) == before

        # The relay may not read session state; hands may not read or drop outbox rows;
        # clients may not acknowledge work away; nobody may flush the database.
        with pytest.raises(ForbiddenError, match="relay may not run"):
            await relay.load(session)
        forbidden = [
            ("hands", Outbox(hands.redis, hands.keys).read([sk.shard], "h", 10, None)),
            ("client", client.redis.xack(sk.outbox, "relay", "0-1")),
            ("brain", brain.redis.flushall()),
            ("client", client.redis.execute_command("CONFIG", "GET", "dir")),
        ]
        for role, call in forbidden:
            with pytest.raises(NoPermissionError) as raw:
                await call
            err = from_redis_error(raw.value, role=role)
            assert isinstance(err, ForbiddenError) and err.fields["role"] == role
            assert str(err).startswith(f"{role} may not run")
        assert await _digest(admin, sk.all()) == before
        await admin.aclose()
    finally:
        await asyncio.gather(*(s.close() for s in stores.values()))


async def _digest(redis: aioredis.Redis, keys: list[str]) -> list[tuple[str, object]]:
    return [await contents(redis, k) for k in keys]


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1 (openssl CLI)."""
    ca_key, ca, key, csr, cert = (directory / n for n in
                                  ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt"))
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "1", "-subj", "/CN=baton-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return ca, cert, key


async def test_nats_over_tls_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key = await asyncio.to_thread(_certificates, tmp_path)
    tls = f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n}}\n'
    async with NatsServer(tmp_path / "nats", extra_config=tls) as server:
        url = server.url.replace("nats://", "tls://")
        settings = Settings(nats_url=url, nats_tls_ca=str(ca), namespace="tls")
        async with await Bus.connect(settings, "tls-test") as bus:
            await bus.ensure_streams()
            assert await bus.publish(bus.wake_subject("a", 1), b"{}", msg_id="m1")
        with pytest.raises(NatsUnavailable):  # without the CA the server is not trusted
            await Bus.connect(settings.model_copy(update={"nats_tls_ca": ""}), "untrusted")


async def test_the_api_lists_sessions_as_the_operator_or_says_it_cannot(
    secured: Secured,
) -> None:
    """The API writes as a client, whose ACL reads its granted sessions only: listing them
    took an empty answer for "no sessions". Given the operator's credential for its reads,
    it lists them; without one, the list is a 403 saying why."""
    import httpx

    from baton.api.auth import Tokens
    from tests.api_helpers import serving_api

    relay, brain = Relay(secured.settings("relay")), BrainWorker(secured.settings("brain"), app)
    async with running(relay), running(brain):  # the relay makes the streams, first
        client = await Client.connect(secured.settings("client"))
        try:  # the Brain lists the session in the index
            sub, _ = await client.submit("listed? (no address here: no tool)", agent="notices")
            assert (await client.wait(sub, timeout=20)).status == "completed"
        finally:
            await client.close()
    tokens = Tokens(Tokens.parse("read:read-token-0123456789", "test"))
    read = {"Authorization": "Bearer read-token-0123456789"}
    async with serving_api(secured.settings("client"), tokens) as url, \
            httpx.AsyncClient(base_url=url) as http:
        refused = await http.get("/v1/sessions", headers=read)
        assert refused.status_code == 403, refused.text
        assert "may not read the sessions index" in refused.json()["detail"]
    async with serving_api(secured.settings("client"), tokens,
                           reads=secured.settings("operator")) as url, \
            httpx.AsyncClient(base_url=url) as http:
        listed = (await http.get("/v1/sessions", headers=read)).json()
        assert sub.session_id in [r["session_id"] for r in listed["sessions"]], listed
        dead = await http.get("/v1/dead-letters", headers=read)
        assert dead.status_code == 200, dead.text


async def test_inspect_with_a_clients_credential_says_what_it_cannot_read(
    secured: Secured,
) -> None:
    """A client reads no shard-wide key: the backlog and the dead letters are "not
    readable", never 0 beside a finding that says they could not be read."""
    import io

    from rich.console import Console

    from baton.cli.inspect import cluster_view, render_cluster

    store = await Store.connect(secured.settings("client"))
    try:
        view = await cluster_view(store)
    finally:
        await store.close()
    assert view["dead_letters"]["count"] is None
    assert all(b["rows"] is None for b in view["backlog"]), view["backlog"]
    out = io.StringIO()
    render_cluster(view, Console(file=out, width=160, highlight=False))
    text = out.getvalue()
    assert "dead letters: not readable with this credential" in text
    assert f"{len(view['backlog'])} shard(s) not readable" in text
    assert "other shard(s)" not in text


async def test_no_role_runs_lua_of_its_own_only_the_loaded_functions(
    secured: Secured,
) -> None:
    """A role allowed EVAL could run any Lua within its ACL, and reach a flaw of Redis' Lua
    sandbox (CVE-2025-49844) with any stolen credential. The roles hold FCALL of the library
    the admin loaded, and may neither EVAL nor load functions or scripts of their own."""
    forged = "#!lua name=forged\nredis.register_function('forged', function() return 1 end)"
    for role in ("relay", "brain", "hands", "client"):
        r = aioredis.Redis.from_url(secured.settings(role).redis_url)
        try:
            assert await r.execute_command("FCALL", f"{library_code(True)[0]}_ping", 0) == 1
            for refused in (r.eval("return 1", 0), r.script_load("return 1"),
                            r.function_load(forged, replace=True)):
                with pytest.raises(NoPermissionError):
                    await refused
        finally:
            await r.aclose()


async def test_no_role_may_select_another_database(secured: Secured) -> None:
    """Key patterns name keys, not databases: a role allowed SELECT would reach the same key
    names in every database (another tenant's). No role may SELECT, and a URL naming a
    database other than 0 is refused before anything connects."""
    for role in ROLES:
        r = aioredis.Redis.from_url(secured.settings(role).redis_url)
        try:
            assert await r.ping()
            with pytest.raises(NoPermissionError):
                await r.execute_command("SELECT", 1)
        finally:
            await r.aclose()
    with pytest.raises(ConfigError, match="database 0, not /2"):
        settings = secured.settings("brain")
        url = settings.redis_url.removesuffix("/0") + "/2"
        await Store.connect(settings.model_copy(update={"redis_url": url}))


async def test_only_the_hands_hold_a_tools_slots(secured: Secured) -> None:
    """A capped tool's fleet-wide slots (tool_limit.lua) are the Hands' alone: Redis refuses
    every other role the script on those keys, and the Hands the commands it runs there on
    any other key."""
    cap = ToolLimit(max_concurrency=1, per_second=100.0)
    keys = Keys(secured.namespace, 16)
    for role in ROLES:
        redis = connect_redis(secured.settings(role))
        limits = Limits(redis, keys, slot_ms=1000)
        try:
            if role == "hands":
                assert (await limits.acquire("mail", cap, "run-1")).granted
                assert await limits.renew("mail", cap, "run-1")
                assert not await limits.release("mail", cap, "run-1")
                with pytest.raises(NoPermissionError):  # INCR on a key outside the limits
                    await redis.incr(keys.session("s-1").nudge)
            else:
                with pytest.raises(ForbiddenError):
                    await limits.acquire("mail", cap, f"{role}-run")
        finally:
            await redis.aclose()


async def test_only_the_brains_hold_a_models_budget(secured: Secured) -> None:
    """A model's fleet-wide budget (model_limit.lua) is the Brains' alone: Redis refuses every
    other role the script on those keys, and the Brains the commands it runs there on any
    other key; the operator reads it (baton inspect)."""
    budget = ModelBudget(rpm=600, tpm=100_000, concurrency=1)
    keys = Keys(secured.namespace, 16)
    for role in ROLES:
        redis = connect_redis(secured.settings(role))
        budgets = Budgets(redis, keys, slot_ms=1000)
        try:
            if role == "brain":
                assert (await budgets.acquire("openai/gpt-x", budget, "call-1", 500)).granted
                assert await budgets.renew("openai/gpt-x", budget, "call-1")
                released = await budgets.release("openai/gpt-x", budget, "call-1",
                                                 correction=-300, pause_ms=1000)
                assert released.paused_ms > 0
                with pytest.raises(NoPermissionError):  # SET on a key outside the budgets
                    await redis.set(keys.tool_limit("mail")[4], "1")
            else:
                with pytest.raises(ForbiddenError):
                    await budgets.acquire("openai/gpt-x", budget, f"{role}-call", 1)
        finally:
            await redis.aclose()
    operator = connect_redis(secured.settings("operator"))
    try:
        state = await Budgets(operator, keys, slot_ms=1).look("openai/gpt-x", budget)
        assert (state.in_use, state.waiting) == (0, 0)
    finally:
        await operator.aclose()
