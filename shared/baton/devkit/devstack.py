"""The local stack: embedded Redis and NATS, the mail service, and supervised Baton services.

:class:`DevStack` is the Python API that ``baton dev``, ``baton demo``, the crash tests, chaos
runs and benchmarks share. Every service is a separate OS process (``python -m baton
brain|hands|relay``), as in a real deployment, so a test can SIGKILL, SIGSTOP or fault-inject
one replica while the others carry on. With ``supervise=True`` a child that exits unexpectedly
is started again under the same name after a short backoff, the way an orchestrator would
(:mod:`baton.devkit.supervisor`).

Readiness is read from the stack itself: a service is up once it has announced its own PID in
``<namespace>:workers``; the mail service and the HTTP API (``api=True``: ``baton api`` on
loopback with the stack's own token, :attr:`DevStack.api_token`; the console at
:attr:`DevStack.api_url`) once they answer ``/healthz``.
The ``baton dev`` command that runs this stack from a shell lives in :mod:`baton.devkit.dev`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from baton.devkit import secure
from baton.devkit.netns import HOST, Netns
from baton.devkit.redis_cluster import ClusterStack
from baton.devkit.servers import EmbeddedStack, RedisServer, free_port
from baton.devkit.stack import write_stack
from baton.devkit.supervisor import Proc, Supervisor, terminate
from baton.devkit.tls import TlsFiles, stack_tls
from baton.errors import ServerError
from baton.observability.log import get_logger
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.redis_client import REDIS_ERRORS, connect_redis
from baton.store.scripts import load_functions

__all__ = ["DevStack", "Proc"]

log = get_logger("baton.dev")

SERVICE_ROLES = ("brain", "hands", "relay")
_READY_TIMEOUT_S = 30.0
_POLL_S = 0.02
_NETNS_SPARES = 6  # namespaces for services spawned after the start


class DevStack:
    """Redis, NATS, the mail service and Brain/Hands/Relay processes under ``base_dir``.

    ``async with DevStack(path, hands=2) as stack:`` starts everything and waits until every
    process is ready; leaving the block stops everything (services drain on SIGTERM).
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        brains: int = 1,
        hands: int = 2,
        relays: int = 1,
        mail_delay_ms: int = 0,
        durable: bool = False,
        app_spec: str = "baton.examples.notices:app",
        namespace: str = "baton",
        env: dict[str, str] | None = None,
        supervise: bool = True,
        mail_persist: bool = True,
        cluster: bool = False,
        api: bool = False,
        secure: bool = False,
        netns: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        # Per-stack credentials: every service connects as its role (baton.devkit.secure),
        # over TLS with the stack's own CA (baton.devkit.tls).
        self.secure = secure
        self.passwords: dict[str, str] = {}
        self.tls: TlsFiles | None = None
        # The mail service fsyncs each operation to survive its own restarts; benchmarks that
        # measure Baton rather than the mail service's disk can turn that off.
        self.mail_persist = mail_persist
        self.counts = {"brain": brains, "hands": hands, "relay": relays}
        self.mail_delay_ms = mail_delay_ms
        self.durable = durable
        # A Redis Cluster (3 primaries with 2 replicas each) and a 3-node NATS cluster
        # instead of one server each (baton.devkit.redis_cluster.ClusterStack).
        self.cluster = cluster
        self.app_spec = app_spec
        self.namespace = namespace
        self.env = dict(env or {})
        if cluster:  # JetStream streams replicated over the 3 NATS nodes
            self.env.setdefault("BATON_STREAM_REPLICAS", "3")
        else:
            # Client pings find a server that went silent without closing the connection
            # (a partition, a crashed host), which one NATS server on the loopback cannot
            # do: its connections are reset as it dies. Each ping wakes the worker and the
            # server; the clusters (and their partitions) keep the default.
            self.env.setdefault("BATON_NATS_PING_INTERVAL_S", "30")
        self.supervise = supervise
        # Partition runs: every server and service process in its own Linux network
        # namespace (baton.devkit.netns; root only), the mail service on the host side.
        if netns and not cluster:
            raise ValueError("netns=True runs the clusters: pass cluster=True as well")
        self.net: Netns | None = None
        self._free_members: list[str] = []
        if netns:
            spares = [f"w{i + 1}" for i in range(sum(self.counts.values()) + _NETNS_SPARES)]
            self.net = Netns([*ClusterStack.REDIS_MEMBERS, *ClusterStack.NATS_MEMBERS, *spares])
            self._free_members = spares
        self.data_dir = self.base_dir / "data"
        self.log_dir = self.base_dir / "logs"
        # One of the two is set once started: the single servers, or the clusters.
        self.servers: EmbeddedStack | None = None
        self.clusters: ClusterStack | None = None
        self.mailbox: Proc | None = None
        self.api: Proc | None = None
        self.api_enabled = api
        self._api_port = 0
        self._procs: dict[str, Proc] = {}
        self._mail_port = 0
        self._redis: Any = None  # Redis, or RedisCluster with cluster=True
        self._http: httpx.AsyncClient | None = None
        # Starts the processes, and with supervise=True starts again those that exit.
        self.supervisor = Supervisor(self.env, supervise=supervise,
                                     on_restart=self._refresh_stack_file)
        self._stopped = False
        self._stack_file_written = False

    # ------------------------------------------------------------------ addresses

    @property
    def redis_url(self) -> str:
        return self._require_servers().redis_url

    @property
    def nats_url(self) -> str:
        return self._require_servers().nats_url

    @property
    def mail_url(self) -> str:
        if not self._mail_port:
            raise ServerError("the stack is not started", server="mailbox")
        host = self.net.address(HOST) if self.net is not None else "127.0.0.1"
        return f"http://{host}:{self._mail_port}"

    @property
    def api_url(self) -> str:
        """The HTTP API and console (``api=True``)."""
        if not self._api_port:
            raise ServerError("the stack runs no API (DevStack(api=True))", server="api")
        return f"http://127.0.0.1:{self._api_port}"

    @property
    def api_token(self) -> str:
        """The API's operate token (``api=True``; baton.api.auth.dev_tokens_file)."""
        from baton.api.auth import dev_token

        token = dev_token(self.base_dir)
        if token is None:
            raise ServerError("the stack runs no API (DevStack(api=True))", server="api")
        return token

    def settings(self, role: str = "admin", **overrides: Any) -> Settings:
        """Settings for a client of this stack (the stack's extra ``BATON_*`` included).

        On a secure stack ``role`` picks the credentials (``admin``: the operator's, who may
        do anything; ``client``, ``brain``, ...: that role's); otherwise it is ignored."""
        return Settings.from_env({**self.env, **self._urls(role)}, **overrides)

    @property
    def processes(self) -> list[dict[str, Any]]:
        """Every process of the stack: servers, the mail service, then the services."""
        out: list[dict[str, Any]] = []
        members = (self.clusters.members if self.clusters is not None
                   else (self.servers.redis, self.servers.nats) if self.servers is not None
                   else ())
        for server in members:  # a cluster's nodes share a name: their address tells them apart
            out.append({"role": server.name, "name": server.name, "pid": server.pid,
                        "address": f"{server.host}:{server.port}", "alive": server.running,
                        "restarts": 0})
        if self.mailbox is not None:
            out.append(self.mailbox.info())
        if self.api is not None:
            out.append(self.api.info())
        out.extend(p.info() for p in self._procs.values())
        return out

    def proc(self, name: str) -> Proc:
        if self.mailbox is not None and name == self.mailbox.name:
            return self.mailbox
        if self.api is not None and name == self.api.name:
            return self.api
        try:
            return self._procs[name]
        except KeyError:
            raise KeyError(f"no process named {name!r}; have {sorted(self._procs)}") from None

    def procs(self, role: str | None = None) -> list[Proc]:
        return [p for p in self._procs.values() if role is None or p.role == role]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start servers, the mail service and the services; return once all are ready."""
        if self.servers is not None or self.clusters is not None:
            return
        if not self.durable:  # a fresh stack: no JetStream messages about sessions long gone
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.net is not None:
                self.net.create()
            config = ""
            if self.secure:
                self.passwords = secure.stack_credentials(self.base_dir)
                self.tls = stack_tls(self.base_dir)
                config = secure.nats_config(self.namespace, self.passwords)
            if self.cluster:
                route = self.passwords[secure.ROUTE] if self.secure else None
                self.clusters = ClusterStack(self.data_dir, durable=self.durable, netns=self.net,
                                             tls=self.tls, nats_config=config,
                                             nats_route_password=route)
                redis_nodes: list[RedisServer] = list(self.clusters.redis.nodes)
            else:
                self.servers = EmbeddedStack(self.data_dir, durable=self.durable,
                                             nats_config=config, tls=self.tls)
                redis_nodes = [self.servers.redis]
            if self.secure:  # the users from the first moment, passwords in 0600 files
                conf = secure.write_redis_config(self.base_dir, self.namespace,
                                                 self.passwords, cluster=self.cluster)
                secure.secure_redis(redis_nodes, conf, self.passwords)
            await self._require_servers().start()
            admin_url = (secure.with_user(self.redis_url, "admin", self.passwords["admin"])
                         if self.secure else self.redis_url)
            ca = str(self.tls.ca) if self.tls is not None else ""
            self._redis = connect_redis(Settings(redis_url=admin_url, redis_tls_ca=ca))
            self._http = httpx.AsyncClient(timeout=2.0)
            await self._start_mailbox()
            if self.secure:  # only relays (and admins) may create the streams
                await self._ensure_streams()
                # and only the admin may load the scripts' function library
                await load_functions(self._redis, self.settings("admin"))
            starting = [
                self.supervisor.launch(self._new_proc(role, None, None))
                for role in SERVICE_ROLES for _ in range(self.counts[role])
            ]
            await asyncio.gather(*starting)
            await asyncio.gather(*(self.wait_ready(p.name) for p in self._procs.values()))
            if self.api_enabled:
                await self._start_http_proc("api")
        except BaseException:
            await self.stop()
            raise

    async def spawn(self, role: str, name: str | None = None,
                    env: dict[str, str] | None = None, *, wait: bool = True,
                    app: str | None = None, respawn: bool = True) -> Proc:
        """Start one more service process (e.g. with ``BATON_FAULT``); ready when returned.

        ``app`` runs a Brain or Hands with another app than the stack's (a newer version of
        it, for a rolling upgrade). ``respawn=False`` is set before the launch, so that a
        process dying at once (at a fault point) is never restarted.
        """
        if role not in SERVICE_ROLES:
            raise ValueError(f"role must be one of {SERVICE_ROLES}, not {role!r}")
        proc = self._new_proc(role, name, env, app)
        proc.respawn = respawn
        await self.supervisor.launch(proc)
        if wait:
            await self.wait_ready(proc.name)
        self._refresh_stack_file()
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL, *, respawn: bool = True) -> Proc:
        """Send ``sig`` to a process now. The supervisor restarts it unless ``respawn=False``."""
        proc = self.proc(name)
        proc.respawn = respawn
        if proc.alive:
            assert proc.process is not None
            proc.process.send_signal(sig)
            log.info("process_signalled", name=name, pid=proc.pid, signal=signal.Signals(sig).name)
        return proc

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its connections but does nothing (a long GC, a VM freeze)."""
        self.kill(name, signal.SIGSTOP, respawn=self.proc(name).respawn).paused = True

    def resume(self, name: str) -> None:
        self.kill(name, signal.SIGCONT, respawn=self.proc(name).respawn).paused = False

    async def wait_exit(self, name: str, timeout: float = 10.0) -> int:  # noqa: ASYNC109
        """Wait until the current incarnation of ``name`` has exited; its return code."""
        proc = self.proc(name)
        assert proc.process is not None
        async with asyncio.timeout(timeout):
            return await proc.process.wait()

    async def wait_ready(
        self, name: str, timeout: float = _READY_TIMEOUT_S, *, fail_fast: bool = True  # noqa: ASYNC109
    ) -> Proc:
        """Wait until ``name`` serves (announced with its current PID, or answers /healthz).

        ``fail_fast`` raises, with the end of its log, if the process exits meanwhile; pass
        False to wait through a supervisor restart (e.g. right after :meth:`kill`).
        """
        proc = self.proc(name)
        deadline = time.monotonic() + timeout
        while True:
            if fail_fast and proc.process is not None and not proc.alive:
                raise ServerError(f"{proc.name} exited during start (code "
                                  f"{proc.process.returncode}); end of {proc.log_path}:\n"
                                  f"{proc.log_tail()}", server=proc.name)
            if proc.alive and await self._is_ready(proc):
                return proc
            if time.monotonic() > deadline:
                raise ServerError(f"{proc.name} not ready within {timeout:g}s; end of "
                                  f"{proc.log_path}:\n{proc.log_tail()}", server=proc.name)
            await asyncio.sleep(_POLL_S)

    async def stop(self, timeout: float = 15.0) -> None:  # noqa: ASYNC109
        """SIGTERM every child (they drain), SIGKILL after ``timeout``, stop the servers."""
        if self._stopped:
            return
        self.supervisor.stopping = True
        watchers = [p.watcher for p in [*self._procs.values(), self.mailbox, self.api]
                    if p is not None and p.watcher is not None]
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        if self.api is not None:  # a client of the services: it goes first
            await terminate([self.api], 10.0)
        await terminate(list(self._procs.values()), timeout)
        if self.mailbox is not None:
            await terminate([self.mailbox], 5.0)
        if self._http is not None:
            await self._http.aclose()
        if self._redis is not None:
            await self._redis.aclose()
        if self.servers is not None:
            await self.servers.stop()
        if self.clusters is not None:
            await self.clusters.stop()
        if self.net is not None:
            self.net.close()
        self._stopped = True

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def write_stack_file(self) -> Path:
        """Describe this stack in ``base_dir/dev.json`` (kept current across restarts)."""
        self._stack_file_written = True
        return write_stack(self.describe(), {"BATON_HOME": str(self.base_dir)})

    def describe(self) -> dict[str, Any]:
        return {
            "redis_url": self.redis_url, "nats_url": self.nats_url, "mail_url": self.mail_url,
            **({"api_url": self.api_url, "api_tokens_file": str(self.base_dir / "api-tokens")}
               if self._api_port else {}),
            "namespace": self.namespace, "app": self.app_spec, "durable": self.durable,
            "archive_url": self._urls()["BATON_ARCHIVE_URL"],
            "cluster": self.cluster, "secure": self.secure,
            **({"tls_ca": str(self.tls.ca)} if self.tls is not None else {}),
            "model": self.env.get("BATON_AGENT_MODEL", ""),
            "base_dir": str(self.base_dir), "supervisor_pid": os.getpid(),
            "processes": self.processes, "ready": True,
        }

    # ------------------------------------------------------------------ internals

    async def _ensure_streams(self) -> None:
        from baton.bus.bus import Bus

        async with await Bus.connect(self.settings("admin"), "dev-setup", "admin") as bus:
            await bus.ensure_streams()

    def _require_servers(self) -> EmbeddedStack | ClusterStack:
        if self.clusters is not None:
            return self.clusters
        if self.servers is None:
            raise ServerError("the stack is not started", server="dev")
        return self.servers

    def _urls(self, role: str = "admin") -> dict[str, str]:
        urls = {"BATON_REDIS_URL": self.redis_url, "BATON_NATS_URL": self.nats_url,
                "BATON_MAIL_URL": self.mail_url, "BATON_NAMESPACE": self.namespace,
                # Archived sessions go under the stack's data dir (an operator's own
                # BATON_ARCHIVE_URL in the stack's env wins, as every BATON_* there does)
                "BATON_ARCHIVE_URL": self.env.get("BATON_ARCHIVE_URL")
                or str(self.base_dir / "archive")}
        if self.secure:
            urls |= secure.role_env(role, self.redis_url, self.passwords)
        if self.tls is not None:
            urls |= {"BATON_REDIS_TLS_CA": str(self.tls.ca),
                     "BATON_NATS_TLS_CA": str(self.tls.ca)}
        return urls

    def _new_proc(self, role: str, name: str | None, env: dict[str, str] | None,
                  app: str | None = None) -> Proc:
        if name is None:
            n = 1
            while f"{role}-{n}" in self._procs:
                n += 1
            name = f"{role}-{n}"
        if name in self._procs:
            raise ValueError(f"a process named {name!r} exists already")
        argv = [sys.executable, "-m", "baton", role]
        if role in ("brain", "hands"):
            argv += ["--app", app or self.app_spec]
        child_env = {**self._urls(role), **(env or {}), "BATON_WORKER_NAME": name}
        proc = Proc(role, name, argv, child_env, self.log_dir / f"{name}.log")
        if self.net is not None:
            if not self._free_members:
                raise ServerError("no network namespace left for another process", server="dev")
            proc.member = self._free_members.pop(0)
            proc.wrapper = self.net.wrapper(proc.member)
        self._procs[name] = proc
        return proc

    async def _start_mailbox(self) -> None:
        await self._start_http_proc("mailbox")

    def _http_proc(self, role: str) -> Proc:
        """The mail service or the API on a new free port (``_mail_port`` / ``_api_port``)."""
        port = free_port()
        if role == "mailbox":
            self._mail_port = port
            argv = [sys.executable, "-m", "baton", "mailbox", "--port", str(port),
                    "--delay-ms", str(self.mail_delay_ms)]
            if self.net is not None:  # reached by services in their namespaces
                argv += ["--host", self.net.address(HOST)]
            if self.mail_persist:
                argv += ["--data", str(self.data_dir / "mailbox")]
            self.mailbox = Proc("mailbox", "mailbox", argv, {}, self.log_dir / "mailbox.log")
            return self.mailbox
        self._api_port = port
        # Not open (--dev): a token of the stack's own, in a 0600 file under its home.
        from baton.api.auth import dev_tokens_file

        argv = [sys.executable, "-m", "baton", "api", "--host", "127.0.0.1", "--port",
                str(port), "--tokens-file", str(dev_tokens_file(self.base_dir))]
        self.api = Proc("api", "api", argv, self._urls(), self.log_dir / "api.log")
        return self.api

    async def _start_http_proc(self, role: str) -> None:
        """Start it, on another port if the one picked was taken meanwhile (3 tries)."""
        for attempt in range(3):
            proc = self._http_proc(role)
            await self.supervisor.launch(proc)
            try:
                await self.wait_ready(proc.name)
                return
            except ServerError:
                proc.respawn = False
                if proc.watcher is not None:
                    proc.watcher.cancel()
                if attempt == 2 or "in use" not in proc.log_tail().lower():
                    raise

    async def _is_ready(self, proc: Proc) -> bool:
        if proc.role in ("mailbox", "api"):
            assert self._http is not None
            url = self.mail_url if proc.role == "mailbox" else self.api_url
            with contextlib.suppress(httpx.HTTPError):
                return (await self._http.get(f"{url}/healthz")).status_code == 200
            return False
        assert self._redis is not None
        field = f"{proc.role}:{proc.name}"
        keys = Keys(self.namespace, self.settings().shards)
        try:
            raw = await self._redis.hget(keys.workers(field), field)
        except REDIS_ERRORS:  # a dropped connection (a cluster under load): ask again
            return False
        return raw is not None and json.loads(raw).get("pid") == proc.pid

    def _refresh_stack_file(self) -> None:
        if self._stack_file_written and not self.supervisor.stopping:
            self.write_stack_file()
