"""One round trip for the session scripts a process issues in the same event-loop turn.

A Hands worker fetches tool messages in batches and handles each in its own task: the
claims of one fetch are all issued before any of them is answered, and results that come
back together complete together. :class:`ScriptBatch` sends the scripts queued within one
loop turn in one round trip (:func:`~baton.store.redis_client.run_batch`; no MULTI: each
script is its own atomic, fenced transition, so batching changes nothing about what each
one decides), then answers every caller with its own reply or its own error, mapped as
:meth:`ScriptRunner.run` maps it.

It batches only where a pipeline of scripts is plain: one Redis server and no replica
acknowledgement (a transition that waits for a replica goes through its own ``WAIT``, and
redis-py's cluster pipeline refuses scripts); otherwise, and for a lone script, it calls
:meth:`ScriptRunner.run` directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

from baton.store.keys import SessionKeys
from baton.store.redis_client import REDIS_ERRORS, is_cluster, run_batch
from baton.store.scripts import ScriptRunner, SessionScript, declared

__all__ = ["ScriptBatch"]


@dataclass
class _Call:
    script: SessionScript
    sk: SessionKeys
    args: list[Any]
    run_id: str
    reply: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class ScriptBatch:
    """Queues session scripts and sends each loop turn's queue as one pipeline."""

    def __init__(self, runner: ScriptRunner) -> None:
        self.runner = runner
        self.enabled = not is_cluster(runner.registered.redis)
        self._queue: list[_Call] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # pipelines sent (for tests and benchmarks)

    async def run(self, script: SessionScript, sk: SessionKeys, args: list[Any],
                  run_id: str = "") -> Any:
        """As :meth:`ScriptRunner.run`, sharing a round trip with the scripts queued in the
        same loop turn."""
        if not self.enabled or self.runner.replicated(script):
            return await self.runner.run(script, sk, args, run_id)
        call = _Call(script, sk, args, run_id)
        self._queue.append(call)
        if len(self._queue) == 1:  # the first of this turn: send them all once it ends
            asyncio.get_running_loop().call_soon(self._flush)
        return await call.reply

    def _flush(self) -> None:
        calls, self._queue = self._queue, []
        task = asyncio.get_running_loop().create_task(self._send(calls))
        self._tasks.add(task)  # held until done: a pending task must not be collected
        task.add_done_callback(self._tasks.discard)

    async def _send(self, calls: list[_Call]) -> None:
        if len(calls) == 1:
            await self._direct(calls[0])
            return
        self.batches += 1
        scripts = self.runner.registered
        commands = []
        for c in calls:
            keys = declared(c.script, c.sk)
            commands.append(("EVALSHA", getattr(scripts, c.script).sha, len(keys), *keys, "",
                             *c.args))
        try:
            results = await run_batch(scripts.redis, commands)
        except Exception as exc:  # the connection failed: every caller gets the error
            for c in calls:
                _answer(c, exc=self.runner._error(exc, c.sk, c.run_id)
                        if isinstance(exc, REDIS_ERRORS) else exc)
            return
        except BaseException:  # cancelled (the loop is closing): so are the callers
            for c in calls:
                c.reply.cancel()
            raise
        for c, result in zip(calls, results, strict=True):
            if isinstance(result, NoScriptError):
                # The server lost its scripts (a restart) and did not run this one: redis-py
                # loads it again on a direct call.
                await self._direct(c)
            elif isinstance(result, Exception):
                _answer(c, exc=self.runner._error(result, c.sk, c.run_id))
            else:
                _answer(c, result=result)

    async def _direct(self, c: _Call) -> None:
        try:
            result = await self.runner.run(c.script, c.sk, c.args, c.run_id)
        except Exception as exc:
            _answer(c, exc=exc)
        except BaseException:
            c.reply.cancel()
            raise
        else:
            _answer(c, result=result)


def _answer(c: _Call, *, result: Any = None, exc: BaseException | None = None) -> None:
    if c.reply.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        c.reply.set_exception(exc)
    else:
        c.reply.set_result(result)
