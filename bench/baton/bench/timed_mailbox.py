"""The bundled mail service with its delivery timestamps in ``GET /stats``, for ``bench limits``.

:class:`~baton.devkit.mailbox.MailboxServer` records each delivery's time (``delivered_at``,
taken as the send arrives, before any delay) and counts the sends in flight and their peak;
its ``/stats`` gives the counts. This one adds ``delivered_at_ms``: every recorded delivery's
time since the epoch in ms, sorted, so a bench in another process can measure a rate on the
service's own clock (``POST /reset`` clears them with the rest).

``python -m baton.bench.timed_mailbox --delay-ms 20`` prints ``{"url": ...}`` once it listens
and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from datetime import datetime

from aiohttp import web

from baton.devkit.mailbox import MailboxServer

__all__ = ["TimedMailbox"]


class TimedMailbox(MailboxServer):
    """The mail service whose ``/stats`` also lists the deliveries' times (epoch ms)."""

    async def _stats(self, request: web.Request) -> web.Response:
        response = await super()._stats(request)
        assert isinstance(response.body, bytes)
        stats = json.loads(response.body)
        stats["delivered_at_ms"] = sorted(
            datetime.fromisoformat(op.delivered_at).timestamp() * 1000
            for op in self.operations.values())
        return web.json_response(stats)


async def _serve(delay_ms: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with TimedMailbox(delay_ms=delay_ms) as server:
        print(json.dumps({"url": server.url}), flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton.bench.timed_mailbox",
                                     description=__doc__)
    parser.add_argument("--delay-ms", type=int, default=0,
                        help="hold each new send this long before answering")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.delay_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
