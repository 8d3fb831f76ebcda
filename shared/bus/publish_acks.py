"""The acks of :meth:`~baton.bus.bus.Bus.publish_many`, on one reply inbox per connection.

Owns :class:`PublishAcks`: one wildcard reply subscription of the connection, each publish's
reply subject its own token under it, and every ack checked one by one as JetStream's
``publish_async`` does, without its per-message semaphore, random token, future and ack
object: a batch has one future (:class:`_Acks`), done when its last ack is in or at its
first refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import Header

from baton.bus.messages import Outgoing
from baton.bus.nats_auth import _Guard

_NO_RESPONDERS = "503"  # the status of a reply no subscriber sent (no stream took it)


class _Acks:
    """The acks of one publish_many batch: per message True (stored new), False (a
    duplicate) or None (not in yet); ``done`` once all are in."""

    __slots__ = ("done", "flags", "left")

    def __init__(self, n: int, done: asyncio.Future[None]) -> None:
        self.flags: list[bool | None] = [None] * n
        self.left = n
        self.done = done

    def settle(self, index: int, new: bool) -> None:
        if self.flags[index] is None:  # a repeated answer counts once
            self.flags[index] = new
            self.left -= 1
            if not self.left:
                self.done.set_result(None)


class PublishAcks:
    """publish_many's side of one connection: its reply inbox and the batches waiting on it.

    ``guard`` is the connection's; a refusal of any subject under ``scope`` (the namespace)
    fails the batch waiting at once. ``timeout`` bounds a batch (the acks have no deadline
    of their own).
    """

    def __init__(self, nc: Client, guard: _Guard, scope: str, timeout: float) -> None:
        self._nc = nc
        self._guard = guard
        self._scope = scope
        self._timeout = timeout
        self._inbox = ""
        self._subscribing: asyncio.Lock | None = None
        self._acks: dict[str, tuple[_Acks, int]] = {}
        self._seq = 0

    async def publish(self, batch: Sequence[Outgoing], headers: Sequence[dict[str, str]],
                      ) -> list[bool]:
        """Publish ``batch`` (with its checked ``headers``); per item, True if stored new,
        False if a duplicate. nats-py writes the publishes of one loop turn together."""
        acks = _Acks(len(batch), asyncio.get_running_loop().create_future())
        tokens: list[str] = []
        try:
            async with asyncio.timeout(self._timeout):
                inbox = self._inbox or await self._subscribe()
                publish = self._nc.publish
                for i, (item, hdrs) in enumerate(zip(batch, headers, strict=True)):
                    self._seq += 1
                    token = str(self._seq)
                    self._acks[token] = (acks, i)
                    tokens.append(token)
                    await publish(item.subject, item.data, reply=inbox + token, headers=hdrs)
                if not batch:
                    return []
                await self._guard("publish to", self._scope, acks.done)
        finally:
            for token in tokens:
                self._acks.pop(token, None)
            acks.done.cancel()  # no-op when done
        return [bool(flag) for flag in acks.flags]

    async def _subscribe(self) -> str:
        """The prefix of publish_many's reply subjects, subscribed on first use (nats-py
        subscribes again after a reconnect)."""
        if self._subscribing is None:
            self._subscribing = asyncio.Lock()
        async with self._subscribing:
            if not self._inbox:
                inbox = self._nc.new_inbox()
                await self._nc.subscribe(f"{inbox}.*", cb=self._on_ack)
                self._inbox = f"{inbox}."
        return self._inbox

    async def _on_ack(self, msg: Msg) -> None:
        """A stream's answer to one publish: stored new or a duplicate; an error (or no
        stream for the subject) fails that publish's batch, as in nats-py's publish_async."""
        entry = self._acks.pop(msg.subject[len(self._inbox):], None)
        if entry is None:
            return
        acks, index = entry
        if acks.done.done():
            return
        if msg.headers and msg.headers.get(Header.STATUS) == _NO_RESPONDERS:
            acks.done.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer = orjson.loads(msg.data)
        except orjson.JSONDecodeError as exc:
            acks.done.set_exception(nats.errors.Error(f"unreadable publish ack: {exc}"))
            return
        if not isinstance(answer, dict):
            acks.done.set_exception(nats.errors.Error("unreadable publish ack"))
        elif "error" in answer:
            acks.done.set_exception(nats.js.errors.APIError.from_error(answer["error"]))
        else:
            acks.settle(index, not answer.get("duplicate", False))
