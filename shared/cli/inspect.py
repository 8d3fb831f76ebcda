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
Read-only: it never takes a lease, writes, fetches or acks. ``--json`` gives the same data.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bus.backlog import subject_backlog
from baton.bus.bus import Bus
from baton.models import Task, ToolRun, dumps, loads
from baton.observability.log import bounded
from baton.store.deadletter import dead_letter_count, dead_letters
from baton.store.epoch import StoreEpoch
from baton.store.outbox import Outbox
from baton.store.state import parse_meta
from baton.store.store import Store, now_ms
from baton.store.workers import served_levels as _served
from baton.store.workers import services

__all__ = [
    "cluster_view", "newest_sessions", "render_cluster", "render_session", "session_rows",
    "session_view",
]

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


async def _services(store: Store, now: int) -> list[dict[str, Any]]:
    return await services(store.redis, store.keys, now)


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


async def _backlog(store: Store, now: int) -> list[dict[str, Any]]:
    rows = await Outbox(store.redis, store.keys).backlog()
    return [{"shard": b.shard, "rows": b.rows, "oldest_age_ms": _age(b.oldest_ms, now)}
            for b in rows]


async def _epoch(store: Store, shard: int | None = None) -> dict[str, Any]:
    """The store epoch as every shard carries it (and, for a session, its own shard's)."""
    e = await StoreEpoch.survey(store.redis, store.keys)
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


async def session_view(store: Store, session_id: str) -> dict[str, Any]:
    """Everything ``inspect SESSION`` shows, as plain data."""
    state = await store.load(session_id, page=20)
    now = now_ms()
    meta = state.meta
    leased = bool(meta.holder) and meta.lease_until_ms > now
    done_tasks = await store.finished_tasks(session_id)
    runs = {**await store.runs.applied(session_id), **state.runs}
    sk = store.keys.session(session_id)
    timers = [{"timer": m.split("|")[0], "member": m, "due_in_ms": int(score) - now}
              async for m, score in store.redis.zscan_iter(sk.timers, match=f"*|{session_id}|*")]
    receipts = await store.redis.xlen(sk.receipts)
    last = await store.redis.xrevrange(sk.receipts, count=1)
    dead = [d for d in await dead_letters(store.redis, store.keys, 1000)
            if d.get("session_id") == session_id]
    level = _level_reason(meta.agent, meta.compat, _served(await _services(store, now)))
    tasks = []
    for t in [*state.tasks.values(), *done_tasks.values()]:
        s = t.state
        why = ""
        if not t.terminal:
            why = (meta.blocked.get(t.id) and f"blocked: {meta.blocked[t.id]}") or (
                level and f"blocked: {level}") or _blocked(t, state.runs, meta.fence, leased)
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
                for r in sorted(state.runs.values(), key=lambda r: r.run_id)
                if r.status == "awaiting_approval"]
    return {
        "session_id": session_id, "epoch": await _epoch(store, sk.shard),
        "agent": meta.agent, "compat": meta.compat,
        "blocked": {"level": level or None, "tasks": dict(meta.blocked)},
        "cancel_intents": list(meta.cancels), "awaiting_approval": awaiting,
        "wake_subject": meta.wake_subject, "shard": sk.shard,
        "lease": {"holder": meta.holder or None, "fence": meta.fence, "live": leased,
                  "remaining_ms": meta.lease_until_ms - now if leased else 0,
                  "dirty": meta.dirty},
        "seq": meta.seq, "entries": state.entry_count, "groups": meta.groups,
        "receipts": receipts, "last_receipt": last[0][0] if last else None,
        "submissions": [{"submission_id": s.id, "request_id": s.request_id, "status": s.status,
                         "answer": s.answer, "error": s.error}
                        for s in state.submissions.values()],
        "tasks": tasks,
        "runs": [_run_row(r, now) for r in sorted(
            runs.values(), key=lambda r: (r.intent.created_ms, r.run_id))],
        "timers": timers,
        "dead_letters": dead,
        "backlog": await _backlog(store, now),
    }


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
    waiting messages (with ``bus``), dead letters."""
    now = now_ms()
    services = await _services(store, now)
    served = _served(services)
    services.sort(key=lambda s: (s.get("role", ""), s.get("name", "")))
    ids, total = await newest_sessions(store, CLUSTER_SESSIONS)
    sessions = await session_rows(store, ids, served, now)
    states: dict[str, int] = {}
    for row in sessions:
        states[row["state"]] = states.get(row["state"], 0) + 1
    dead = await dead_letters(store.redis, store.keys, 20)
    return {
        "namespace": store.keys.ns, "epoch": await _epoch(store),
        "replica_acks": store.scripts.min_replicas,
        "services": services, "sessions_total": total,
        "sessions_by_state": states, "sessions": sessions[:20],
        "blocked_sessions": [s for s in sessions if s["blocked"]][:50],
        "backlog": await _backlog(store, now),
        "subjects": await _subjects(bus, services, served),
        "dead_letters": {"count": await dead_letter_count(store.redis, store.keys),
                         "newest": dead},
    }


async def newest_sessions(store: Store, count: int, *, since_ms: int | None = None,
                          until_ms: int | None = None) -> tuple[list[str], int]:
    """The ``count`` newest session ids over every shard's index (created within
    ``since_ms``..``until_ms`` when given), and how many there are in that range."""
    redis: Any = store.redis
    top = "+inf" if until_ms is None else until_ms
    bottom = "-inf" if since_ms is None else since_ms
    async with redis.pipeline(transaction=False) as p:
        for key in store.keys.every("sessions"):
            p.zrevrangebyscore(key, top, bottom, start=0, num=count, withscores=True)
            p.zcount(key, bottom, top)
        replies = await p.execute()
    newest = sorted((pair for reply in replies[0::2] for pair in reply),
                    key=lambda pair: pair[1], reverse=True)
    return [str(sid) for sid, _ in newest[:count]], sum(int(n) for n in replies[1::2])


async def session_rows(store: Store, ids: list[str], served: set[tuple[str, int]],
                       now: int) -> list[dict[str, Any]]:
    """One row per session that exists: its state (blocked, leased, pending, failed or
    settled), fence, holder, seq, agent, compat level, why it is blocked, submissions by
    status and whether it is quarantined; in the order of ``ids``."""
    redis: Any = store.redis  # decoded replies; redis-py's stubs say bytes | str
    async with redis.pipeline(transaction=False) as p:
        for sid in ids:
            sk = store.keys.session(sid)
            p.hgetall(sk.meta).hvals(sk.subs).hlen(sk.tasks).hexists(sk.poison, "quarantined")
        replies = await p.execute()
    rows = []
    for i, sid in enumerate(ids):
        meta_raw, subs, live, quarantined = replies[4 * i: 4 * i + 4]
        if not meta_raw:
            continue
        meta = parse_meta(sid, meta_raw)
        statuses = [loads(s)["status"] for s in subs]
        blocked = ""
        if live:
            level = _level_reason(meta.agent, meta.compat, served)
            blocked = level or "; ".join(f"task {k}: {v}" for k, v in meta.blocked.items())
        if blocked:
            state = "blocked"
        elif meta.holder and meta.lease_until_ms > now:
            state = "leased"
        elif any(s in ("accepted", "running") for s in statuses):
            state = "pending"
        elif "failed" in statuses:
            state = "failed"
        else:
            state = "settled"
        by_status: dict[str, int] = {}
        for st in statuses:
            by_status[st] = by_status.get(st, 0) + 1
        rows.append({"session_id": sid, "state": state, "fence": meta.fence,
                     "holder": meta.holder or None, "seq": meta.seq,
                     "agent": meta.agent, "compat": meta.compat,
                     "blocked": blocked or None, "submissions": by_status,
                     "quarantined": bool(quarantined)})
    return rows


# ---------------------------------------------------------------------- rendering


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
    shown = [b for b in backlog if b["rows"] or b["shard"] == mine]
    for b in shown:
        t.add_row(f"{b['shard']}{' (this session)' if b['shard'] == mine else ''}",
                  str(b["rows"]), _ms(b["oldest_age_ms"]))
    if len(shown) < len(backlog):
        t.add_row(f"{len(backlog) - len(shown)} other shard(s)", "0", "-")
    return t


def _epoch_lines(e: dict[str, Any]) -> list[str]:
    """One line naming the epoch, and a red one when it is missing or changed."""
    created = (datetime.fromtimestamp(e["created_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
               if e["created_ms"] else "-")
    if e["state"] == "new":
        return ["store epoch: none yet (no Baton process has used this store)"]
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
    holder = (f"[bold]{lease['holder']}[/bold] (live, {_ms(lease['remaining_ms'])} left)"
              if lease["live"] else f"none (last: {lease['holder'] or '-'}, released/expired)")
    console.print(f"session [bold]{v['session_id']}[/bold]  agent {v['agent']} compat "
                  f"{v['compat']}  shard {v['shard']}")
    for line in _epoch_lines(v["epoch"]):
        console.print(line)
    console.print(f"lease holder: {holder}  fence {lease['fence']}  dirty {lease['dirty']}  "
                  f"seq {v['seq']}  entries {v['entries']}  receipts {v['receipts']}")
    if v["blocked"]["level"]:
        console.print(f"[red]BLOCKED[/red]: {v['blocked']['level']}")
    for tid, why in v["blocked"]["tasks"].items():
        console.print(f"[red]BLOCKED[/red] task {tid}: {why}")
    if v["cancel_intents"]:
        console.print(f"cancel requested, not yet carried out: {', '.join(v['cancel_intents'])}")
    subs = _table("Submissions", ("submission", "request", "status", "answer / error"))
    for s in v["submissions"]:
        subs.add_row(s["submission_id"], s["request_id"], s["status"],
                     (s["answer"] or s["error"] or "")[:80])
    console.print(subs)
    tasks = _table("Tasks", ("task", "kind", "state", "phase", "crashes", "waits",
                             "blocked / outcome"))
    for t in v["tasks"]:
        state = t["state"] + (f" {t['outcome']}" if t["outcome"] else "")
        tasks.add_row(t["task_id"], f"{t['kind']} v{t['version']}", state, t["phase"],
                      str(t["crashes"]), str(len(t["waits"])) if t["waits"] else "-",
                      t["blocked"] or t["reason"] or "")
    console.print(tasks)
    runs = _table("Tool runs", ("run", "tool", "status", "accepted", "completed", "applied",
                                "attempt", "worker", "heartbeat", "recovery"))
    for r in v["runs"]:
        m = r["marks"]
        runs.add_row(r["run_id"], f"{r['tool']} ({r['replay']})", r["status"],
                     *("✓" if m[k] else "·" for k in ("accepted", "completed", "applied")),
                     f"{r['attempt']} ({len(r['attempts'])} ended)", r["worker"] or "-",
                     _ms(r["heartbeat_age_ms"]) + (" ago" if r["heartbeat_age_ms"] else ""),
                     r["recovery"] or "-")
    console.print(runs)
    if v["awaiting_approval"]:
        gated = _table("Awaiting approval (baton approve RUN --session S --args-digest D)",
                       ("run", "tool", "arguments", "digest", "waiting"))
        for a in v["awaiting_approval"]:
            gated.add_row(a["run_id"], a["tool"], dumps(a["arguments"])[:200], a["digest"],
                          _ms(a["waiting_ms"]))
        console.print(gated)
    if v["timers"]:
        console.print("timers: " + ", ".join(f"{t['timer']} due in {_ms(t['due_in_ms'])}"
                                             for t in v["timers"]))
    console.print(f"dead letters about this session: {len(v['dead_letters']) or 'none'}")
    for d in v["dead_letters"]:
        console.print(f"  {d['id']} {d.get('source')}: {d.get('reason')}")
    console.print(_backlog_table(v["backlog"], v["shard"]))


def _render_subjects(subjects: dict[str, Any] | None, console: Console) -> None:
    if not subjects:
        return
    if subjects["error"]:
        console.print(f"JetStream subjects: unknown ({subjects['error']})")
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


def render_cluster(v: dict[str, Any], console: Console) -> None:
    for line in _epoch_lines(v["epoch"]):
        console.print(line)
    acks = v["replica_acks"]
    console.print("writes acknowledged after " + (f"{acks} replica(s) have them (WAIT)"
                                                   if acks else "the primary alone (no WAIT)"))
    services = _table(f"Services seen (namespace {v['namespace']})",
                      ("role", "name", "pid", "last seen", "in flight", "state", "serves"))
    for s in v["services"]:
        services.add_row(s.get("role", "?"), s.get("name", "?"), str(s.get("pid", "")),
                         _ms(s["seen_age_ms"]) + " ago", str(s.get("inflight", 0)),
                         "alive" if s["alive"] else "[red]silent[/red]",
                         ", ".join(f"{a}@{c}" for a, c in s.get("serves", ())) or "-")
    console.print(services)
    states = ", ".join(f"{k} {n}" for k, n in sorted(v["sessions_by_state"].items()))
    console.print(f"sessions: {v['sessions_total']} ({states or 'none'})")
    recent = _table("Newest sessions", ("session", "state", "fence", "holder", "seq"))
    for s in v["sessions"]:
        recent.add_row(s["session_id"], s["state"], str(s["fence"]), s["holder"] or "-",
                       str(s["seq"]))
    console.print(recent)
    for b in v["blocked_sessions"]:
        console.print(f"[red]BLOCKED[/red] session {b['session_id']} ({b['agent']} compat "
                      f"{b['compat']}): {b['blocked']}")
    console.print(_backlog_table(v["backlog"]))
    _render_subjects(v.get("subjects"), console)
    dead = v["dead_letters"]
    console.print(f"dead letters: {dead['count']}")
    for d in dead["newest"][:10]:
        console.print(f"  {d['id']} {d.get('source')}: {d.get('reason')} "
                      f"(session {d.get('session_id', '-')})")
