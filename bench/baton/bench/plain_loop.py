"""The in-process baseline: the five-notice session as a plain asyncio loop with a JSONL log.

No Brain, Hands or Relay, no Redis or NATS: one coroutine per session plays the model turn
(the addresses are read from the text), sends the five mails in parallel to the same mail
service with an ``Idempotency-Key`` each (through the client the Hands give their tools,
:func:`baton.hands.http.http_client`, built the same way, as ``send_email`` sends), writes one JSON
line per step to a log file and ends with the summary turn. It is what the system's figures
are divided by (ratios hold on any machine), measured on the same mail service in the same
run.

Its log is as durable as the stack it is held against. Beside non-durable servers (``bench
e2e``) each line is written and flushed, never fsync'd. Beside durable ones (``bench
durable``: Redis ``appendfsync always``, JetStream ``sync_interval: always``) each step
waits for an fsync of the log, and the lines written in one loop turn share it (a group
commit, as Redis shares one fsync among the writes of an event loop turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import orjson

from baton.bench.baselines import Baseline
from baton.hands.http import http_client
from baton.settings import Settings

__all__ = ["PlainLoop", "opened"]

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+\w")


class PlainLoop:
    """Sessions of the five-notice workload, in this process."""

    def __init__(self, mail_url: str, log: IO[bytes], *, fsync: bool = False) -> None:
        self.http = http_client(Settings.model_fields["connect_timeout_s"].default)
        self.send_url = f"{mail_url}/send"
        self.log = log
        self.fsync = fsync
        self.fsyncs = 0  # fsync calls made (for tests)
        self._synced: asyncio.Future[None] | None = None  # the loop turn's pending fsync
        self._flushed: asyncio.Future[None] | None = None  # done: nothing more to wait for

    def _step(self, **line: Any) -> asyncio.Future[None]:
        """Write and flush one line; what to await before the next step: the fsync that
        covers it, or (not durable) a future already done, whose await returns at once
        without a loop turn, so the non-durable loop does no more per step than a write."""
        self.log.write(orjson.dumps(line) + b"\n")
        self.log.flush()
        if self.fsync:
            return self._durable()
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
            self._flushed.set_result(None)
        return self._flushed

    def _durable(self) -> asyncio.Future[None]:
        """The fsync that covers the lines written so far: one per loop turn, called once the
        turn's ready callbacks (the other sessions' steps) have run."""
        if self._synced is None:
            loop = asyncio.get_running_loop()
            self._synced = loop.create_future()
            loop.call_soon(self._sync)
        return self._synced

    def _sync(self) -> None:
        synced, self._synced = self._synced, None
        assert synced is not None
        try:
            os.fsync(self.log.fileno())
            self.fsyncs += 1
        except OSError as exc:
            synced.set_exception(exc)
        else:
            synced.set_result(None)

    async def _send(self, session: str, k: int, to: str) -> dict[str, Any]:
        response = await self.http.post(
            self.send_url, json={"to": to, "subject": "Notice", "body": "The approved notice."},
            headers={"Idempotency-Key": f"{session}-{k}"})
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        await self._step(session=session, step="tool", k=k, to=to, result=result)
        return result

    async def session(self, text: str) -> str:
        sid = uuid.uuid4().hex
        await self._step(session=sid, step="input", text=text)
        addresses = _ADDRESS.findall(text)
        await self._step(session=sid, step="model", calls=[{"tool": "send_email", "to": a}
                                                            for a in addresses])
        results = await asyncio.gather(*(self._send(sid, k, a)
                                         for k, a in enumerate(addresses)))
        summary = "; ".join(f"{a}: {'sent' if r else 'failed'}"
                            for a, r in zip(addresses, results, strict=True))
        await self._step(session=sid, step="final", summary=summary)
        return summary

    async def close(self) -> None:
        await self.http.aclose()


@contextlib.asynccontextmanager
async def opened(mail_url: str, text: str, *, fsync: bool = False) -> AsyncIterator[Baseline]:
    """The plain loop as a :class:`~baton.bench.baselines.Baseline` of ``text`` sessions
    (CPU: ``loop``, this process), its log in a temporary directory while it is open; with
    ``fsync``, each step durable before the next (group commit)."""
    with tempfile.TemporaryDirectory(prefix="baton-plain-") as tmp:
        with (Path(tmp) / "log.jsonl").open("ab") as log:
            loop = PlainLoop(mail_url, log, fsync=fsync)
            try:
                yield Baseline("plain loop", "five notices, in-process",
                               lambda: loop.session(text), "loop")
            finally:
                await loop.close()

