"""``baton inspect``: what the committed state says right now, for operators.

With a session: its lease (holder, fence, time left), submissions, tasks with their states,
waits and why they are not moving (blocked: no definition here, or no live Brain serves the
session's compat level), cancel intents, tool runs with their three marks, attempts and
heartbeats, runs awaiting approval with their arguments and digest, timers, dead letters
about it, and the outbox backlog. Both views start with the store's epoch (its id and when
it was created), and say in one red line when it is missing or changed: Redis lost state.
Without one: the cluster view, i.e. services that
announced themselves (Brains with the compat levels they serve), sessions by state
(``blocked`` when no live Brain serves their level or a task is blocked), backlog and oldest
row per shard, messages waiting in JetStream per subject (flagged when no consumer exists
or no live worker serves the subject: see :mod:`baton.bus.backlog`), dead letters.
Both show quarantined sessions (state ``quarantined``, with the reason and the tries: see
:mod:`baton.store.quarantine`). An archived session is read from the archive and shown as it
was, marked archived (``archived``, ``archived_ms``; its lease ended with the archival): see
:mod:`baton.store.archived`. Nothing stored makes it fail: a key of the wrong type, a
missing hash or a record that does not parse is a *finding* (:mod:`baton.cli.findings`),
listed in red at the end (``findings`` in JSON), and the rest of the view is shown.
Read-only: it never takes a lease, writes, fetches or acks. ``--json`` gives the same data;
the text is drawn by :mod:`baton.cli.inspect_render`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from baton.bus.backlog import subject_backlog
from baton.bus.bus import Bus
from baton.cli.findings import Findings, lenient_meta
from baton.cli.inspect_render import render_cluster, render_session
from baton.errors import not_found
from baton.models import Entry, Submission, Task, ToolRun, decode, loads
from baton.observability.log import bounded
from baton.receipts import id_order
from baton.store.archived import SessionSource
from baton.store.epoch import StoreEpoch
from baton.store.state import parse_requests, parse_runs, requested_meta, with_intents
from baton.store.store import Store, now_ms
from baton.store.workers import SERVICE_STALE_MS
from baton.store.workers import served_levels as _served

__all__ = [
    "cluster_view", "newest_sessions", "render_cluster", "render_session", "session_rows",
    "session_view",
]

M = TypeVar("M", bound=BaseModel)
CLUSTER_SESSIONS = 1_000  # newest sessions classified in the cluster view


def _age(ms: int | None, now: int) -> int | None:
    return None if ms is None else now - ms


def _blocked(task: Task, runs: dict[str, ToolRun], fence: int, leased: bool) -> str:
    """Why a live task is not moving, in words (empty when it is)."""
    s = task.state
    if s.name == "waiting":
        by: dict[str, int] = {}
        for rid in s.on:
            run = runs.get(rid)
            status = run.status if run else "applied"
            by[status] = by.get(status, 0) + 1
        parts = ", ".join(f"{n} {st}" for st, n in sorted(by.items()))
        return f"waiting ({s.policy}) on {len(s.on)} tool run(s): {parts}"
    if s.name == "sleeping":
        return f"sleeping for {max(s.until_ms - now_ms(), 0)} ms more"
    if s.name == "running" and s.fence != fence:
        return (f"a worker died in phase {task.checkpoint.phase} (fence {s.fence}, now "
                f"{fence}): re-entered on the next lease")
    if s.name in ("pending", "running") and not leased:
        return "runnable: waiting for a Brain to take the lease"
    if s.name == "completing":
        return "own result decided; owned children still draining"
    return ""


async def _services(store: Store, now: int, f: Findings) -> list[dict[str, Any]]:
    """Every service announcement; one that does not parse, or a workers key of the wrong
    type, is a finding."""
    redis: Any = store.redis
    keys = store.keys.every("workers")
    async with redis.pipeline(transaction=False) as p:
        for key in keys:
            p.hgetall(key)
        replies = await p.execute(raise_on_error=False)
    found = []
    for key, reply in zip(keys, replies, strict=True):
        for name, raw in f.reply(f"workers {key}", reply, {}).items():
            info = f.parse(f"service {name} in {key}", None, _service, raw)
            if info is not None:
                age = now - int(info.get("seen_ms", 0))
                found.append({**info, "seen_age_ms": age, "alive": age < SERVICE_STALE_MS})
    return found


def _oldest_ms(first: list[Any]) -> int | None:
    return int(first[0][0].split("-")[0]) if first else None


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value else None


def _status(raw: str) -> str:
    return str(loads(raw)["status"])


def _service(raw: str) -> dict[str, Any]:
    info = loads(raw)
    if not isinstance(info, dict):
        raise ValueError(f"not an object: {raw[:60]!r}")
    int(info.get("seen_ms", 0))
    for _, c in info.get("serves", ()):
        int(c)
    return info


def _level_reason(agent: str, compat: int, served: set[tuple[str, int]]) -> str:
    if (agent, compat) in served:
        return ""
    levels = sorted(c for a, c in served if a == agent)
    return (f"no live Brain serves {agent} compat {compat} (live Brains serve "
            f"{', '.join(map(str, levels)) or 'no level of it'}): its wakes wait in the stream")


def _run_row(run: ToolRun, now: int) -> dict[str, Any]:
    result = run.result
    return {
        "run_id": run.run_id, "task_id": run.intent.task_id, "tool": run.intent.tool,
        "replay": run.intent.replay, "operation_id": run.intent.operation_id,
        "status": "applied" if run.applied_ms else run.status, "attempt": run.attempt,
        "worker": run.worker, "attempts": list(run.attempts),
        "marks": {"accepted": run.accepted_ms, "completed": run.completed_ms,
                  "applied": run.applied_ms},
        "heartbeat_age_ms": _age(run.heartbeat_ms, now) if not run.completed_ms else None,
        "outcome": result.outcome if result else None,
        "recovery": result.recovery if result else None,
        "duration_ms": result.duration_ms if result else None,
        "digest": run.intent.approval_digest, "approved_ms": run.approved_ms,
        "cancel_ms": run.cancel_ms,
    }


async def _backlog(store: Store, now: int, f: Findings) -> list[dict[str, Any]]:
    """Rows waiting per shard: the Brains' outbox and the Hands' wakes stream together."""
    redis: Any = store.redis
    shards = range(store.keys.shards)
    streams = [(store.keys.outbox(s), store.keys.wakes(s)) for s in shards]
    async with redis.pipeline(transaction=False) as p:
        for pair in streams:
            for key in pair:
                p.xlen(key).xrange(key, "-", "+", count=1)
        replies = await p.execute(raise_on_error=False)
    out = []
    for shard, pair in zip(shards, streams, strict=True):
        rows: int | None = 0
        oldest: int | None = None
        for j, key in enumerate(pair):
            at = 4 * shard + 2 * j
            n = f.reply(f"outbox {key}", replies[at], None)
            first = f.reply(f"outbox {key}", replies[at + 1], [])
            ms = f.parse(f"outbox {key}", None, _oldest_ms, first)
            rows = None if n is None or rows is None else rows + int(n)
            if ms is not None:
                oldest = ms if oldest is None else min(oldest, ms)
        out.append({"shard": shard, "rows": rows, "oldest_age_ms": _age(oldest, now)})
    return out


async def _dead_letters(store: Store, f: Findings, count: int) -> tuple[list[dict[str, str]],
                                                                         int | None]:
    """The newest ``count`` dead letters over every shard, and how many there are (None
    when some could not be read: a finding says why)."""
    redis: Any = store.redis
    keys = store.keys.every("dead")
    async with redis.pipeline(transaction=False) as p:
        for key in keys:
            p.xrevrange(key, count=count).xlen(key)
        replies = await p.execute(raise_on_error=False)
    out: list[dict[str, str]] = []
    total: int | None = 0
    for i, key in enumerate(keys):
        for record_id, record in f.reply(f"dead letters {key}", replies[2 * i], []):
            out.append({"id": str(record_id), **{str(k): str(v) for k, v in record.items()}})
        n = f.reply(f"dead letters {key}", replies[2 * i + 1], None)
        total = None if n is None or total is None else total + int(n)
    out.sort(key=lambda d: tuple(int(x) for x in d["id"].split("-")), reverse=True)
    return out[:count], total


async def _epoch(store: Store, f: Findings, shard: int | None = None) -> dict[str, Any]:
    """The store epoch as every shard carries it (and, for a session, its own shard's)."""
    e = await f.read("store epoch", StoreEpoch.survey(store.redis, store.keys), None)
    if e is None:
        return {"state": "unreadable", "id": None, "created_ms": None, "shards": 0,
                "missing_shards": [], "differing_shards": []}
    out: dict[str, Any] = {"state": e.state, "id": e.id or None,
                           "created_ms": e.created_ms or None, "shards": e.shards,
                           "missing_shards": list(e.missing),
                           "differing_shards": list(e.differing)}
    if shard is not None:
        mine = e.of_shard(shard)
        out["session_shard"] = {"shard": shard, "id": mine or None,
                                "state": "missing" if not mine else
                                "ok" if mine == e.id else "changed"}
    return out


def _quarantine(record: dict[str, str], f: Findings, key: str) -> dict[str, Any] | None:
    """The poison record (failures to process the session, its quarantine) as plain data."""
    if not record:
        return None
    def num(field: str) -> int | None:
        return f.parse(f"poison {key}", None, _int_or_none, record.get(field))
    return {"quarantined": "quarantined" in record, "tries": num("tries") or 0,
            "quarantined_ms": num("quarantined"),
            "reason": record.get("quarantine_reason") or record.get("reason") or "",
            "last_failure_ms": num("last")}


def _decode_each(f: Findings, what: str, raw: dict[str, str], model: type[M]) -> dict[str, M]:
    out = {}
    for k, v in raw.items():
        item = f.parse(f"{what} {k} does not parse", None, decode, model, v)
        if item is not None:
            out[k] = item
    return out


def _runs_each(f: Findings, key: str, fields: dict[str, str]) -> dict[str, ToolRun]:
    grouped: dict[str, dict[str, str]] = {}
    for name, value in fields.items():
        grouped.setdefault(name.rpartition(".")[0], {})[name] = value
    runs: dict[str, ToolRun] = {}
    for rid, group in grouped.items():
        runs.update(f.parse(f"run {rid} in {key} does not parse", {}, parse_runs, group))
    return runs


async def session_view(store: Store, session_id: str, *,
                       source: SessionSource | None = None) -> dict[str, Any]:
    """Everything ``inspect SESSION`` shows, as plain data. A part that cannot be read (a key
    of the wrong type) or decoded is a line in ``findings``; the rest is shown.

    ``source``: where the session's own keys are read (an archived session's, see
    :meth:`~baton.store.archived.ArchivedReads.read`); the shard's keys (timers, dead
    letters, services, backlog, epoch) are read from ``store``."""
    f = Findings()
    now = now_ms()
    sk = store.keys.session(session_id)
    source = source or SessionSource(store)
    redis: Any = source.redis
    reads: tuple[tuple[str, str, str, Any], ...] = (
             ("meta", sk.meta, "hgetall", {}), ("tasks", sk.tasks, "hgetall", {}),
             ("done", sk.done, "hgetall", {}), ("subs", sk.subs, "hgetall", {}),
             ("runs", sk.runs, "hgetall", {}), ("runs_done", sk.runs_done, "hgetall", {}),
             ("entry_count", sk.entries, "llen", 0), ("receipts", sk.receipts, "xlen", 0),
             ("receipts_hands", sk.receipts_hands, "xlen", 0),
             ("receipts_client", sk.receipts_client, "xlen", 0),
             ("poison", sk.poison, "hgetall", {}), ("intents", sk.intents, "hgetall", {}),
             ("inbox", sk.inbox, "hgetall", {}))
    async with redis.pipeline(transaction=False) as p:
        for _, key, cmd, _ in reads:
            getattr(p, cmd)(key)
        p.lrange(sk.entries, -20, -1)
        for _, key in sk.receipt_streams():
            p.xrevrange(key, count=1)
        p.exists(*[key for _, key, _, _ in reads])
        replies = await p.execute(raise_on_error=False)
    raw = {name: f.reply(f"{name} key {key}", replies[i], default)
           for i, (name, key, _, default) in enumerate(reads)}
    page = f.reply(f"entries key {sk.entries}", replies[len(reads)], [])
    # the newest receipt of every role's stream (their ids are one order, see keys.py)
    newest = [f.reply(f"{role} receipts key {key}", replies[len(reads) + 1 + i], [])
              for i, (role, key) in enumerate(sk.receipt_streams())]
    last = max((n[0] for n in newest if n), key=lambda e: id_order(e[0]), default=None)
    if not f and not raw["meta"] and not replies[-1]:
        raise not_found(f"session {session_id}", namespace=store.keys.ns,
                        session_id=session_id)
    requested = requested_meta(raw["inbox"]) if isinstance(raw["inbox"], dict) else {}
    if not raw["meta"] and requested:  # not opened yet: shown as its first request asks
        raw["meta"] = requested
    elif not raw["meta"] and not any(x.startswith(f"meta key {sk.meta}") for x in f):
        f.add(f"meta key {sk.meta}", "missing (the session's other keys exist)")
    # A live run's committed intent, its Brain-owned fields and the group counts are kept
    # in the intents hash (only Brains write it).
    merged = with_intents(raw["runs"], raw["intents"])
    # clients' cancel intents wait in the inbox until a Brain consumes them
    asked = {k: v for k, v in raw["inbox"].items() if k.startswith("cancel:")}
    meta = lenient_meta(session_id, {**raw["meta"], **asked}, f, f"meta key {sk.meta}", merged) \
        if raw["meta"] else lenient_meta(session_id, {}, Findings())
    live_tasks = _decode_each(f, "task", raw["tasks"], Task)
    if requested:  # not opened yet: the tasks its requests ask for, pending
        live_tasks |= {q.task.id: q.task for q in parse_requests(raw["inbox"])}
    done_tasks = _decode_each(f, "finished task", raw["done"], Task)
    live_runs = _runs_each(f, sk.runs, merged)
    runs = {**_runs_each(f, sk.runs_done, raw["runs_done"]), **live_runs}
    submissions = _decode_each(f, "submission", raw["subs"], Submission)
    # a submission whose request no Brain took up yet waits in the inbox: accepted
    submissions |= {q.submission.id: q.submission for q in parse_requests(raw["inbox"])
                    if q.submission is not None and q.submission.id not in submissions}
    start = int(raw["entry_count"]) - len(page)
    for i, e in enumerate(page):
        f.parse(f"entry {start + i} does not parse", None, decode, Entry, e)
    # The archival ended the lease it was archived under.
    leased = bool(meta.holder) and meta.lease_until_ms > now and not source.archived
    shard: Any = store.redis

    async def timers() -> list[dict[str, Any]]:
        return [{"timer": m.split("|")[0], "member": m, "due_in_ms": int(score) - now}
                async for m, score in shard.zscan_iter(sk.timers, match=f"*|{session_id}|*")]

    letters, _ = await _dead_letters(store, f, 1000)
    dead = [d for d in letters if d.get("session_id") == session_id]
    quarantine = _quarantine(raw["poison"], f, sk.poison)
    halted = bool(quarantine and quarantine["quarantined"])
    served = _served(await _services(store, now, f))
    # No level to check for a quarantined session, or one whose meta names no agent.
    level = "" if halted or "agent" not in raw["meta"] else _level_reason(
        meta.agent, meta.compat, served)
    tasks = []
    for t in [*live_tasks.values(), *done_tasks.values()]:
        s = t.state
        why = ""
        if halted and not t.terminal:
            why = "session quarantined: no Brain runs it"
        elif not t.terminal:
            why = (meta.blocked.get(t.id) and f"blocked: {meta.blocked[t.id]}") or (
                level and f"blocked: {level}") or _blocked(t, live_runs, meta.fence, leased)
        tasks.append({
            "task_id": t.id, "kind": t.kind, "version": t.version, "state": s.name,
            "outcome": getattr(s, "outcome", None), "reason": getattr(s, "reason", None) or None,
            "phase": t.checkpoint.phase, "crashes": t.crashes,
            "waits": list(s.on) if s.name == "waiting" else [],
            "blocked": why, "cancel_requested": t.cancel_requested,
            "submission_id": t.submission_id, "updated_ms": t.updated_ms,
        })
    awaiting = [{"run_id": r.run_id, "task_id": r.intent.task_id, "tool": r.intent.tool,
                 "arguments": r.intent.arguments, "digest": r.intent.approval_digest,
                 "waiting_ms": now - r.intent.created_ms}
                for r in sorted(live_runs.values(), key=lambda r: r.run_id)
                if r.status == "awaiting_approval"]
    view = {
        "session_id": session_id, **source.marker(), "epoch": await _epoch(store, f, sk.shard),
        "agent": meta.agent, "compat": meta.compat,
        "quarantine": quarantine,
        "blocked": {"level": level or None, "tasks": dict(meta.blocked)},
        "cancel_intents": list(meta.cancels), "awaiting_approval": awaiting,
        "wake_subject": meta.wake_subject, "shard": sk.shard,
        "lease": {"holder": meta.holder or None, "fence": meta.fence, "live": leased,
                  "remaining_ms": meta.lease_until_ms - now if leased else 0,
                  "dirty": meta.dirty, "held_for_results": leased and bool(meta.listen)},
        "seq": meta.seq, "entries": int(raw["entry_count"]), "groups": meta.groups,
        "receipts": sum(int(raw[k]) for k in ("receipts", "receipts_hands", "receipts_client")),
        "last_receipt": last[0] if last else None,
        "submissions": [{"submission_id": s.id, "request_id": s.request_id, "status": s.status,
                         "answer": s.answer, "error": s.error}
                        for s in submissions.values()],
        "tasks": tasks,
        "runs": [_run_row(r, now) for r in sorted(
            runs.values(), key=lambda r: (r.intent.created_ms, r.run_id))],
        "timers": await f.read(f"timers key {sk.timers}", timers(), []),
        "dead_letters": dead,
        "backlog": await _backlog(store, now, f),
    }
    view["findings"] = list(f)
    return view


async def _subjects(bus: Bus | None, services: list[dict[str, Any]],
                    served: set[tuple[str, int]]) -> dict[str, Any]:
    """Messages waiting per JetStream subject, and which of them nothing live takes."""
    if bus is None:
        return {"rows": [], "unconsumed": [], "error": "not connected to NATS"}
    tools = {str(t) for s in services if s.get("role") == "hands" and s["alive"]
             for t in s.get("tools", ())}
    try:
        rows = await subject_backlog(bus.nc.jetstream(), bus.names, served, tools)
    except Exception as exc:  # e.g. a NATS user without JetStream info permissions
        return {"rows": [], "unconsumed": [], "error": bounded(exc, 300)}
    unconsumed = [r for r in rows if r["consumer"] is None or r["served"] is False]
    return {"rows": rows[:50], "unconsumed": unconsumed[:50], "error": None}


async def cluster_view(store: Store, bus: Bus | None = None) -> dict[str, Any]:
    """Services seen, sessions by state, outbox backlog per shard, JetStream subjects with
    waiting messages (with ``bus``), dead letters. A key of the wrong type or a record that
    does not parse is a line in ``findings`` (its session counted ``unreadable``)."""
    f = Findings()
    now = now_ms()
    services = await _services(store, now, f)
    served = _served(services)
    services.sort(key=lambda s: (str(s.get("role", "")), str(s.get("name", ""))))
    ids, counted = await newest_sessions(store, CLUSTER_SESSIONS, findings=f)
    total: int | None = counted
    if f.refused("sessions index"):
        total = None  # unknown, not zero: this credential cannot list the sessions
    sessions = await session_rows(store, ids, served, now, findings=f)
    states: dict[str, int] = {}
    for row in sessions:
        states[row["state"]] = states.get(row["state"], 0) + 1
    dead, dead_count = await _dead_letters(store, f, 20)
    view = {
        "namespace": store.keys.ns, "epoch": await _epoch(store, f),
        "replica_acks": store.scripts.min_replicas,
        "services": services, "sessions_total": total,
        "sessions_by_state": states, "sessions": sessions[:20],
        "blocked_sessions": [s for s in sessions if s["blocked"]][:50],
        "quarantined_sessions": [s for s in sessions if s["state"] == "quarantined"][:50],
        "backlog": await _backlog(store, now, f),
        "subjects": await _subjects(bus, services, served),
        "dead_letters": {"count": dead_count, "newest": dead},
    }
    view["findings"] = list(f)
    return view


async def newest_sessions(store: Store, count: int, *, since_ms: int | None = None,
                          until_ms: int | None = None,
                          findings: Findings | None = None) -> tuple[list[str], int]:
    """The ``count`` newest session ids over every shard's index (created within
    ``since_ms``..``until_ms`` when given), and how many there are in that range. An index
    key of the wrong type is a finding, never an exception."""
    f = findings if findings is not None else Findings()
    redis: Any = store.redis
    keys = store.keys.every("sessions")
    top = "+inf" if until_ms is None else until_ms
    bottom = "-inf" if since_ms is None else since_ms
    async with redis.pipeline(transaction=False) as p:
        for key in keys:
            p.zrevrangebyscore(key, top, bottom, start=0, num=count, withscores=True)
            p.zcount(key, bottom, top)
        replies = await p.execute(raise_on_error=False)
    pairs = [pair for i, key in enumerate(keys)
             for pair in f.reply(f"sessions index {key}", replies[2 * i], [])]
    total = sum(int(f.reply(f"sessions index {key}", replies[2 * i + 1], 0))
                for i, key in enumerate(keys))
    newest: list[Any] = sorted(pairs, key=lambda pair: pair[1], reverse=True)
    return [str(sid) for sid, _ in newest[:count]], total


async def session_rows(store: Store, ids: list[str], served: set[tuple[str, int]], now: int,
                       *, findings: Findings | None = None) -> list[dict[str, Any]]:
    """One row per session that exists: its state (quarantined, unreadable, blocked, leased,
    pending, failed or settled), fence, holder, seq, agent, compat level, why it is blocked,
    submissions by status and its quarantine; in the order of ``ids``. What does not parse is
    a finding (the session's state ``unreadable``), never an exception."""
    f = findings if findings is not None else Findings()
    redis: Any = store.redis  # decoded replies; redis-py's stubs say bytes | str
    async with redis.pipeline(transaction=False) as p:
        for sid in ids:
            sk = store.keys.session(sid)
            p.hgetall(sk.meta).hvals(sk.subs).hlen(sk.tasks).hgetall(sk.poison)
            p.hgetall(sk.inbox)
        replies = await p.execute(raise_on_error=False)
    rows: list[dict[str, Any]] = []
    for i, sid in enumerate(ids):
        sk = store.keys.session(sid)
        before = len(f)
        meta_raw = f.reply(f"meta key {sk.meta}", replies[5 * i], None)
        subs = f.reply(f"submissions key {sk.subs}", replies[5 * i + 1], [])
        live = f.reply(f"tasks key {sk.tasks}", replies[5 * i + 2], 0)
        poison = _quarantine(f.reply(f"poison key {sk.poison}", replies[5 * i + 3], {}), f,
                             sk.poison)
        inbox = replies[5 * i + 4] if isinstance(replies[5 * i + 4], dict) else {}
        # Requests waiting for a Brain to take them up are work too (and their submissions
        # are accepted), whether the session is open or not.
        requests = parse_requests(inbox) if inbox else []
        if meta_raw == {} and (requested := requested_meta(inbox)):
            meta_raw = requested  # not opened yet: as its first request asks
        if meta_raw == {}:  # indexed, but gone (expired or deleted)
            continue
        live += len(requests)
        meta = (lenient_meta(sid, meta_raw, f, f"meta key {sk.meta}") if meta_raw
                else lenient_meta(sid, {}, Findings()))  # unreadable: found above
        statuses = [f.parse(f"submission in {sk.subs} does not parse", "", _status, s)
                    for s in subs] + ["accepted" for q in requests if q.submission is not None]
        halted = bool(poison and poison["quarantined"])
        blocked = ""
        if live and not halted and meta_raw and "agent" in meta_raw:
            level = _level_reason(meta.agent, meta.compat, served)
            blocked = level or "; ".join(f"task {k}: {v}" for k, v in meta.blocked.items())
        if halted:
            state = "quarantined"
        elif len(f) > before:
            state = "unreadable"
        elif blocked:
            state = "blocked"
        elif meta.holder and meta.lease_until_ms > now:
            state = "leased"
        elif any(s in ("accepted", "running") for s in statuses) or requests:
            state = "pending"
        elif "failed" in statuses:
            state = "failed"
        else:
            state = "settled"
        by_status: dict[str, int] = {}
        for st in statuses:
            if st:
                by_status[st] = by_status.get(st, 0) + 1
        rows.append({"session_id": sid, "state": state, "fence": meta.fence,
                     "holder": meta.holder or None, "seq": meta.seq,
                     "agent": meta.agent, "compat": meta.compat,
                     "blocked": blocked or None, "submissions": by_status,
                     "quarantined": state == "quarantined",
                     "quarantine": poison["reason"] if state == "quarantined" and poison
                     else None})
    return rows
