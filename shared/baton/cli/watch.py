"""``baton watch``: a session's snapshot, then its changes as they are committed.

The changes are read from the session's receipts (one per commit, lease, claim, completion,
request or refused write), each role's stream merged by id (baton.store.keys), with a
blocking XREAD of the three streams from the last receipt id seen on a connection of its own
(named ``baton-watch:<session>``). The snapshot and the id it ends at
are read in one MULTI, so nothing falls between them.

Each receipt becomes one *change*, emitted as a unit: the receipt (who, which fence, what,
hops), the marks it wrote, the entries it appended (a receipt's entries are found by
counting: the entries of every receipt before it come first), the states of the tasks and
submissions it touched, and streamed text when a model streams. A change is read completely
before any of it is emitted and the position advances only after, so when Redis drops the
connection the watcher reconnects and re-reads from the same id: nothing lost, nothing twice.
``--from ID`` resumes explicitly after a receipt id another watch printed.

A session that is quarantined shows it (in the snapshot, or as a ``quarantined`` item when
it happens while watching; ``--until-settled`` then ends). An archived session (its keys
left Redis for the archive, :mod:`baton.store.archived`) is read from the archive: its
snapshot (or, resuming, its receipts after the id) marked archived, then an ``archived``
item, and the watch ends: nothing in it changes until a new submission restores it. The
store's epoch is read at the start and checked while idle: a Redis that restarted empty
stops the watch with :class:`~baton.errors.StoreEpochError` instead of an endless silent
wait.

Read-only: no lease, no write, no consumer group.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

import click
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from baton.cli.findings import Findings, lenient_meta
from baton.cli.trace import Timeline
from baton.cli.trace.model import archived_line
from baton.errors import RedisUnavailable, not_found
from baton.models import Entry, Submission, Task, ToolRun, decode, dumps, loads
from baton.receipts import PartialDetail, Receipt, receipt_order
from baton.settings import Settings
from baton.store.archived import ArchivedReads, SessionSource
from baton.store.epoch import StoreEpoch
from baton.store.keys import ReceiptRole, SessionKeys
from baton.store.redis_client import connect_redis, without_password
from baton.store.state import merge_receipts, parse_runs, requested_meta, with_intents
from baton.store.store import Store, now_ms

__all__ = ["FIRST_GIVE_UP_S", "Watch", "emitter", "render_change"]

Emit = Callable[[dict[str, Any]], None]
M = TypeVar("M", bound=BaseModel)
_BATCH = 100
_RETRY_S = (0.05, 0.2, 0.5, 1.0, 2.0)
_GIVE_UP_S = 60.0  # Redis unreachable this long in a row: give up with RedisUnavailable
# Before the first successful read there may be no stack at all: give up sooner.
FIRST_GIVE_UP_S = 5.0


_ROLES: tuple[ReceiptRole, ...] = ("brain", "hands", "client")  # receipt_streams' order


def _in_order(replies: list[Any]) -> list[Receipt]:
    """The receipts of one read of each role's stream (``_BATCH`` at most each), merged in
    order up to where a stream may have more: past the last receipt of a stream that filled
    its batch, another stream's receipts wait for the next read (which starts after the last
    one emitted), so none is emitted before one that precedes it."""
    merged = merge_receipts(zip(_ROLES, replies, strict=True))
    full = [receipt_order(r) for r in merged
            if any(len(reply) >= _BATCH and reply[-1][0] == r.stream_id for reply in replies)]
    return [r for r in merged if receipt_order(r) <= min(full)] if full else merged


class Watch:
    """Follow one session; ``await Watch(...).run()`` returns the last receipt id seen."""

    def __init__(
        self,
        settings: Settings,
        session_id: str,
        emit: Emit,
        *,
        after: str | None = None,
        until_settled: bool = False,
        block_ms: int = 5_000,
        first_give_up_s: float = FIRST_GIVE_UP_S,
        store: Store | None = None,
        source: SessionSource | None = None,
    ) -> None:
        self.settings = settings
        self.session_id = session_id
        self.emit = emit
        self.after = after
        self.until_settled = until_settled
        self.block_ms = block_ms
        self.last_id = after or "0-0"
        self.entry_count = 0  # entries appended by the receipts up to last_id
        self.reconnects = 0
        self.first_give_up_s = first_give_up_s
        self._reached = False  # Redis answered once: from then on, retry for _GIVE_UP_S
        self._draining = False  # settled: read what is left without waiting, then stop
        self._catching_up = False  # catch_up(): read what is there without waiting, then stop
        self._quarantine_shown = False
        self.epoch: StoreEpoch | None = None
        self.timeline = Timeline(session_id)
        # Typed loosely: redis-py's stubs cannot tell decoded replies from bytes. The one
        # connect path reads a cluster URL as well as a single server's. A caller that only
        # reads a snapshot may lend its own store (its connections are not closed here).
        self._owned = store is None
        self.redis: Any = connect_redis(settings, socket_timeout=block_ms / 1000 + 5,
                                        client_name=f"baton-watch:{session_id}") \
            if store is None else store.redis
        self.store = store or Store(self.redis, settings)
        self.sk: SessionKeys = self.store.keys.session(session_id)
        # Where a session missing from Redis is looked for (made when first needed, its
        # archive with it); ``source``: where the caller found the session already (an
        # archived one's).
        self._archived: ArchivedReads | None = None
        self.source = source or SessionSource(self.store)
        #: What the session's own keys are read with: Redis, or its archived object.
        self.session: Any = self.source.redis if source is not None else self.redis

    async def run(self) -> str:
        try:
            settled = await self._retrying(self._start)
            while not settled:
                settled = await self._retrying(self._step)
            if self.source.archived:
                self.emit(self.archived_item())
        finally:
            await self._close()
        return self.last_id

    async def catch_up(self) -> AsyncGenerator[str]:
        """Resume after ``after`` and emit what was committed since, one batch at a time,
        without waiting for more; yields the receipt id reached after each batch. With a
        lent ``store`` every read is a short one on its pooled connections (no blocking
        read): the API catches a stream up this way before it joins the session's feed."""
        self._catching_up = True
        try:
            done = await self._retrying(self._start)
            yield self.last_id
            while not done:
                done = await self._retrying(self._step)
                yield self.last_id
        finally:
            await self._close()

    async def snapshot(self) -> str:
        """Emit the snapshot (or, resuming, the resume marker) without following; the receipt
        id it ends at. Closes the connection."""
        try:
            await self._retrying(self._start)
        finally:
            await self._close()
        return self.last_id

    def archived_item(self) -> dict[str, Any]:
        """The item that ends the watch of an archived session."""
        return {"type": "archived", "session_id": self.session_id, "last_id": self.last_id,
                **self.source.marker()}

    async def _close(self) -> None:
        if self._archived is not None:
            await self._archived.close()
        if self._owned:
            await self.redis.aclose()

    async def _look_elsewhere(self) -> bool:
        """After the session's keys read as missing from Redis: look for it (archived, or
        in Redis after all); True when it was found there, to read again."""
        if self.source.archived:
            return False
        if self._archived is None:
            self._archived = ArchivedReads(self.store)
        source = await self._archived.locate(self.session_id)
        if source.found:
            self.source, self.session = source, source.redis
        return source.found

    async def _retrying(self, step: Callable[[], Any]) -> Any:
        """Run one read-then-emit step; on a dropped connection reconnect and run it again."""
        failed_at: float | None = None
        attempt = 0
        while True:
            try:
                done = await step()
                self._reached = True
                return done
            except (RedisConnectionError, RedisTimeoutError, RedisClusterException,
                    OSError) as exc:
                loop = asyncio.get_running_loop()
                failed_at = failed_at or loop.time()
                limit = _GIVE_UP_S if self._reached else self.first_give_up_s
                if loop.time() - failed_at > limit:
                    what = "lost" if self._reached else "cannot reach"
                    raise RedisUnavailable(
                        f"watch {what} Redis at {without_password(self.settings.redis_url)} "
                        f"(gave up after {limit:g} s of retries): {exc}",
                        url=without_password(self.settings.redis_url),
                    ) from None
                if self._reached:  # before, nothing was lost: waiting for the store
                    self.reconnects += 1
                    self.emit({"type": "reconnect", "after": self.last_id, "error": str(exc)})
                await asyncio.sleep(_RETRY_S[min(attempt, len(_RETRY_S) - 1)])
                attempt += 1

    # ------------------------------------------------------------------ start

    async def _start(self) -> bool:
        survey = await StoreEpoch.survey(self.redis, self.store.keys)
        if survey.state == "ok":  # checked again while idle: a lost store stops the watch
            self.epoch = StoreEpoch(self.redis, self.store.keys)
            self.epoch.id = survey.id
        if self.after is not None:
            # A resume: replay the receipts up to the id silently, to know the entry count
            # and give the timeline its context (hops), then follow from there.
            before = await self._before(self.after)
            # A session no Brain opened yet is known by its receipts or its waiting request.
            if before is None:
                raise not_found(f"session {self.session_id}", namespace=self.settings.namespace,
                                session_id=self.session_id)
            self._prime(before)
            self.emit({"type": "resume", "after": self.after, "entries": self.entry_count})
            return False  # even if settled: the receipts after the id are still to show
        replies = await self._snapshot_reads()
        if not replies[0] and not any(replies[8:11]) and await self._look_elsewhere():
            replies = await self._snapshot_reads()
        meta_reply, inbox = replies[0], replies.pop()
        if not meta_reply and isinstance(inbox, dict):  # not opened yet: as requested
            replies[0] = requested_meta(inbox)
        # A session too corrupt to run is still shown: what cannot be read or decoded is
        # a finding in the snapshot (and its quarantine, when it is quarantined).
        f = Findings()
        names = ("meta", "tasks", "done", "submissions", "runs", "runs_done", "entries",
                 "entries", "receipts", "receipts_hands", "receipts_client", "poison",
                 "intents")
        defaults: tuple[Any, ...] = ({}, {}, {}, {}, {}, {}, 0, [], [], [], [], {}, {})
        (meta, tasks, done, subs, runs, runs_done, count, entries, *streams, poison,
         intents) = (f.reply(f"{name} key", reply, default)
                     for name, reply, default in zip(names, replies, defaults, strict=True))
        receipts = merge_receipts(zip(_ROLES, streams, strict=True))
        runs = with_intents(runs, intents)
        if not meta and not receipts:
            raise not_found(f"session {self.session_id}", namespace=self.settings.namespace,
                            session_id=self.session_id)
        self._prime(receipts)
        self.entry_count = int(count)  # the same MULTI: exactly the entries of those receipts
        m = lenient_meta(self.session_id, meta, f, "meta key", runs)
        now = now_ms()
        all_runs: dict[str, ToolRun] = {**f.parse("runs_done key", {}, parse_runs, runs_done),
                                        **f.parse("runs key", {}, parse_runs, runs)}
        first = int(count) - len(entries)
        archived = self.source.archived  # its archival ended the lease it held
        snapshot = {
            "type": "snapshot", "session_id": self.session_id, **self.source.marker(),
            "last_id": self.last_id, "receipts": len(receipts), "seq": m.seq,
            "lease": {"holder": m.holder or None, "fence": m.fence,
                      "live": bool(m.holder) and m.lease_until_ms > now and not archived},
            "submissions": [_sub(x) for x in _each(f, "submission", subs, Submission)],
            "tasks": [_task(x) for x in _each(f, "task", {**tasks, **done}, Task)],
            "runs": [{"run_id": r.run_id, "tool": r.intent.tool, "attempt": r.attempt,
                      "worker": r.worker,
                      "marks": [k for k, v in (("accepted", r.accepted_ms),
                                               ("completed", r.completed_ms),
                                               ("applied", r.applied_ms)) if v]}
                     for r in sorted(all_runs.values(), key=lambda r: r.run_id)],
            "entries": int(count),
            "last_entries": [_entry(first + i, x) for i, x in enumerate(_each(
                f, "entry", {str(first + i): e for i, e in enumerate(entries)}, Entry))],
            "quarantine": _quarantined(poison),
            "findings": list(f),
        }
        self.emit(snapshot)
        if archived:
            return True  # nothing changes until a restore
        if snapshot["quarantine"]:
            self._quarantine_shown = True
            return self.until_settled  # it will never settle
        return self.until_settled and _all_settled(list(subs.values()))

    async def _before(self, after: str) -> list[Receipt] | None:
        """The receipts up to ``after`` (resuming), None when the session is nowhere."""
        for _ in range(2):
            async with self.session.pipeline(transaction=True) as p:
                for _, key in self.sk.receipt_streams():
                    p.xrange(key, "-", after)
                before = merge_receipts(zip(_ROLES, await p.execute(), strict=True))
            if before or await self.session.exists(self.sk.meta, self.sk.inbox):
                return before
            if not await self._look_elsewhere():
                return None
        return None

    async def _snapshot_reads(self) -> list[Any]:
        """The snapshot's reads of the session's keys, in one MULTI."""
        sk = self.sk
        async with self.session.pipeline(transaction=True) as p:
            p.hgetall(sk.meta).hgetall(sk.tasks).hgetall(sk.done).hgetall(sk.subs)
            p.hgetall(sk.runs).hgetall(sk.runs_done).llen(sk.entries).lrange(sk.entries, -20, -1)
            for _, key in sk.receipt_streams():
                p.xrange(key, "-", "+")
            p.hgetall(sk.poison).hgetall(sk.intents)
            p.hgetall(sk.inbox)
            replies: list[Any] = await p.execute(raise_on_error=False)
        return replies

    def _prime(self, receipts: list[Receipt]) -> None:
        for r in receipts:
            self.timeline.add(r)
            self.entry_count += int(r.changes.get("entries", 0))
            self.last_id = r.stream_id

    # ------------------------------------------------------------------ follow

    async def _step(self) -> bool:
        """Wait for the next receipts; emit one change per receipt.

        True when ``until_settled`` is set and, after every submission was seen settled, a
        read without waiting found no more receipts (what was committed before the
        settlement was read is then all shown).
        """
        keys = [key for _, key in self.sk.receipt_streams()]
        if self.source.archived:  # what the archive holds after the id, then the end
            async with self.session.pipeline(transaction=False) as p:
                for key in keys:
                    p.xrange(key, f"({self.last_id}", "+", count=_BATCH)
                items = _in_order(await p.execute())
            if not items:
                return True
        else:
            waits = not (self._draining or self._catching_up)
            reply = await self.redis.xread(dict.fromkeys(keys, self.last_id), count=_BATCH,
                                           block=self.block_ms if waits else None)
            got = dict(reply or {})
            items = _in_order([got.get(key, []) for key in keys])
        if not items:
            if self._draining or self._catching_up:
                return True
            if self.epoch is not None:  # Redis restarted empty: StoreEpochError, not silence
                await self.epoch.verify()
            if await self._quarantine_now():  # no receipt records it: looked for when idle
                return self.until_settled
            if await self._archived_now():  # the next step reads the rest from the archive
                return False
            self._draining = self.until_settled and await self._settled()
            return False
        changes = await self._read_changes(items)
        for r, (change, settled) in zip(items, changes, strict=True):
            for event in change:  # emitted only once everything was read
                self.emit(event)
            self.last_id = r.stream_id
            self.entry_count += int(change[0]["changes"].get("entries", 0))
            self._draining = settled
        return False

    async def _read_changes(self, receipts: list[Receipt],
                            ) -> list[tuple[list[dict[str, Any]], bool]]:
        """The changes of ``receipts`` (in order), read in one MULTI: one round trip per
        batch, not per receipt, so a watch that fell behind catches up at once."""
        plans: list[tuple[Receipt, int, int, list[str]]] = []  # receipt, first entry, n, tasks
        first = self.entry_count
        async with self.session.pipeline(transaction=True) as p:
            for r in receipts:
                d = r.detail
                n = int(r.changes.get("entries", 0))
                task_ids = [d.task_ref] if r.changes.get("tasks") and d.task_ref else []
                if n:
                    p.lrange(self.sk.entries, first, first + n - 1)
                for tid in task_ids:
                    p.hget(self.sk.tasks, tid).hget(self.sk.done, tid)
                plans.append((r, first, n, task_ids))
                first += n
            p.hvals(self.sk.subs)
            replies = await p.execute()
        subs = replies.pop()
        settled = self.until_settled and _all_settled(subs)
        out: list[tuple[list[dict[str, Any]], bool]] = []
        at = 0
        for r, first, n, task_ids in plans:
            entries = replies[at] if n else []
            at += 1 if n else 0
            tasks = replies[at:at + 2 * len(task_ids)]
            at += 2 * len(task_ids)
            out.append((self._change(r, first, entries, tasks, subs), settled))
        return out

    def _change(self, r: Receipt, first: int, entries: list[str], tasks: list[Any],
                subs: list[str]) -> list[dict[str, Any]]:
        """The items of one change, its reads done. Placed on the timeline only here, after
        every read of its batch succeeded: a retried change is never placed twice."""
        d = r.detail
        ev = self.timeline.add(r)
        lane = self.timeline.lanes[ev.lane]
        out: list[dict[str, Any]] = [{
            "type": "receipt", "id": ev.stream_id, "t_ms": ev.t_ms, "ts_ms": r.ts_ms,
            "kind": ev.kind, "worker": lane.label, "role": lane.role, "fence": ev.fence,
            "text": ev.text, "flags": ev.flags, "hops": ev.hops, "changes": r.changes,
        }]
        # A Hands receipt's fence is the attempt it marks; a Brain's (the applied mark) is
        # the session's fence, not an attempt: there the mark's own attempt or none.
        out += [{"type": "mark", "id": ev.stream_id, "run_id": m.run_id, "mark": m.mark,
                 "attempt": m.attempt or (None if m.mark == "applied" else r.fence)}
                for m in r.marks]
        if isinstance(d, PartialDetail) and d.delta:  # streamed text of a partial commit
            out.append({"type": "stream", "id": ev.stream_id, "task_id": d.task_id,
                        "text": d.delta})
        out += [{"type": "entry", "id": ev.stream_id, **_entry(first + i, decode(Entry, e))}
                for i, e in enumerate(entries)]
        for i in range(0, len(tasks), 2):
            raw = tasks[i] or tasks[i + 1]
            if raw:
                out.append({"type": "task", "id": ev.stream_id, **_task(decode(Task, raw))})
        if r.changes.get("submissions"):
            out += [{"type": "submission", "id": ev.stream_id, **_sub(decode(Submission, s))}
                    for s in subs]
        return out

    async def _settled(self) -> bool:
        return _all_settled(await self.session.hvals(self.sk.subs))

    async def _archived_now(self) -> bool:
        """Whether the session was archived while watched (its tombstone looked for when
        idle, as its quarantine is): from then on it is read from the archive."""
        if not await self.redis.exists(self.sk.archived):
            return False
        return await self._look_elsewhere() and self.source.archived

    async def _quarantine_now(self) -> bool:
        """Emit the session's quarantine once, when it has been quarantined since."""
        if self._quarantine_shown:
            return False
        q = _quarantined(await self.session.hgetall(self.sk.poison))
        if q is None:
            return False
        self._quarantine_shown = True
        self.emit({"type": "quarantined", "session_id": self.session_id, **q})
        return True


def _quarantined(record: dict[str, str]) -> dict[str, Any] | None:
    """The quarantine in a poison record (tries, reason, when), None when not quarantined."""
    if not record or "quarantined" not in record:
        return None
    return {"tries": record.get("tries"), "reason": record.get("quarantine_reason", ""),
            "quarantined_ms": record.get("quarantined")}


def _each(f: Findings, what: str, raw: dict[str, str], model: type[M]) -> list[M]:
    """Each record decoded; one that does not parse is a finding."""
    out = []
    for k, v in raw.items():
        item = f.parse(f"{what} {k} does not parse", None, decode, model, v)
        if item is not None:
            out.append(item)
    return out


def _all_settled(subs: list[str]) -> bool:
    def settled(raw: str) -> bool:
        try:
            return loads(raw)["status"] in ("completed", "failed", "cancelled")
        except Exception:  # undecodable: shown as a finding
            return False
    return bool(subs) and all(settled(s) for s in subs)


def _sub(s: Submission) -> dict[str, Any]:
    return {"submission_id": s.id, "status": s.status, "answer": s.answer, "error": s.error}


def _task(t: Task) -> dict[str, Any]:
    st = t.state
    return {"task_id": t.id, "kind": t.kind, "state": st.name, "phase": t.checkpoint.phase,
            "outcome": getattr(st, "outcome", None),
            "waits": list(st.on) if st.name == "waiting" else []}


def _entry(index: int, e: Entry) -> dict[str, Any]:
    return {"index": index, "kind": e.kind, "text": e.text,
            "tool_calls": [c.name for c in e.tool_calls], "run_id": e.run_id,
            "is_error": e.is_error}


# ---------------------------------------------------------------------- text output


def render_change(ev: dict[str, Any]) -> str:
    """One emitted item as a line of text."""
    kind = ev["type"]
    if kind == "snapshot":
        lease = ev["lease"]
        lines = [f"== snapshot of {ev['session_id']} at receipt {ev['last_id']} "
                 f"({ev['receipts']} receipts, {ev['entries']} entries); lease "
                 f"{lease['holder'] or '-'} fence {lease['fence']}"
                 f"{' (live)' if lease['live'] else ''}"]
        lines += [f"   submission {s['submission_id']}: {s['status']}" for s in ev["submissions"]]
        lines += [f"   task {t['task_id']} ({t['kind']}): {t['state']} phase {t['phase']}"
                  + (f", waits on {len(t['waits'])}" if t["waits"] else "")
                  for t in ev["tasks"]]
        lines += [f"   run {r['run_id']} {r['tool']}: attempt {r['attempt']} "
                  f"{r['worker'] or '-'} marks {'/'.join(r['marks']) or '-'}"
                  for r in ev["runs"]]
        lines += [f"   entry {e['index']} {e['kind']}: {_clip(e['text'])}"
                  for e in ev["last_entries"]]
        lines += [f"   ! {line}" for line in ev.get("findings", ())]
        if ev.get("quarantine"):
            lines.append(_quarantine_text(ev["quarantine"]))
        if ev.get("archived"):  # the archived item ends the watch
            return "\n".join(lines)
        return "\n".join([*lines, "== live changes:"])
    if kind == "quarantined":
        return _quarantine_text(ev)
    if kind == "archived":
        return f"== {archived_line(ev['archived_ms'])}"
    if kind == "receipt":
        return (f"[{ev['id']}] +{ev['t_ms'] / 1000:.3f}s {ev['worker']} {ev['fence']} "
                f"{ev['kind']}: {ev['text']}")
    if kind == "mark":
        attempt = f" (attempt {ev['attempt']})" if ev.get("attempt") else ""
        return f"   mark {ev['mark']} {ev['run_id']}{attempt}"
    if kind == "entry":
        calls = f" -> {', '.join(ev['tool_calls'])}" if ev["tool_calls"] else ""
        return f"   entry {ev['index']} {ev['kind']}: {_clip(ev['text'])}{calls}"
    if kind == "task":
        return f"   task {ev['task_id']}: {ev['state']} phase {ev['phase']}" + (
            f" ({ev['outcome']})" if ev["outcome"] else "")
    if kind == "submission":
        return f"   submission {ev['submission_id']}: {ev['status']}" + (
            f": {_clip(ev['answer'] or ev['error'] or '')}" if ev["status"] != "running" else "")
    if kind == "stream":
        return f"   ... {ev['text']}"
    if kind == "reconnect":
        return f"-- connection lost ({ev['error']}); resuming after {ev['after']}"
    if kind == "resume":
        return f"== resuming after receipt {ev['after']}"
    return dumps(ev)


def _quarantine_text(q: dict[str, Any]) -> str:
    return (f"!! QUARANTINED after {q.get('tries') or '?'} tries: {q.get('reason', '')} (its "
            "state could not be processed; no Brain runs it)")


def _clip(text: str, n: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def emitter(as_json: bool) -> Emit:
    """Print each item at once (a watcher is read live); reconnect notes go to stderr."""
    def emit(ev: dict[str, Any]) -> None:
        line = dumps(ev) if as_json else render_change(ev)
        stream = sys.stderr if ev["type"] == "reconnect" and not as_json else sys.stdout
        click.echo(line, file=stream)
        stream.flush()
    return emit
