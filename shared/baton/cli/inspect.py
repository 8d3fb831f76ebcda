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
or no live worker serves the subject: see :mod:`baton.bus.backlog`), the fleet-wide limits
of capped tools (slots in use, runs waiting in line, the rate's next admission: see
:mod:`baton.store.limits`) and of models (:mod:`baton.store.budgets`), dead letters.
Both show quarantined sessions (state ``quarantined``, with the reason and the tries: see
:mod:`baton.store.quarantine`). An archived session is read from the archive and shown as it
was, marked archived (``archived``, ``archived_ms``; its lease ended with the archival): see
:mod:`baton.store.archived`. Nothing stored makes it fail: a key of the wrong type, a
missing hash or a record that does not parse is a *finding* (:mod:`baton.cli.findings`),
listed in red at the end (``findings`` in JSON), and the rest of the view is shown.
Read-only: it never takes a lease, writes, fetches or acks. ``--json`` gives the same data;
the text is drawn by the rendering at the end of this module (rich tables and lines, every
stored string escaped as markup).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from baton.budgets import ModelBudget
from baton.bus.backlog import subject_backlog
from baton.bus.bus import Bus
from baton.cli.findings import Findings, lenient_meta
from baton.cli.trace.model import archived_line
from baton.errors import ValidationError, not_found
from baton.limits import ToolLimit
from baton.models import Entry, Submission, Task, ToolRun, decode, dumps, loads
from baton.observability.log import bounded
from baton.receipts import id_order
from baton.store.admission import AdmissionQueue
from baton.store.archived import SessionSource
from baton.store.budgets import Budgets
from baton.store.epoch import StoreEpoch
from baton.store.limits import Limits
from baton.store.state import parse_requests, parse_runs, requested_meta, with_intents
from baton.store.store import Store, now_ms
from baton.store.workers import SERVICE_STALE_MS
from baton.store.workers import served_levels as _served

__all__ = [
    "cluster_view", "limits_view", "newest_sessions", "render_cluster", "render_session",
    "session_rows", "session_view",
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
    services = await _services(store, now, f)
    served = _served(services)
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
    await _waiting_runs(store, view["runs"], set(_announced_limits(services, f)), f)
    view["findings"] = list(f)
    return view


#: Members of a tool's line read to place a session's runs in it (inspect reads, no more).
_LINE_READ = 10_000


async def _waiting_runs(store: Store, rows: list[dict[str, Any]], capped: set[str],
                        f: Findings) -> None:
    """Mark each dispatched run of a capped tool that waits in the tool's fleet-wide line
    (baton.store.limits: the line's members are ``<run id>/<hands>/<nonce>``):
    ``waiting_for``, with its place."""
    unclaimed: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "dispatched" and row["tool"] in capped:
            unclaimed.setdefault(row["tool"], []).append(row)
    for tool, tool_rows in unclaimed.items():
        try:
            line = store.keys.tool_limit(tool)[1]
        except ValidationError:  # a name no tool may have: it has no line
            continue
        members = await f.read(f"line of tool {tool}",
                               store.redis.zrange(line, 0, _LINE_READ - 1), [])
        place = {str(m).partition("/")[0]: i for i, m in enumerate(members, start=1)}
        for row in tool_rows:
            if row["run_id"] in place:
                row["waiting_for"] = f"a {tool} slot ({place[row['run_id']]} in line)"


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


def _announced_limits(services: list[dict[str, Any]], f: Findings) -> dict[str, ToolLimit]:
    """The fleet-wide limit of each tool the live Hands announce one for (a malformed one
    is a finding)."""
    declared: dict[str, ToolLimit] = {}
    for s in services:
        if s.get("role") != "hands" or not s["alive"]:
            continue
        for tool, raw in dict(s.get("limits") or {}).items():
            limit = f.parse(f"limit of tool {tool} announced by {s.get('name')}", None,
                            ToolLimit.of, raw)
            if limit is not None:
                declared.setdefault(str(tool), limit)
    return declared


async def _tool_limits(store: Store, services: list[dict[str, Any]],
                       f: Findings) -> list[dict[str, Any]]:
    """The fleet-wide limits the live Hands announce (baton.store.limits), each with its
    slots in use, runs waiting in line and the wait for the rate's next admission."""
    limits = Limits(store.redis, store.keys, slot_ms=1)  # reads only: slot_ms unused
    rows = []
    for tool, limit in sorted(_announced_limits(services, f).items()):
        usage = await f.read(f"limits of tool {tool}", limits.look(tool, limit), None)
        if usage is None:
            continue
        rows.append({"tool": tool, "limit": limit.describe(), **limit.as_dict(),
                     "in_use": usage.in_use, "waiting": usage.waiting,
                     "rate_wait_ms": usage.rate_wait_ms})
    return rows


async def _model_budgets(store: Store, services: list[dict[str, Any]],
                         f: Findings) -> list[dict[str, Any]]:
    """The models' fleet-wide budgets the live Brains announce (baton.store.budgets), each
    with its slots in use, calls waiting, the pause left and the rates' next admissions."""
    declared: dict[str, ModelBudget] = {}
    for s in services:
        if s.get("role") != "brain" or not s["alive"]:
            continue
        for model, raw in dict(s.get("budgets") or {}).items():
            budget = f.parse(f"budget of model {model} announced by {s.get('name')}", None,
                             ModelBudget.of, raw)
            if budget is not None:
                declared.setdefault(str(model), budget)
    budgets = Budgets(store.redis, store.keys, slot_ms=1)  # reads only: slot_ms unused
    rows = []
    for model, budget in sorted(declared.items()):
        state = await f.read(f"budget of model {model}", budgets.look(model, budget), None)
        if state is not None:
            rows.append({"model": model, "budget": budget.describe(), **budget.as_dict(),
                         **dataclasses.asdict(state)})
    return rows


async def _admission(store: Store, f: Findings) -> dict[str, Any] | None:
    """New sessions waiting to start, per tenant (baton.store.admission); None when none
    waits and this process's settings do not turn admission on."""
    s = store.settings
    backlog = await f.read("admission queues", AdmissionQueue(
        store.redis, store.keys, s).backlog(), None)
    if backlog is None or (not backlog.waiting and not s.admission_window):
        return None
    return {"window": s.admission_window, "max_waiting": s.max_waiting,
            "max_waiting_per_tenant": s.max_waiting_per_tenant,
            **dataclasses.asdict(backlog)}


async def limits_view(store: Store) -> dict[str, Any]:
    """The fleet-wide limits the live Hands and Brains announce, each with its slots in use,
    its line and its rates' next admissions, by tenant where tenants share it (the API's
    ``/v1/admission`` beside the new sessions waiting to start)."""
    f = Findings()
    services = await _services(store, now_ms(), f)
    return {"tool_limits": await _tool_limits(store, services, f),
            "model_budgets": await _model_budgets(store, services, f), "findings": list(f)}


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
        "tool_limits": await _tool_limits(store, services, f),
        "model_budgets": await _model_budgets(store, services, f),
        "admission": await _admission(store, f),
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


# ------------------------------------------------------------------ rendering (text)


def _ms(v: int | float | None) -> str:
    return "-" if v is None else f"{v / 1000:.1f}s" if abs(v) >= 10_000 else f"{int(v)} ms"


def _table(title: str, cols: tuple[str, ...]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(c)
    return t


def _backlog_table(backlog: list[dict[str, Any]], mine: int | None = None) -> Table:
    """Shards with rows (and the session's own); the empty rest in one line."""
    t = _table("Outbox backlog", ("shard", "rows", "oldest row age"))
    unread = [b for b in backlog if b["rows"] is None and b["shard"] != mine]
    shown = [b for b in backlog if b["rows"] or b["shard"] == mine]
    for b in shown:
        t.add_row(f"{b['shard']}{' (this session)' if b['shard'] == mine else ''}",
                  "?" if b["rows"] is None else str(b["rows"]), _ms(b["oldest_age_ms"]))
    if unread:  # refused to this credential (see the findings): not "0"
        t.add_row(f"{len(unread)} shard(s) not readable", "?", "-")
    if empty := len(backlog) - len(shown) - len(unread):
        t.add_row(f"{empty} other shard(s)", "0", "-")
    return t


def _epoch_lines(e: dict[str, Any]) -> list[str]:
    """One line naming the epoch, and a red one when it is missing or changed."""
    created = (datetime.fromtimestamp(e["created_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
               if e["created_ms"] else "-")
    if e["state"] == "new":
        return ["store epoch: none yet (no Baton process has used this store)"]
    if e["state"] == "unreadable":
        return ["[red]STORE EPOCH UNREADABLE[/red] (see the findings below)"]
    lines = [f"store epoch: {e['id']}  created {created}  ({e['shards']} shards)"]
    lost = "Redis restarted empty or failed over without the data; sessions before it are gone"
    if e["missing_shards"]:
        shards = ", ".join(map(str, e["missing_shards"][:16]))
        lines.append(f"[red]STORE EPOCH MISSING[/red] on shard(s) {shards}: {lost}")
    if e["differing_shards"]:
        shards = ", ".join(map(str, e["differing_shards"][:16]))
        lines.append(f"[red]STORE EPOCH CHANGED[/red] on shard(s) {shards}: the store was "
                     f"initialised again while they kept another epoch")
    own = e.get("session_shard")
    if own and own["state"] != "ok" and not (e["missing_shards"] or e["differing_shards"]):
        lines.append(f"[red]STORE EPOCH {own['state'].upper()}[/red] on this session's shard "
                     f"{own['shard']}: {lost}")
    return lines


def render_session(v: dict[str, Any], console: Console) -> None:
    lease = v["lease"]
    held = ", held for its tool results" if lease.get("held_for_results") else ""
    ended = "ended by the archival" if v.get("archived") else "released/expired"
    holder = (f"[bold]{_e(lease['holder'])}[/bold] (live, {_ms(lease['remaining_ms'])} left"
              f"{held})" if lease["live"] else f"none (last: {_e(lease['holder'] or '-')}, "
              f"{ended})")
    console.print(f"session [bold]{_e(v['session_id'])}[/bold]  agent {_e(v['agent'])} compat "
                  f"{v['compat']}  shard {v['shard']}")
    for line in _epoch_lines(v["epoch"]):
        console.print(line)
    if v.get("archived"):
        console.print(f"[bold]{_e(archived_line(v['archived_ms']))}[/bold]")
    for line in _quarantine_lines(v.get("quarantine")):
        console.print(line)
    console.print(f"lease holder: {holder}  fence {lease['fence']}  dirty {lease['dirty']}  "
                  f"seq {v['seq']}  entries {v['entries']}  receipts {v['receipts']}")
    if v["blocked"]["level"]:
        console.print(f"[red]BLOCKED[/red]: {_e(v['blocked']['level'])}")
    for tid, why in v["blocked"]["tasks"].items():
        console.print(f"[red]BLOCKED[/red] task {_e(tid)}: {_e(why)}")
    if v["cancel_intents"]:
        console.print("cancel requested, not yet carried out: "
                      + _e(", ".join(v["cancel_intents"])))
    subs = _table("Submissions", ("submission", "request", "status", "answer / error"))
    for s in v["submissions"]:
        subs.add_row(_e(s["submission_id"]), _e(s["request_id"]), s["status"],
                     _e((s["answer"] or s["error"] or "")[:80]))
    console.print(subs)
    tasks = _table("Tasks", ("task", "kind", "state", "phase", "crashes", "waits",
                             "blocked / outcome"))
    for t in v["tasks"]:
        state = t["state"] + (f" {t['outcome']}" if t["outcome"] else "")
        tasks.add_row(_e(t["task_id"]), _e(f"{t['kind']} v{t['version']}"), state,
                      _e(t["phase"]), str(t["crashes"]),
                      str(len(t["waits"])) if t["waits"] else "-",
                      _e(t["blocked"] or t["reason"] or ""))
    console.print(tasks)
    runs = _table("Tool runs", ("run", "tool", "status", "accepted", "completed", "applied",
                                "attempt", "worker", "heartbeat", "recovery"))
    for r in v["runs"]:
        m = r["marks"]
        status = r["status"] + (f": waiting for {r['waiting_for']}"
                                 if r.get("waiting_for") else "")
        runs.add_row(_e(r["run_id"]), _e(f"{r['tool']} ({r['replay']})"), _e(status),
                     *("✓" if m[k] else "·" for k in ("accepted", "completed", "applied")),
                     f"{r['attempt']} ({len(r['attempts'])} ended)", _e(r["worker"] or "-"),
                     _ms(r["heartbeat_age_ms"]) + (" ago" if r["heartbeat_age_ms"] else ""),
                     r["recovery"] or "-")
    console.print(runs)
    if v["awaiting_approval"]:
        gated = _table("Awaiting approval (baton approve SESSION --run RUN --args-digest D)",
                       ("run", "tool", "arguments", "digest", "waiting"))
        for a in v["awaiting_approval"]:
            gated.add_row(_e(a["run_id"]), _e(a["tool"]), _e(dumps(a["arguments"])[:200]),
                          a["digest"],
                          _ms(a["waiting_ms"]))
        console.print(gated)
        # The commands whole, one per line: a narrow table cuts the ids and the digest.
        for a in v["awaiting_approval"]:
            console.print(f"  baton approve {_e(v['session_id'])} --run {_e(a['run_id'])} "
                          f"--args-digest {_e(a['digest'])}", soft_wrap=True)
    if v["timers"]:
        console.print("timers: " + ", ".join(f"{_e(t['timer'])} due in {_ms(t['due_in_ms'])}"
                                             for t in v["timers"]))
    console.print(f"dead letters about this session: {len(v['dead_letters']) or 'none'}")
    for d in v["dead_letters"]:
        console.print(f"  {d['id']} {_e(d.get('source'))}: {_e(d.get('reason'))}")
    console.print(_backlog_table(v["backlog"], v["shard"]))
    _render_findings(v.get("findings", []), console)


def _render_subjects(subjects: dict[str, Any] | None, console: Console) -> None:
    if not subjects:
        return
    if subjects["error"]:
        console.print(f"JetStream subjects: unknown ({_e(subjects['error'])})")
        return
    t = _table("Messages waiting in JetStream", ("subject", "messages", "oldest", "consumer",
                                                 "served"))
    for r in subjects["rows"]:
        lost = r["consumer"] is None or r["served"] is False
        t.add_row(r["subject"], str(r["messages"]), _ms(r["oldest_age_ms"]),
                  r["consumer"] or "[red]none[/red]",
                  "[red]NOT CONSUMED[/red]" if lost else "yes" if r["served"] else "?")
    console.print(t)
    for r in subjects["unconsumed"]:
        who = "Brain serves" if r["kind"] == "wake" else "Hands serves"
        console.print(f"[red]UNCONSUMED[/red] {r['messages']} message(s) on {r['subject']}, "
                      f"oldest {_ms(r['oldest_age_ms'])}: "
                      + ("no consumer exists" if r["consumer"] is None
                         else f"no live {who} it"))


def _by_tenant(counts: dict[str, int] | None) -> str:
    """" (acme 2, globex 1)" when a line holds another tenant than the default one."""
    if not counts or set(counts) == {"default"}:
        return ""
    return " (" + ", ".join(f"{_e(t)} {n}" for t, n in counts.items()) + ")"


def _render_tool_limits(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    t = _table("Fleet-wide tool limits", ("tool", "limit", "slots in use", "runs waiting",
                                          "next admission"))
    for r in rows:
        cap = r["max_concurrency"]
        t.add_row(_e(r["tool"]), _e(r["limit"]),
                  (f"{r['in_use']} of {cap}" + _by_tenant(r.get("in_use_by_tenant")))
                  if cap else "-",
                  str(r["waiting"]) + _by_tenant(r.get("waiting_by_tenant")),
                  ("in " + _ms(r["rate_wait_ms"])) if r["rate_wait_ms"] else "now")
    console.print(t)


def _render_model_budgets(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    t = _table("Fleet-wide model budgets", ("model", "budget", "slots in use", "calls waiting",
                                            "paused", "next request", "next tokens"))
    for r in rows:
        cap = r["concurrency"]
        t.add_row(_e(r["model"]), _e(r["budget"]),
                  (f"{r['in_use']} of {cap}" + _by_tenant(r.get("in_use_by_tenant")))
                  if cap else "-",
                  str(r["waiting"]) + _by_tenant(r.get("waiting_by_tenant")),
                  f"[red]{_ms(r['paused_ms'])} more[/red]" if r["paused_ms"] else "no",
                  *(("in " + _ms(r[k])) if r[k] else "now"
                    for k in ("requests_wait_ms", "tokens_wait_ms")))
    console.print(t)


def _render_admission(a: dict[str, Any] | None, console: Console) -> None:
    if not a:
        return
    bounds = ", ".join(f"{what} {n}" for what, n in (
        ("in total", a["max_waiting"]), ("per tenant", a["max_waiting_per_tenant"])) if n)
    console.print(f"New sessions waiting to start: {a['waiting']} ({a['starting']} starting, "
                  f"{a['queued']} queued; window {a['window'] or 'off here'}; bound "
                  f"{bounds or 'none'})")
    t = _table("Waiting by tenant", ("tenant", "waiting"))
    for tenant, n in a["tenants"].items():
        t.add_row(_e(tenant), str(n))
    console.print(t)


def render_cluster(v: dict[str, Any], console: Console) -> None:
    for line in _epoch_lines(v["epoch"]):
        console.print(line)
    acks = v["replica_acks"]
    console.print("writes acknowledged after " + (f"{acks} replica(s) have them (WAIT)"
                                                   if acks else "the primary alone (no WAIT)"))
    services = _table(f"Services seen (namespace {v['namespace']})",
                      ("role", "name", "pid", "last seen", "in flight", "state", "serves"))
    for s in v["services"]:
        services.add_row(_e(s.get("role", "?")), _e(s.get("name", "?")),
                         _e(s.get("pid", "")),
                         _ms(s["seen_age_ms"]) + " ago", str(s.get("inflight", 0)),
                         "alive" if s["alive"] else "[red]silent[/red]",
                         _e(", ".join(f"{a}@{c}" for a, c in s.get("serves", ())) or "-"))
    console.print(services)
    states = ", ".join(f"{k} {n}" for k, n in sorted(v["sessions_by_state"].items()))
    if v["sessions_total"] is None:
        console.print("sessions: [red]not readable with this credential[/red] (the operator's "
                      "lists them: see FINDINGS)")
    else:
        console.print(f"sessions: {v['sessions_total']} ({states or 'none'})")
    recent = _table("Newest sessions", ("session", "state", "fence", "holder", "seq"))
    for s in v["sessions"]:
        state = f"[red]{s['state']}[/red]" if s["state"] in ("quarantined", "unreadable") \
            else s["state"]
        recent.add_row(_e(s["session_id"]), state, str(s["fence"]), _e(s["holder"] or "-"),
                       str(s["seq"]))
    console.print(recent)
    for b in v["blocked_sessions"]:
        console.print(f"[red]BLOCKED[/red] session {_e(b['session_id'])} ({_e(b['agent'])} "
                      f"compat {b['compat']}): {_e(b['blocked'])}")
    for q in v.get("quarantined_sessions", ()):
        console.print(f"[red]QUARANTINED[/red] session {_e(q['session_id'])}: "
                      f"{_e(q['quarantine'])}")
    console.print(_backlog_table(v["backlog"]))
    _render_subjects(v.get("subjects"), console)
    _render_tool_limits(v.get("tool_limits", []), console)
    _render_model_budgets(v.get("model_budgets", []), console)
    _render_admission(v.get("admission"), console)
    dead = v["dead_letters"]
    console.print("dead letters: " + ("not readable with this credential"
                                      if dead["count"] is None else str(dead["count"])))
    for d in dead["newest"][:10]:
        console.print(f"  {d['id']} {_e(d.get('source'))}: {_e(d.get('reason'))} "
                      f"(session {_e(d.get('session_id', '-'))})")
    _render_findings(v.get("findings", []), console)


def _render_findings(findings: list[str], console: Console) -> None:
    """What could not be read or decoded (a key of the wrong type, JSON that does not
    parse): shown, never a traceback."""
    if findings:
        console.print(f"[red]FINDINGS[/red]: {len(findings)} part(s) of the store could not "
                      "be read or decoded")
    for line in findings:
        console.print(f"  [red]![/red] {_e(line)}")


def _quarantine_lines(q: dict[str, Any] | None) -> list[str]:
    """The session's quarantine (red), or its failures to process so far."""
    if not q:
        return []
    if q["quarantined"]:
        when = (datetime.fromtimestamp(q["quarantined_ms"] / 1000, UTC).strftime(
            "%Y-%m-%d %H:%M:%S UTC") if q["quarantined_ms"] else "-")
        return [f"[red]QUARANTINED[/red] after {q['tries']} tries ({when}): {_e(q['reason'])}"
                " - its wakes are acknowledged and its timers dropped; waiting clients get "
                "QuarantinedError"]
    return [f"[yellow]FAILING[/yellow]: {q['tries']} failed attempt(s) to process it, last: "
            f"{_e(q['reason'])}"]


def _e(value: Any) -> str:
    """Stored text shown as it is (never read as console markup)."""
    return escape(str(value))
