"""One round trip for the session scripts a process issues in the same event-loop turn.

A Hands worker fetches tool messages in batches and handles each in its own task: the
claims of one fetch are all issued before any of them is answered, and results that come
back together complete together. :class:`ScriptBatch` sends the scripts queued within one
loop turn in one round trip (:func:`~baton.store.redis_client.run_batch`; no MULTI: each
script is its own atomic, fenced transition, so batching changes nothing about what each
one decides), then answers every caller with its own reply or its own error, mapped as
:meth:`ScriptRunner.run` maps it.

A script that takes a list of items after its shared arguments (claim.lua: the runs of one
session a worker claims; complete.lua: the results it commits) goes further: the calls of
one turn on the same session with the same shared arguments become ONE script call
(:meth:`ScriptBatch.run_item`), answered per item; a refusal of one item (``{'error', 'CODE
detail'}`` in its place) fails only its caller.

A script may bring reads to run right after it in the same pipeline
(:meth:`ScriptBatch.run_and_read`: a lease and the state it loads), in the same round trip,
on one server only, even alone. The reads see the script's writes and any made by others
since, as any later read would.

It batches only where a pipeline of scripts is plain: one Redis server and no replica
acknowledgement (a transition that waits for a replica goes through its own ``WAIT``, and
redis-py's cluster pipeline refuses scripts); otherwise, and for a lone script, it calls
:meth:`ScriptRunner.run` directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from baton.store.keys import SessionKeys
from baton.store.redis_client import REDIS_ERRORS, is_cluster, run_batch
from baton.store.scripts import Function, ScriptRunner, SessionScript, declared, missing

__all__ = ["ScriptBatch"]


@dataclass
class _Call:
    script: SessionScript
    sk: SessionKeys
    args: list[Any]
    run_id: str
    #: For an item of a list-taking script (run_item): its shared arguments, ``args`` being
    #: the item's own; None for a plain call.
    shared: tuple[Any, ...] | None = None
    #: Commands to run right after the script (run_and_read); None for none.
    reads: list[tuple[Any, ...]] | None = None
    reply: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _Unit:
    """One script call of a batch: a plain call, or the merged items of several."""

    calls: list[_Call]

    @property
    def args(self) -> list[Any]:
        first = self.calls[0]
        if first.shared is None:
            return first.args
        return [*first.shared, *(a for c in self.calls for a in c.args)]


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
        return await self._queued(_Call(script, sk, args, run_id))

    @property
    def reads_natively(self) -> bool:
        """Whether :meth:`run_and_read` may be used: one server."""
        return self.enabled

    async def run_and_read(self, script: SessionScript, sk: SessionKeys, args: list[Any],
                           reads: list[tuple[Any, ...]]) -> tuple[Any, list[Any]]:
        """The script's reply and the replies of ``reads`` (an error as its exception, in its
        place), sent right after it on the same connection, in this loop turn's round trip;
        only where :attr:`reads_natively` holds and the script is not replicated. A refusal
        by the script raises as :meth:`ScriptRunner.run` maps it."""
        reply, replies = await self._queued(_Call(script, sk, args, "", reads=reads))
        return reply, replies

    async def run_item(self, script: SessionScript, sk: SessionKeys, shared: list[Any],
                       item: list[Any], run_id: str = "") -> Any:
        """The reply to ``item`` of a script taking ``shared`` arguments then a list of items
        and answering a list, one reply per item: merged into one call with the items of the
        same script, session and shared arguments queued in this loop turn. An item refused
        (``['error', 'CODE detail']``) raises as :meth:`ScriptRunner.run` maps that error."""
        if not self.enabled or self.runner.replicated(script):
            replies = await self.runner.run(script, sk, [*shared, *item], run_id)
            return self._item(replies[0], sk, run_id)
        return self._item(await self._queued(_Call(script, sk, item, run_id, tuple(shared))),
                          sk, run_id)

    def _queued(self, call: _Call) -> asyncio.Future[Any]:
        """Queue ``call`` for this loop turn's batch; its reply to await."""
        self._queue.append(call)
        if len(self._queue) == 1:  # the first of this turn: send them all once it ends
            asyncio.get_running_loop().call_soon(self._flush)
        return call.reply

    def _item(self, reply: Any, sk: SessionKeys, run_id: str) -> Any:
        if isinstance(reply, list) and reply and reply[0] == "error":
            raise self.runner._error(ResponseError(str(reply[1])), sk, run_id)
        return reply

    def _flush(self) -> None:
        calls, self._queue = self._queue, []
        task = asyncio.get_running_loop().create_task(self._send(calls))
        self._tasks.add(task)  # held until done: a pending task must not be collected
        task.add_done_callback(self._tasks.discard)

    async def _send(self, calls: list[_Call]) -> None:
        units = _units(calls)
        if len(units) == 1 and units[0].calls[0].reads is None:
            await self._direct(units[0])
            return
        self.batches += 1
        scripts = self.runner.registered
        commands: list[tuple[Any, ...]] = []
        replies_at: list[int] = []  # the index of each unit's reply among the batch's
        for u in units:
            c = u.calls[0]
            replies_at.append(len(commands))
            commands.append(_command(getattr(scripts, c.script), c, u.args))
            commands.extend(c.reads or ())
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
        for u, at in zip(units, replies_at, strict=True):
            result = results[at]
            reads = u.calls[0].reads
            if reads is not None:
                await self._read(u.calls[0], [result, *results[at + 1:at + 1 + len(reads)]])
            elif missing(result):
                # The server has no library (never loaded, a node restarted empty) and ran
                # nothing: a direct call loads it.
                await self._direct(u)
            elif isinstance(result, Exception):
                for c in u.calls:
                    _answer(c, exc=self.runner._error(result, c.sk, c.run_id))
            else:
                _settle(u, result)

    async def _read(self, c: _Call, results: list[Any], *, again: bool = True) -> None:
        """Answer a script with reads from their replies (the script's first). When the server
        has no library the script wrote nothing (the reads only read), so it is loaded and
        the call sent once more."""
        reply = results[0]
        if again and missing(reply):
            registered = self.runner.registered
            script = getattr(registered, c.script)
            try:
                await script.load()
                results = await run_batch(registered.redis,
                                          [_command(script, c, c.args), *(c.reads or ())])
            except Exception as exc:
                _answer(c, exc=self.runner._error(exc, c.sk, c.run_id)
                        if isinstance(exc, REDIS_ERRORS) else exc)
                return
            await self._read(c, results, again=False)
        elif isinstance(reply, Exception):  # the script refused: its reads are moot
            _answer(c, exc=self.runner._error(reply, c.sk, c.run_id))
        else:
            _answer(c, result=(reply, list(results[1:])))

    async def _direct(self, u: _Unit) -> None:
        c = u.calls[0]
        try:
            result = await self.runner.run(c.script, c.sk, u.args, c.run_id)
        except Exception as exc:
            for c in u.calls:
                _answer(c, exc=exc)
        except BaseException:
            for c in u.calls:
                c.reply.cancel()
            raise
        else:
            _settle(u, result)


def _command(script: Function, c: _Call, args: list[Any]) -> tuple[Any, ...]:
    """The command running ``c``'s script with ``args``: its declared keys, no commit id."""
    return script.command(declared(c.script, c.sk), ["", *args])


def _units(calls: list[_Call]) -> list[_Unit]:
    """The script calls of a batch, in order: items of the same script, session and shared
    arguments merged into the unit of the first of them."""
    units: list[_Unit] = []
    merged: dict[tuple[Any, ...], _Unit] = {}
    for c in calls:
        if c.shared is None:
            units.append(_Unit([c]))
            continue
        key = (c.script, c.sk.session_id, c.shared)
        unit = merged.get(key)
        if unit is None:
            unit = merged[key] = _Unit([])
            units.append(unit)
        unit.calls.append(c)
    return units


def _settle(u: _Unit, result: Any) -> None:
    """Answer a unit's callers: a plain call its reply, each item its own."""
    if u.calls[0].shared is None:
        _answer(u.calls[0], result=result)
        return
    for c, reply in zip(u.calls, result, strict=True):
        _answer(c, result=reply)


def _answer(c: _Call, *, result: Any = None, exc: BaseException | None = None) -> None:
    if c.reply.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        c.reply.set_exception(exc)
    else:
        c.reply.set_result(result)
