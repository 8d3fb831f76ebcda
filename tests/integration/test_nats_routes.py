"""Only the cluster's own servers join a NATS cluster as routes (issue 46, finding 1).

A route is trusted as part of the server: a server that joins as one skips every user's
permissions, receives all traffic and may publish anything, ``$JS.API`` included. Two real
3-node clusters are attacked by a rogue ``nats-server`` that dials their route ports with
the cluster's name:

- one started as ``baton dev up --cluster --secure`` starts it (:class:`ClusterStack`'s NATS
  cluster with the stack's users, TLS files and route password): the rogue is refused without
  the route login, with a wrong one, without TLS, and with a certificate of another CA;
- one run from deploy/nats/nats.conf itself (what compose runs; the Helm values set the
  same cluster block) with the certificates compose's ``baton make-tls`` makes: the rogue
  refused without the login, with a wrong one, without TLS and with another CA's
  certificate.

Each refusal is read from the cluster's side (no node's ``/routez`` lists the rogue, a
node's log records the refusal) and from the rogue's (no route), and a message published on
the rogue never reaches a subscriber on the cluster, nor one on the cluster the rogue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client as NATS

from baton.devkit import secure
from baton.devkit.nats_servers import ROUTE_USER, NatsServer, nats_tls_block
from baton.devkit.process import free_port
from baton.devkit.redis_cluster import ClusterStack
from baton.devkit.tls import LOOPBACK, TlsFiles, stack_tls

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "routetest"
DEADLINE_S = 15.0


@dataclasses.dataclass
class Target:
    """A running cluster under attack, and how the test reaches it."""

    name: str  # the cluster's name, which the rogue claims too
    nodes: list[NatsServer]
    route_ports: list[int]
    admin: tuple[str, str]
    route_password: str
    tls: TlsFiles | None
    log_marks: list[int] = dataclasses.field(default_factory=list)

    def route_urls(self, login: str) -> list[str]:
        return [f"nats-route://{login}127.0.0.1:{p}" for p in self.route_ports]

    async def connect(self) -> NATS:
        tls = self.tls.client_context() if self.tls is not None else None
        return await nats.connect(self.nodes[0].url, user=self.admin[0],
                                  password=self.admin[1], tls=tls,
                                  max_reconnect_attempts=1, reconnect_time_wait=0.2)


async def _eventually(check: Callable[[], object], what: str) -> None:
    """Poll ``check`` (sync or async) until it returns truthy, within the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S}s: {what}")
        await asyncio.sleep(0.05)


async def _routes(server: NatsServer) -> list[str]:
    """The names of the servers ``server`` has routes to, from its own /routez."""
    async with httpx.AsyncClient(timeout=2.0) as http:
        routez = (await http.get(f"http://127.0.0.1:{server.monitor_port}/routez")).json()
    return [str(r.get("remote_name") or r.get("remote_id")) for r in routez.get("routes") or []]


def _log(server: NatsServer, since: int = 0) -> str:
    return (server.data_dir / server.log_name).read_text(errors="replace")[since:]


async def _wait_routed(target: Target) -> None:
    names = {n.server_name for n in target.nodes}

    async def full_mesh() -> bool:
        for node in target.nodes:
            if set(await _routes(node)) != names - {node.server_name}:
                return False
        return True

    await _eventually(full_mesh, f"{target.name}: every node routed to every other")


@contextlib.asynccontextmanager
async def _rogue(base: Path, target: Target, login: str,
                 tls: TlsFiles | None) -> AsyncIterator[NatsServer]:
    """A running nats-server that dials every route port of ``target`` as a route, claiming
    its cluster's name; ``login``: ``user:password@`` or empty."""
    seeds = ", ".join(json.dumps(u) for u in target.route_urls(login))
    block = nats_tls_block(tls, "  ", verify=True) if tls is not None else ""
    cluster = (f"cluster {{\n  name: {json.dumps(target.name)}\n"
               f"  listen: 127.0.0.1:{free_port()}\n  routes: [{seeds}]\n{block}}}\n")
    # What the nodes logged before this rogue (the cluster serves every test of the module).
    target.log_marks = [len(_log(n)) for n in target.nodes]
    async with NatsServer(base, server_name="rogue", monitor_port=0,
                          extra_config=cluster) as rogue:
        yield rogue


async def _assert_refused(target: Target, rogue: NatsServer, *, cluster_log: str,
                          rogue_log: str) -> None:
    """The rogue dialled, was refused (both sides' logs), and is a route of no node."""
    await _eventually(lambda: rogue_log.lower() in _log(rogue).lower(),
                      f"the rogue's log records {rogue_log!r}")
    await _eventually(lambda: any(cluster_log.lower() in _log(n, mark).lower()
                                  for n, mark in zip(target.nodes, target.log_marks,
                                                     strict=True)),
                      f"a node's log records {cluster_log!r}")
    for node in target.nodes:
        assert "rogue" not in await _routes(node), node.server_name
        assert set(await _routes(node)) <= {n.server_name for n in target.nodes}
    assert await _routes(rogue) == []
    await _assert_no_traffic(target, rogue)


async def _assert_no_traffic(target: Target, rogue: NatsServer) -> None:
    """Nothing published on the rogue reaches the cluster, and the other way round.

    Each side ends with a marker published on the subscriber's own server: once the marker
    is in, anything sent before it through a route would be in too."""
    subject = f"{NAMESPACE}.tool.work"
    inside, outside = await target.connect(), await nats.connect(
        rogue.url, max_reconnect_attempts=1, reconnect_time_wait=0.2)
    try:
        for publisher, subscriber in ((outside, inside), (inside, outside)):
            got: list[bytes] = []
            arrived = asyncio.Event()

            async def on_msg(msg: nats.aio.msg.Msg, got: list[bytes] = got,
                             arrived: asyncio.Event = arrived) -> None:
                got.append(msg.data)
                if msg.data == b"marker":
                    arrived.set()

            sub = await subscriber.subscribe(subject, cb=on_msg)
            await subscriber.flush()
            await publisher.publish(subject, b"smuggled")
            await publisher.flush()
            await subscriber.publish(subject, b"marker")
            async with asyncio.timeout(DEADLINE_S):
                await arrived.wait()
            await sub.unsubscribe()
            assert got == [b"marker"]
    finally:
        await inside.close()
        await outside.close()


# -- the cluster of `baton dev up --cluster --secure` --------------------------------------


@pytest.fixture(scope="module")
async def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Target]:
    base = tmp_path_factory.mktemp("secure-cluster")
    passwords = secure.stack_credentials(base)
    tls = stack_tls(base)
    # As DevStack.start builds it for --cluster --secure; only its NATS half is started.
    stack = ClusterStack(base / "data", tls=tls,
                         nats_config=secure.nats_config(NAMESPACE, passwords),
                         nats_route_password=passwords[secure.ROUTE])
    cluster = stack.nats
    async with cluster:
        target = Target("baton", cluster.nodes, cluster.route_ports,
                        ("admin", passwords["admin"]), passwords[secure.ROUTE], tls)
        await _wait_routed(target)
        yield target


def test_secure_stack_credentials_hold_a_route_password(tmp_path: Path) -> None:
    passwords = secure.stack_credentials(tmp_path)
    assert len(passwords[secure.ROUTE]) >= 32
    assert (tmp_path / secure.CREDENTIALS).stat().st_mode & 0o777 == 0o600
    # an older stack's file without it gets one (and new passwords for all)
    (tmp_path / secure.CREDENTIALS).write_text(json.dumps(
        {u: p for u, p in passwords.items() if u != secure.ROUTE}))
    assert secure.ROUTE in secure.stack_credentials(tmp_path)


async def test_dev_cluster_refuses_a_route_with_its_certificate_but_no_login(
    dev_cluster: Target, tmp_path: Path,
) -> None:
    # The stack's own certificate passes TLS: only the route login stops this one.
    async with _rogue(tmp_path, dev_cluster, "", dev_cluster.tls) as rogue:
        await _assert_refused(dev_cluster, rogue, cluster_log="authentication error",
                              rogue_log="authorization violation")


async def test_dev_cluster_refuses_a_route_with_a_wrong_login(
    dev_cluster: Target, tmp_path: Path,
) -> None:
    async with _rogue(tmp_path, dev_cluster, f"{ROUTE_USER}:guessed@",
                      dev_cluster.tls) as rogue:
        await _assert_refused(dev_cluster, rogue, cluster_log="authentication error",
                              rogue_log="authorization violation")


async def test_dev_cluster_refuses_a_plaintext_route(dev_cluster: Target, tmp_path: Path) -> None:
    login = f"{ROUTE_USER}:{dev_cluster.route_password}@"  # even with the login
    async with _rogue(tmp_path, dev_cluster, login, None) as rogue:
        await _assert_refused(dev_cluster, rogue, cluster_log="tls route handshake error",
                              rogue_log="router connection closed")


async def test_dev_cluster_refuses_a_route_certificate_of_another_ca(
    dev_cluster: Target, tmp_path: Path,
) -> None:
    other = stack_tls(tmp_path / "other")  # another stack's CA; its own CA file trusted
    login = f"{ROUTE_USER}:{dev_cluster.route_password}@"  # even with the login
    async with _rogue(tmp_path / "rogue", dev_cluster, login, other) as rogue:
        await _assert_refused(dev_cluster, rogue, cluster_log="tls route handshake error",
                              rogue_log="router connection closed")


# -- the cluster of deploy/nats/nats.conf (compose; the Helm values set the same) -------


class DeployedNode(NatsServer):
    """One node run from deploy/nats/nats.conf and users.conf, with the environment compose
    gives it; only what binds differs (loopback, free ports, a temporary store)."""

    def __init__(self, data_dir: Path, name: str, route_port: int, env: dict[str, str],
                 tls: TlsFiles):
        super().__init__(data_dir, server_name=name, monitor_port=0)
        self.route_port, self.deploy_env, self.route_tls = route_port, env, tls

    def _argv(self) -> list[str]:
        text = (DEPLOY / "nats" / "nats.conf").read_text()
        for old, new in (("listen: 0.0.0.0:4222", f"listen: {self.host}:{self.port}"),
                         ("http: 0.0.0.0:8222", f"http: {self.host}:{self.monitor_port}"),
                         ("listen: 0.0.0.0:6222", f"listen: {self.host}:{self.route_port}"),
                         ("store_dir: /data", f"store_dir: {json.dumps(str(self.data_dir))}"),
                         # the files compose's nats-tls service makes (baton make-tls)
                         ("/etc/nats-tls/routes/ca.pem", str(self.route_tls.ca)),
                         ("/etc/nats-tls/routes/server.pem", str(self.route_tls.cert)),
                         ("/etc/nats-tls/routes/server.key", str(self.route_tls.key))):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        text += f"\nports_file_dir: {json.dumps(str(self.data_dir))}\n"
        shutil.copy(DEPLOY / "nats" / "users.conf", self.data_dir / "users.conf")
        (self.data_dir / "nats.conf").write_text(text)
        return [self._binary, "-c", str(self.data_dir / "nats.conf")]

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.deploy_env, "SERVER_NAME": str(self.server_name)}


@pytest.fixture(scope="module")
async def deployed_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Target]:
    base = tmp_path_factory.mktemp("deployed-cluster")
    env = {f"{u.upper()}_NATS_PASSWORD": f"{u}{os.urandom(8).hex()}"
           for u in ("admin", "relay", "brain", "hands", "client", "operator", "route")}
    ports = [free_port() for _ in range(3)]
    login = f"route:{env['ROUTE_NATS_PASSWORD']}@"
    # As compose.yaml builds ROUTE_URLS (nats-values.yaml: the same with tls://).
    env["ROUTE_URLS"] = "[" + ", ".join(f"nats-route://{login}127.0.0.1:{p}"
                                        for p in ports) + "]"
    # What compose's nats-tls service runs, for the hosts the nodes dial here.
    made = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton", "make-tls", "--dir", str(base / "tls" / "routes"),
        *(arg for host in LOOPBACK for arg in ("--host", host)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await made.communicate()
    assert made.returncode == 0, err.decode()
    tls = stack_tls(base / "tls", LOOPBACK, "routes")  # the same files, as TlsFiles
    nodes = [DeployedNode(base / f"nats-{i + 1}", f"nats-{i + 1}", p, env, tls)
             for i, p in enumerate(ports)]
    try:
        await asyncio.gather(*(n.start() for n in nodes))
        target = Target("baton", list(nodes), ports, ("admin", env["ADMIN_NATS_PASSWORD"]),
                        env["ROUTE_NATS_PASSWORD"], tls)
        await _wait_routed(target)
        yield target
    finally:
        await asyncio.gather(*(n.stop() for n in nodes))


async def test_deployed_cluster_refuses_a_route_without_login(
    deployed_cluster: Target, tmp_path: Path,
) -> None:
    # The cluster's own certificate passes TLS: only the route login stops this one.
    async with _rogue(tmp_path, deployed_cluster, "", deployed_cluster.tls) as rogue:
        await _assert_refused(deployed_cluster, rogue, cluster_log="authentication error",
                              rogue_log="authorization violation")


async def test_deployed_cluster_refuses_a_route_with_a_wrong_login(
    deployed_cluster: Target, tmp_path: Path,
) -> None:
    async with _rogue(tmp_path, deployed_cluster, "route:guessed@",
                      deployed_cluster.tls) as rogue:
        await _assert_refused(deployed_cluster, rogue, cluster_log="authentication error",
                              rogue_log="authorization violation")


async def test_deployed_cluster_refuses_a_plaintext_route(
    deployed_cluster: Target, tmp_path: Path,
) -> None:
    login = f"route:{deployed_cluster.route_password}@"  # even with the login
    async with _rogue(tmp_path, deployed_cluster, login, None) as rogue:
        await _assert_refused(deployed_cluster, rogue, cluster_log="tls route handshake error",
                              rogue_log="router connection closed")


async def test_deployed_cluster_refuses_a_route_certificate_of_another_ca(
    deployed_cluster: Target, tmp_path: Path,
) -> None:
    other = stack_tls(tmp_path / "other")  # another CA's certificate; that CA trusted
    login = f"route:{deployed_cluster.route_password}@"  # even with the login
    async with _rogue(tmp_path / "rogue", deployed_cluster, login, other) as rogue:
        await _assert_refused(deployed_cluster, rogue, cluster_log="tls route handshake error",
                              rogue_log="router connection closed")
