"""Private ``redis-server`` and ``nats-server`` processes on free loopback ports.

Used by the test fixtures, ``baton dev``, chaos runs and benchmarks. Each server is an async
context manager owning one child process (:class:`~baton.devkit.process.ServerProcess`): it
is stopped by its own PID (SIGTERM, then SIGKILL after a timeout), can be SIGKILLed for crash
tests, and restarts on the same port and data directory so durable data survives. Readiness
is read from the server itself (Redis reports this process's id with its data loaded; NATS
sends its ``INFO`` line with JetStream enabled), polled with a deadline. Redis is here, NATS
in :mod:`baton.devkit.nats_servers` (its names import from here too).

Given :class:`~baton.devkit.tls.TlsFiles`, a server accepts TLS connections only: Redis
listens on its TLS port alone (``--port 0``), NATS requires TLS of every client (and of its
routes in a cluster); their URLs become ``rediss://`` and ``tls://``.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from baton.devkit.nats_servers import NatsCluster, NatsServer, nats_tls_block
from baton.devkit.process import (
    Managed,
    ServerProcess,
    find_binary,
    free_port,
)
from baton.devkit.tls import TlsFiles

__all__ = ["EmbeddedStack", "NatsCluster", "NatsServer", "RedisServer", "free_port",
           "nats_tls_block"]


class RedisServer(ServerProcess):
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
        return find_binary("redis-server", explicit, "BATON_REDIS_SERVER", [], hint)

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
