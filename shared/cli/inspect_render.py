"""The plain-text rendering of ``baton inspect``'s views (:mod:`baton.cli.inspect` gathers
them): rich tables and lines, every stored string escaped as markup."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from baton.cli.trace_model import archived_line
from baton.models import dumps

__all__ = ["render_cluster", "render_session"]


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
        runs.add_row(_e(r["run_id"]), _e(f"{r['tool']} ({r['replay']})"), r["status"],
                     *("✓" if m[k] else "·" for k in ("accepted", "completed", "applied")),
                     f"{r['attempt']} ({len(r['attempts'])} ended)", _e(r["worker"] or "-"),
                     _ms(r["heartbeat_age_ms"]) + (" ago" if r["heartbeat_age_ms"] else ""),
                     r["recovery"] or "-")
    console.print(runs)
    if v["awaiting_approval"]:
        gated = _table("Awaiting approval (baton approve RUN --session S --args-digest D)",
                       ("run", "tool", "arguments", "digest", "waiting"))
        for a in v["awaiting_approval"]:
            gated.add_row(_e(a["run_id"]), _e(a["tool"]), _e(dumps(a["arguments"])[:200]),
                          a["digest"],
                          _ms(a["waiting_ms"]))
        console.print(gated)
        # The commands whole, one per line: a narrow table cuts the ids and the digest.
        for a in v["awaiting_approval"]:
            console.print(f"  baton approve {_e(a['run_id'])} --session {_e(v['session_id'])} "
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
