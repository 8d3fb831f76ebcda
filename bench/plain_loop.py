"""The in-process baseline: the five-notice session as a plain asyncio loop with a JSONL log.

No Brain, Hands or Relay, no Redis or NATS: one coroutine per session plays the model turn
(the addresses are read from the text), sends the five mails in parallel to the same mail
service with an ``Idempotency-Key`` each (through the client the Hands give their tools,
:func:`baton.hands.http.http_client`, built the same way, as ``send_email`` sends), writes one JSON
line per step to a log file (written and flushed, not fsync'd: the bench stack's servers do
not fsync either) and ends with the summary turn. It is what the system's figures are
divided by (ratios hold on any machine), measured on the same mail service in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
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

    def __init__(self, mail_url: str, log: IO[bytes]) -> None:
        self.http = http_client(Settings.model_fields["connect_timeout_s"].default)
        self.send_url = f"{mail_url}/send"
        self.log = log

    def _step(self, **line: Any) -> None:
        self.log.write(orjson.dumps(line) + b"\n")
        self.log.flush()

    async def _send(self, session: str, k: int, to: str) -> dict[str, Any]:
        response = await self.http.post(
            self.send_url, json={"to": to, "subject": "Notice", "body": "The approved notice."},
            headers={"Idempotency-Key": f"{session}-{k}"})
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        self._step(session=session, step="tool", k=k, to=to, result=result)
        return result

    async def session(self, text: str) -> str:
        sid = uuid.uuid4().hex
        self._step(session=sid, step="input", text=text)
        addresses = _ADDRESS.findall(text)
        self._step(session=sid, step="model", calls=[{"tool": "send_email", "to": a}
                                                      for a in addresses])
        results = await asyncio.gather(*(self._send(sid, k, a)
                                         for k, a in enumerate(addresses)))
        summary = "; ".join(f"{a}: {'sent' if r else 'failed'}"
                            for a, r in zip(addresses, results, strict=True))
        self._step(session=sid, step="final", summary=summary)
        return summary

    async def close(self) -> None:
        await self.http.aclose()


@contextlib.asynccontextmanager
async def opened(mail_url: str, text: str) -> AsyncIterator[Baseline]:
    """The plain loop as a :class:`~baton.bench.baselines.Baseline` of ``text`` sessions
    (CPU: ``loop``, this process), its log in a temporary directory while it is open."""
    with tempfile.TemporaryDirectory(prefix="baton-plain-") as tmp:
        with (Path(tmp) / "log.jsonl").open("ab") as log:
            loop = PlainLoop(mail_url, log)
            try:
                yield Baseline("plain loop", "five notices, in-process",
                               lambda: loop.session(text), "loop")
            finally:
                await loop.close()

