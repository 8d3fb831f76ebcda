"""The lifecycle every long-lived Baton worker shares (Brain, Hands, Relay).

:class:`Service` is an abstract base: a worker *is* a service (``serve()``, idempotent
``shutdown()``, ``async with``, the drain), so the three roles inherit one lifecycle rather
than each delegating the same public surface to a held object. The base owns every
attribute it reads (nothing is looked up on the subclass by name); a subclass implements
:meth:`Service.serve` and sets :attr:`Service.bus` while it is connected.

``serve()`` runs the worker's loops as children of one task group until
:meth:`Service.shutdown` is called, then drains: no new messages are taken,
work in hand finishes within ``drain_timeout_s``, then what is left is cancelled. Signals
are handled only by :func:`run_until_signalled` (the entry points): the first SIGTERM or
SIGINT drains, a second one cancels at once. With ``health_port`` set, the entry point also
serves ``/healthz`` and ``/readyz`` (:mod:`baton.observability.health`) from
:meth:`Service.health_checks`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from redis.asyncio import Redis

from baton.errors import BatonError, RedisUnavailable, UnavailableError
from baton.models import dumps
from baton.observability.log import error_text, get_logger
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.redis_client import redis_user
from baton.store.scripts import Library
from baton.store.store import now_ms, worker_ref
from baton.store.workers import ANNOUNCE_EVERY_S, PRUNE_EVERY_S, prune_gone

if TYPE_CHECKING:
    from baton.bus.bus import Bus
    from baton.store.epoch import StoreEpoch

log = get_logger("baton.service")
T = TypeVar("T")

# The cyclic collector's thresholds in a worker process (Brain, Hands, relay), set by its
# entry point, never by the library. A message allocates thousands of short-lived containers
# (records, dicts, frames) that reference counting frees; with the default (700, 10, 10) a
# busy worker ran a young collection every few messages, each scanning everything still in
# hand: about 5% of a Brain's CPU. Collections come 15x more rarely (the objects kept
# meanwhile are garbage cycles, few), at the same generational ratios.
GC_THRESHOLDS = (10_000, 10, 10)


def tune_collector() -> None:
    """Set :data:`GC_THRESHOLDS` for this process: call it from a worker's ``main`` only."""
    gc.set_threshold(*GC_THRESHOLDS)


async def wait_either(stopping: asyncio.Event, event: asyncio.Event,
                      timeout: float | None) -> bool:  # noqa: ASYNC109
    """Wait up to ``timeout`` s (None: no limit) for ``event`` or ``stopping``; True if
    stopping. A cancelled task that a library left running raises here, as in
    :meth:`Service.wait_stopping`."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    if not (stopping.is_set() or event.is_set()):
        waits = [asyncio.ensure_future(e.wait()) for e in (stopping, event)]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    return stopping.is_set()


class Service(abc.ABC):
    """A long-lived worker: serve until shut down, then drain."""

    role: ClassVar[str]  # "brain", "hands", "relay": names the worker and its announcement

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.worker_id(self.role)
        self.worker = worker_ref(self.role, self.name)
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        self.bus: Bus | None = None  # the NATS connection while serving (set by serve)
        self._inflight: set[asyncio.Task[object]] = set()
        #: Set when work arrives (a message spawned); checks that slow down while the
        #: process idles wait on it (:meth:`StoreEpoch.watch`).
        self.woken = asyncio.Event()
        self.redis_reachable = True  # as of the last announcement
        #: Redis has this version's scripts (its function library), as of the last
        #: announcement: a role user may not load them, so until `baton load-functions` has
        #: run every transition is refused and the service is not ready.
        self.functions_loaded = True
        self._library: Library | None = None
        self._pruned_at: float | None = None  # monotonic time of the last prune_gone

    @abc.abstractmethod
    async def serve(self) -> None:
        """Connect, set ``ready``, run until ``stopping`` is set, drain, close."""

    def shutdown(self) -> None:
        """Begin a graceful drain; idempotent."""
        if not self.stopping.is_set():
            log.info("service_draining", role=self.role, worker=self.name)
            self.stopping.set()

    def spawn(self, coro: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        """Run one unit of work (a message) tracked for the drain."""
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        self.woken.set()
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    def health_checks(self) -> dict[str, bool]:
        """Readiness checks for /readyz; all True = ready.

        Started (connected, consumers created), not draining, the last announcement reached
        Redis, and the NATS connection (``bus``, once serve made it) is up.
        """
        checks = {"started": self.ready.is_set(), "not_draining": not self.stopping.is_set(),
                  "redis_reachable": self.redis_reachable,
                  "functions_loaded": self.functions_loaded}
        if self.bus is not None:
            checks["nats_connected"] = bool(self.bus.nc.is_connected)
        return checks

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def busy(self) -> bool:
        """Work in hand now (a message being handled)."""
        return bool(self._inflight)

    def watch_epoch(self, epoch: StoreEpoch) -> Coroutine[Any, Any, None]:
        """The epoch check loop (:meth:`StoreEpoch.watch`), slower while this process idles."""
        lease_ms = self.settings.lease_ms
        return epoch.watch(self.stopping, epoch.watch_interval(lease_ms),
                           idle_s=epoch.idle_interval(lease_ms), busy=self.busy,
                           woken=self.woken)

    async def drain(self) -> None:
        """Wait for in-flight work up to the drain timeout, then cancel what is left."""
        if not self._inflight:
            return
        _, pending = await asyncio.wait(
            set(self._inflight), timeout=self.settings.drain_timeout_s
        )
        for task in pending:
            task.cancel()
        if pending:
            log.warning("drain_timeout_cancelled", role=self.role, cancelled=len(pending))
            # Bounded: redis-py may swallow a cancellation that lands inside a command.
            await asyncio.wait(pending, timeout=2.0)

    async def connect(self, what: str, connect: Callable[[], Awaitable[T]]) -> T:
        """Connect, waiting (with backoff) while the server is unavailable.

        A worker started before Redis or NATS is up, or during their restart, waits for
        them instead of exiting; a configuration or permission error still ends it at once.
        A shutdown while waiting raises ``asyncio.CancelledError``.
        """
        delay = 0.2
        while True:
            try:
                return await connect()
            except UnavailableError as exc:
                log.warning("server_unavailable_waiting", role=self.role, server=what,
                            error=str(exc), retry_in_s=delay)
            if await self.wait_stopping(delay):
                raise asyncio.CancelledError(f"shutdown while waiting for {what}")
            delay = min(delay * 2, 5.0)

    async def wait_stopping(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` s for shutdown; True if shutting down. A tick, not a sleep.

        ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` can swallow a
        cancellation that arrives as its inner wait ends. And a loop whose cancellation a
        library swallowed (redis-py's cluster client can) is still marked cancelling: every
        loop ticks through here, so it ends here instead of running on, cancelled, and
        keeping its task group (and the process's shutdown) from ever finishing.
        """
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        if self.stopping.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await self.stopping.wait()
        except TimeoutError:
            return False
        return True

    def announcement(self) -> dict[str, object]:
        """Extra facts the service announces (a Brain: the compat levels it serves)."""
        return {}

    async def announce(self, redis: Redis, keys: Keys) -> None:
        """Record this worker as alive in its shard's ``workers`` hash until it stops (for
        inspect and the relays' count of each other), every ``ANNOUNCE_EVERY_S``."""
        while True:
            await self.announce_once(redis, keys)
            if await self.wait_stopping(ANNOUNCE_EVERY_S):
                await self.withdraw(redis, keys)
                return

    async def announce_once(self, redis: Redis, keys: Keys) -> None:
        """One announcement (a worker with a tick of its own announces on it: one wake-up
        where two loops would take two)."""
        field = f"{self.role}:{self.name}"
        info = {"role": self.role, "name": self.name, "pid": self.worker.pid,
                "seen_ms": now_ms(), "inflight": self.inflight, **self.announcement()}
        try:
            await redis.hset(keys.workers(field), field, dumps(info))
            self.redis_reachable = True
        except Exception as exc:  # Redis down: keep serving, report later
            self.redis_reachable = False
            log.warning("announce_failed", error=str(exc))
            return
        await self._check_functions(redis)
        now = time.monotonic()
        if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            await self.prune_gone(redis, keys)

    async def _check_functions(self, redis: Redis) -> None:
        """Whether Redis has this version's function library (one FCALL of its ping): the
        default user loads it when missing, as its first script call would; a role user may
        not, and the service says why once and is not ready until it is loaded."""
        if self._library is None:
            self._library = Library(redis, acl_checks=redis_user(self.settings) != "default",
                                    receipts_kept=self.settings.receipts_kept)
        try:
            await self._library.ensure()
        except RedisUnavailable as exc:  # missing, and this user may not load it
            if self.functions_loaded:
                log.warning("functions_missing", error=str(exc))
            self.functions_loaded = False
            return
        except Exception as exc:  # Redis going away meanwhile: the next announcement sees it
            log.debug("functions_check_failed", error=error_text(exc))
            return
        if not self.functions_loaded:
            log.info("functions_loaded", library=self._library.name)
        self.functions_loaded = True

    async def prune_gone(self, redis: Redis, keys: Keys) -> None:
        """Delete the liveness records of this role's workers gone for longer than
        ``dead_worker_keep_s`` (killed without withdrawing theirs): at the first
        announcement, then every :data:`PRUNE_EVERY_S`. A failure waits for the next."""
        try:
            gone = await prune_gone(redis, keys, self.role, now_ms(),
                                    round(self.settings.dead_worker_keep_s * 1000))
        except Exception as exc:  # Redis down, or an ACL without it: the records wait
            log.warning("dead_workers_prune_failed", error=error_text(exc))
            return
        if gone:
            log.info("dead_workers_pruned", role=self.role, workers=gone[:20], count=len(gone))

    async def withdraw(self, redis: Redis, keys: Keys) -> None:
        """Remove the announcement (a graceful stop); a failure leaves it to go stale."""
        field = f"{self.role}:{self.name}"
        with contextlib.suppress(Exception):
            await redis.hdel(keys.workers(field), field)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()


async def run_until_signalled(service: Service) -> None:
    """Entry-point helper: serve until SIGTERM/SIGINT; a second signal cancels.

    With ``BATON_PROFILE`` set to a directory, the process runs under cProfile (CPU time) and writes
    ``<role>-<pid>.prof`` there when it stops (for finding where a worker's CPU goes).
    """
    profile_dir = os.environ.get("BATON_PROFILE", "")
    if not profile_dir:
        await _serve_until_signalled(service)
        return
    import cProfile

    profiler = cProfile.Profile(time.process_time)  # CPU, not wall time
    profiler.enable()
    try:
        await _serve_until_signalled(service)
    finally:
        profiler.disable()
        profiler.dump_stats(os.path.join(profile_dir, f"{service.role}-{os.getpid()}.prof"))


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A connection that died under a transport (a Redis or NATS node killed mid-TLS: the
    loop's 'Fatal error on SSL protocol') is one WARNING line: its client sees the loss and
    reconnects, so the loop's ERROR with a traceback said nothing more and alarmed. Anything
    else goes to the loop's default handler."""
    exc = context.get("exception")
    message = str(context.get("message", ""))
    if isinstance(exc, OSError) and message.startswith("Fatal error on"):
        log.warning("connection_lost_under_transport", detail=message, error=error_text(exc))
        return
    loop.default_exception_handler(context)


async def _serve_until_signalled(service: Service) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_loop_exception)
    main = asyncio.ensure_future(service.serve())
    frozen = asyncio.ensure_future(_freeze_when_ready(service))
    signals = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("signal_received", signal=sig.name, action="drain")
            service.shutdown()
        else:
            log.warning("signal_received", signal=sig.name, action="cancel")
            main.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        if service.settings.health_port:
            from baton.observability.health import serve_health

            async with serve_health(service, service.settings.health_port,
                                    service.settings.health_host):
                await main
        else:
            await main
    except asyncio.CancelledError:
        if signals < 2:
            raise
    except BaseExceptionGroup as group:
        # A terminal error from one of the service's loops (e.g. StoreEpochError) ends the
        # process with its own one-line message, not a task-group traceback.
        fatal = group.subgroup(lambda e: isinstance(e, BatonError))
        if fatal is None:
            # A bug: the process ends (a supervisor restarts it), and its log keeps the
            # traceback, which the one line the command prints does not carry.
            leaves: list[BaseException] = []
            _leaves(group, leaves)
            log.exception("service_crashed", role=service.role,
                          error="; ".join(error_text(e) for e in leaves[:3]))
            raise
        first: BaseException = fatal
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    finally:
        frozen.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _leaves(exc: BaseException, into: list[BaseException]) -> None:
    """The errors an exception group holds, groups within it flattened."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            _leaves(inner, into)
    else:
        into.append(exc)


async def _freeze_when_ready(service: Service) -> None:
    """Once the worker is ready, move every object it has (modules, app, connections: almost
    all of them live as long as the process) out of the garbage collector's sight: the
    collections that per-message garbage triggers then scan only what came after. Measured
    on a Hands worker at 32 sessions in flight: GC time from ~11% to ~4% of its CPU."""
    await service.ready.wait()
    gc.freeze()
    loop = type(asyncio.get_running_loop())
    log.info("event_loop", role=service.role, loop=f"{loop.__module__}.{loop.__qualname__}")
