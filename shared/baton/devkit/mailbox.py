"""The bundled mail service: the "outside world" that the demo's ``send_email`` tool acts on.

It behaves like a provider with idempotent sends, which is the premise of the ``confirm``
replay policy:

- ``POST /send`` with an ``Idempotency-Key`` header and ``{"to", "subject", "body"}`` delivers
  once per key. Repeating a key returns the original operation with ``"duplicate": true``, also
  when the repeats race each other.
- ``GET /operations/{key}`` answers "did this send happen?" (200 with the operation, or 404).
- ``GET /stats`` counts raw requests, accepted operations, suppressed duplicates (and how often
  each key was repeated) and deliveries per recipient: the numbers chaos runs check "exactly
  once" against; and sends in flight now and at most (``in_flight``, ``max_in_flight``:
  what a fleet-wide cap on the tool must keep down).
- ``GET /healthz``, and ``POST /reset`` to clear the state between test or bench runs.
- ``POST /hold`` and ``POST /release``: while held, every new send is recorded and its answer
  waits for the release (``held`` in ``/stats`` counts them). Tests use it to stop work at a
  known point (every job has one mail accepted, none answered) instead of racing a delay.

An operation is recorded before the send is answered: with ``--data DIR`` it is appended to
``DIR/operations.jsonl`` and fsync'd, so it survives a restart of the service. ``--delay-ms``
(or a per-request ``X-Delay-Ms`` header) holds the answer *after* recording, which opens the
window crash tests need: the mail is accepted but the caller has not seen the reply yet.
Request counters (raw requests, duplicates) are process-local and restart at zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import click
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

OPERATIONS_FILE = "operations.jsonl"
MAX_DELAY_MS = 600_000
# Keys are operation ids chosen by the caller: printable ASCII without spaces, bounded length.
_KEY_RE = re.compile(r"^[\x21-\x7e]{1,256}$")


class SendRequest(BaseModel):
    """Body of ``POST /send``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: str = Field(min_length=1, max_length=320)
    subject: str = Field(max_length=1_000)
    body: str = Field(max_length=256 * 1024)


class Operation(BaseModel):
    """One delivered send, as recorded and as returned to callers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    operation_id: str
    status: Literal["delivered"] = "delivered"
    to: str
    subject: str
    body: str
    message_id: str
    delivered_at: str


class _Store:
    """Operations by key, optionally backed by an append-only, fsync'd JSON-lines file."""

    def __init__(self, data_dir: Path | None) -> None:
        self.path = data_dir / OPERATIONS_FILE if data_dir is not None else None
        self.operations: dict[str, Operation] = {}
        self._file_lock = threading.Lock()

    def load(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            # A crash in the middle of an append left a torn last line. That operation was
            # never answered, so dropping it is the correct recovery; cut it off so the next
            # append starts on a line of its own.
            with self.path.open("r+b") as f:
                f.truncate(len(complete))
                os.fsync(f.fileno())
        for line in complete.splitlines():
            if line.strip():
                op = Operation.model_validate_json(line)
                self.operations.setdefault(op.operation_id, op)

    def append(self, op: Operation) -> None:
        if self.path is None:
            return
        line = op.model_dump_json() + "\n"
        with self._file_lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def truncate(self) -> None:
        if self.path is not None:
            with self._file_lock, self.path.open("w", encoding="utf-8") as f:
                f.flush()
                os.fsync(f.fileno())


def _error(status: int, code: str, detail: str | None = None) -> web.Response:
    payload: dict[str, Any] = {"error": code}
    if detail is not None:
        payload["detail"] = detail
    return web.json_response(payload, status=status)


class MailboxServer:
    """The mail service as an async context manager: ``async with MailboxServer() as m: m.url``.

    ``port=0`` binds a free port; :attr:`url` tells which.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        delay_ms: int = 0,
        data_dir: str | Path | None = None,
    ) -> None:
        if not 0 <= delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be within 0..{MAX_DELAY_MS}")
        self.host = host
        self.port = port
        self.delay_ms = delay_ms
        self._store = _Store(Path(data_dir) if data_dir is not None else None)
        # Sends whose record is being written: a racing duplicate waits for the first one.
        self._pending: dict[str, asyncio.Task[Operation]] = {}
        self.raw_requests = 0
        self.rejected = 0
        self.duplicates_suppressed = 0
        self.repeats: Counter[str] = Counter()  # key -> requests after the first
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._open = asyncio.Event()  # cleared by POST /hold, set by POST /release
        self._open.set()
        self.held = 0
        self.in_flight = 0  # sends being answered now (from their arrival to the answer)
        self.max_in_flight = 0

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234``; only valid after :meth:`start`."""
        if self._url is None:
            raise RuntimeError("mailbox server is not started")
        return self._url

    @property
    def operations(self) -> dict[str, Operation]:
        """Recorded operations by key (read-only use)."""
        return self._store.operations

    async def start(self) -> None:
        if self._runner is not None:
            return
        await asyncio.to_thread(self._store.load)
        app = web.Application(client_max_size=1024 * 1024)
        app.add_routes(
            [
                web.post("/send", self._send),
                web.get("/operations/{operation_id}", self._get_operation),
                web.get("/stats", self._stats),
                web.get("/healthz", self._healthz),
                web.post("/reset", self._reset),
                web.post("/hold", self._hold),
                web.post("/release", self._release),
            ]
        )
        # A held (delayed) reply must not hold up a shutdown for long.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.port = port
        self._url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

    async def stop(self) -> None:
        """Stop listening and finish in-flight requests; idempotent."""
        runner, self._runner = self._runner, None
        self._open.set()  # held answers go out before the server stops
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> MailboxServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _send(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer_send(request)
        finally:
            self.in_flight -= 1

    async def _answer_send(self, request: web.Request) -> web.Response:
        self.raw_requests += 1
        key = request.headers.get("Idempotency-Key", "")
        if not _KEY_RE.match(key):
            self.rejected += 1
            return _error(400, "missing_idempotency_key", "Idempotency-Key header is required")
        try:
            delay_ms = int(request.headers.get("X-Delay-Ms", self.delay_ms))
            if not 0 <= delay_ms <= MAX_DELAY_MS:
                raise ValueError(delay_ms)
        except ValueError:
            self.rejected += 1
            return _error(400, "invalid_delay", f"X-Delay-Ms must be within 0..{MAX_DELAY_MS}")
        try:
            send = SendRequest.model_validate_json(await request.read())
        except PydanticValidationError as exc:
            self.rejected += 1
            return _error(400, "invalid_body", str(exc))

        op, duplicate = await self._record(key, send)
        if duplicate:
            self.duplicates_suppressed += 1
            self.repeats[key] += 1
        else:
            if not self._open.is_set():
                self.held += 1
                try:
                    await self._open.wait()
                finally:
                    self.held -= 1
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
        return web.json_response({**op.model_dump(), "duplicate": duplicate})

    async def _record(self, key: str, send: SendRequest) -> tuple[Operation, bool]:
        """Check-and-set on the key: at most one delivery, even for racing requests."""
        existing = self._store.operations.get(key)
        if existing is not None:
            return existing, True
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending), True
        # The write runs as its own task so that a caller going away cannot leave an
        # operation in the file but not in memory.
        task = asyncio.create_task(self._deliver(key, send))
        self._pending[key] = task
        task.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(task), False

    async def _deliver(self, key: str, send: SendRequest) -> Operation:
        op = Operation(
            operation_id=key,
            to=send.to,
            subject=send.subject,
            body=send.body,
            message_id=f"<{uuid.uuid4().hex}@mailbox.baton>",
            delivered_at=datetime.now(UTC).isoformat(),
        )
        if self._store.path is not None:
            await asyncio.to_thread(self._store.append, op)
        self._store.operations[key] = op
        return op

    async def _get_operation(self, request: web.Request) -> web.Response:
        op = self._store.operations.get(request.match_info["operation_id"])
        if op is None:
            return _error(404, "not_found")
        return web.json_response(op.model_dump())

    async def _stats(self, request: web.Request) -> web.Response:
        deliveries = Counter(op.to for op in self._store.operations.values())
        return web.json_response(
            {
                "raw_requests": self.raw_requests,
                "accepted": len(self._store.operations),
                "duplicates_suppressed": self.duplicates_suppressed,
                "rejected": self.rejected,
                "deliveries": dict(deliveries),
                "repeated_keys": dict(self.repeats),
                "held": self.held,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
            }
        )

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _hold(self, request: web.Request) -> web.Response:
        self._open.clear()
        return web.json_response({"ok": True, "held": self.held})

    async def _release(self, request: web.Request) -> web.Response:
        self._open.set()
        return web.json_response({"ok": True, "released": self.held})

    async def _reset(self, request: web.Request) -> web.Response:
        await asyncio.to_thread(self._store.truncate)
        self._store.operations.clear()
        self.raw_requests = self.rejected = self.duplicates_suppressed = 0
        self.max_in_flight = self.in_flight
        self.repeats.clear()
        return web.json_response({"ok": True})


async def serve_mailbox(
    port: int,
    delay_ms: int,
    data_dir: str | Path | None,
    host: str = "127.0.0.1",
    ready: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run the mail service until cancelled; ``ready`` is set (and ``on_ready(url)`` called)
    once it accepts connections."""
    async with MailboxServer(port=port, host=host, delay_ms=delay_ms, data_dir=data_dir) as server:
        if on_ready is not None:
            on_ready(server.url)
        if ready is not None:
            ready.set()
        await asyncio.Future()  # until cancelled


async def _run_until_signalled(port: int, delay_ms: int, data_dir: str | None, host: str,
                               as_json: bool = False) -> None:
    loop = asyncio.get_running_loop()

    def ready(url: str) -> None:
        click.echo(json.dumps({"event": "mailbox_listening", "url": url}) if as_json
                   else f"mailbox listening on {url}")

    task = asyncio.create_task(serve_mailbox(port, delay_ms, data_dir, host, on_ready=ready))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


@click.command("mailbox")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Port to listen on; 0 picks a free one.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--delay-ms",
    type=click.IntRange(0, MAX_DELAY_MS),
    default=0,
    show_default=True,
    help="Hold each new send this long after recording it, before answering.",
)
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the durable operation log; in memory when omitted.",
)
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object: where it listens (then it serves)")
def mailbox_command(port: int, host: str, delay_ms: int, data_dir: str | None,
                    as_json: bool) -> None:
    """Run the bundled mail service (idempotent sends, query by operation id)."""
    asyncio.run(_run_until_signalled(port, delay_ms, data_dir, host, as_json))


if __name__ == "__main__":
    mailbox_command()
