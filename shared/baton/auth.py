"""What each role may do on NATS and Redis: the source of the deploy files' permissions.

Roles and what they need (``ns`` = namespace, ``NS`` = its stream prefix, see
:class:`~baton.bus.subjects.BusNames`):

========  ====================================================  ==============================
role      NATS                                                  Redis (writes)
========  ====================================================  ==============================
relay     publish ``ns.wake.>``, ``ns.tool.>`` and their        outbox and wakes streams (ack),
          copies on ``ns.fallback.>``; create and update the    timers, leases, nudges
          two streams
brain     create, pull from and ack consumers of ``NS_WAKE``;   session keys but run records,
          read it directly; ``ns.fallback.wake.>`` copies;      outbox, timers, budgeted
          ``ns.budget.*`` (a model budget's slot freed)         models' slots and rates
hands     create, pull from and ack consumers of ``NS_TOOLS``;  run records, receipts_hands,
          read it directly; ``ns.fallback.tool.>`` copies;      nudges, the wakes stream,
          ask and answer ``ns.live.hands.*`` (liveness);        capped tools' slots
          ``ns.limits.*`` (a capped tool's slot freed)
client    nothing: clients submit and watch through Redis       granted sessions' inbox and
                                                                receipts_client, wakes
operator  stream and consumer info of the two streams, the      nothing: reads every key of the
          oldest message of a subject (``baton inspect``)       namespace (inspect, trace, watch)
========  ====================================================  ==============================

Every role may publish JetStream API requests only for its own stream and consumers, and
subscribe only to its own reply inbox ``_INBOX.<role>.>`` (see :meth:`Bus.connect`), so
one role cannot read another's deliveries. Hands cannot publish wakes, nor pull from or ack
the wake stream; Brains cannot pull tool messages; nobody but the relay publishes work.

Redis ACLs bound the commands and keys of a role; a Lua function runs with its caller's
permissions on every key and command it touches (Redis 7 checks each command it calls).
Roles run Baton's scripts as functions of a library the admin loads (``FCALL``; no role may
``EVAL`` Lua of its own or load functions, see baton.store.scripts), and ACLs cannot restrict
*which* function a user calls, so the key patterns are the confinement: read-only (``%R~``)
/ write-only (``%W~``) patterns give each role exactly the keys it owns
(docs/threat-model.md). A script declares every key it touches (so a Redis Cluster slot in
migration redirects it before it runs, see baton.store.scripts.script_keys), and ``FCALL``
needs read and write access to each declared key: a selector grants ``FCALL`` alone on the
keys a role's scripts declare (:func:`_fcall_selector`). It grants nothing inside a function
(Lua cannot call ``FCALL``): every command the function calls is still checked against the
role's own patterns. The fences in the scripts keep a role from taking over work of its own
kind that is not its own.
"""

from __future__ import annotations

import re
from typing import Literal

from baton.bus.subjects import BusNames
from baton.errors import ValidationError

__all__ = [
    "ROLES", "SESSION_GRANT", "Role", "helm_users_block", "nats_permissions",
    "nats_users_config", "nats_users_file", "redis_acl", "redis_acl_file", "with_helm_users",
]

Role = Literal["relay", "brain", "hands", "client", "operator"]
ROLES: tuple[Role, ...] = ("relay", "brain", "hands", "client", "operator")

# Redis commands by purpose. Lua scripts need the commands they call (see shared/lua).
# CLIENT SETINFO (Redis >= 7.2) is left out: redis-py ignores its refusal.
# info: every process checks at start that Redis will never evict keys (store/capacity.py)
# No SELECT: key patterns name keys, not databases, so a role allowed SELECT would reach the
# same names in every database (another tenant's, were tenants kept apart by database).
_CONNECT = ["ping", "hello", "auth", "client|id", "quit", "reset", "info"]
# WAIT: in cluster mode a transition is acknowledged once a replica has it (store/replication.py).
# FCALL, not EVAL: the scripts are a function library the admin loads (baton.store.scripts);
# a role runs those functions and no Lua of its own, so a flaw in Redis' Lua sandbox is out
# of reach of a stolen role credential.
_SCRIPTS = ["fcall", "multi", "exec", "discard", "time", "wait"]
_ANNOUNCE = ["hset", "hdel", "xadd"]  # per-shard workers liveness and dead-letter records
# hlen/hgetall: the applied commit ids of a session (see store/lua/_applied.lua; their
# PEXPIRE is granted on that key alone, see _scoped); type: every script first checks the
# types of the session keys (corrupt_refusal, _lib.lua).
_SESSION_WRITES = ["hget", "hmget", "hexists", "hincrby", "exists", "type", "zadd", "zrem",
                   "hlen", "hgetall",
                   "hrandfield"]  # the commit-id wrapper's sample of old records (_applied.lua)
# What tool_limit.lua runs on a tool's limit keys (a Hands' selector: those keys only).
_LIMIT_COMMANDS = ("zremrangebyscore", "zscore", "zadd", "zcard", "zrange", "zrank",
                   "zrem", "hget", "hset", "hdel", "incr", "get", "set", "pexpire")
# What model_limit.lua runs on a model budget's keys (a Brain's selector: those keys only).
_BUDGET_COMMANDS = ("type", "zremrangebyscore", "zscore", "zadd", "zcard", "zrange", "zrank",
                    "zrem", "hget", "hset", "hdel", "incr", "get", "set", "del", "pexpire")
# get/del: the nudge (a tool result or a timer arrived; release and acquire clear it); its
# SET is granted on the nudge alone (see _scoped).
_REDIS_COMMANDS: dict[Role, list[str]] = {
    # ssubscribe: the Brain's hold channels (baton.brain.held); zscan: a quarantine drops
    # its timers
    # xrevrange, zremrangebyscore: archival (archive.lua checks the newest receipt and
    # trims the shard's archived index)
    "brain": [*_SESSION_WRITES, "rpush", "hgetall", "llen", "lrange", "xrange", "zrange",
              "spublish", "zscan", "get", "del", "hkeys", "ssubscribe", "sunsubscribe",
              "xrevrange", "zremrangebyscore",
              "zpopmin", "zrangebyscore"],  # admitted.lua: the next in line, the overdue
    # spublish: a result's signal to the Brain holding its session (complete.lua); xrevrange:
    # a receipt's id follows the newest of every role's receipts (receipt_id, _lib.lua)
    "hands": [*_SESSION_WRITES, "hgetall", "spublish", "xrevrange"],
    # xrange: the oldest outbox row's age (the backlog metrics, Outbox.backlog)
    "relay": ["xreadgroup", "xack", "xdel", "xautoclaim", "xgroup|create", "xlen", "xpending",
              "xrange", "xrevrange", "zrange", "zadd", "zrem", "exists", "hget", "hmget", "hgetall",
              "hvals", "hkeys", "hexists", "scan",  # the last four: the inbox sweep
              "get",  # a session's nudge: whether its deadline's last wake was taken
              "zscore"],  # a new session waiting for admission is not swept as lost
    "client": [*_SESSION_WRITES, "rpush", "hgetall", "hlen", "hkeys", "llen", "lrange",
               "xrange", "xrevrange", "xread", "xlen", "zrange", "zrevrange", "zcard", "zscore",
               "type", "ssubscribe", "sunsubscribe",
               "client|setname"],  # baton watch names its connection
    # The read-only views: read commands (``+@read -@dangerous``, see redis_acl), the
    # transactions ``baton watch`` reads its snapshot in, the name it gives its connection
    # and the server's time; no script, no write.
    "operator": ["multi", "exec", "discard", "client|setname",
                 "time"],  # baton health: an announcement's age on the server's clock
}


#: The session keys a Brain writes (see baton.store.keys): all but the Hands' run records.
BRAIN_SESSION_KEYS = ("meta", "entries", "tasks", "done", "docs", "subs", "reqs", "intents",
                      "inbox", "runs_done", "receipts", "applied", "nudge", "poison", "archived")

#: A client grant: session ids matching this glob (``*`` = every session of the namespace).
#: Session ids hold no ``{`` or ``}`` (:data:`~baton.store.keys.SESSION_ID`), so in
#: ``<ns>:{<ns>-*}:s:<grant>`` the first ``*`` can only match a shard number and the grant
#: applies to the session id alone.
SESSION_GRANT = re.compile(r"^[A-Za-z0-9_.:-]{0,120}\*?$")


def _redis_keys(role: Role, ns: str, sessions: str) -> list[str]:
    """Key patterns of a role: ``~`` read and write, ``%R~`` read only, ``%W~`` write only.

    Every command a script calls is checked against these patterns, so they are what bounds
    the scripts too (the keys a script declares are granted to FCALL alone, see
    :func:`_fcall_selector`).
    """
    tag = f"{ns}:{{{ns}-*}}"
    # Liveness records and dead letters: each role appends only to its own (keys per role,
    # see baton.store.keys.LOG_ROLES) and reads every role's liveness (relays count each
    # other, a client warns when no Brain serves an agent).
    shard_logs = ([f"~{tag}:dead:{role}", f"~{tag}:workers:{role}"] if role != "client"
                  else []) + [f"%R~{tag}:workers:*"]
    if role == "relay":
        # Shard outboxes, wakes, timers and leases; reads a session's wake subject (its
        # meta) and sets its nudge when a timer fires (and reads it: a deadline's wake no
        # Brain took yet is not sent twice, fire_timers.lua); reads whether requests wait in its
        # inbox and whether it is quarantined (the inbox sweep), and lists a session its
        # first request may open in the shard's index and the sessions whose request wakes
        # it published in the set the sweep reads; nothing else of a session. Reads the
        # admission counts per tenant (adm) for the baton.backlog gauge.
        return [f"~{tag}:outbox", f"~{tag}:wakes", f"~{tag}:timers", f"~{tag}:relay",
                f"~{tag}:full",
                f"~{tag}:sessions", f"~{tag}:requested", f"%R~{tag}:adm_q", f"%R~{tag}:adm",
                f"%R~{tag}:s:*:meta", f"%R~{tag}:s:*:inbox", f"%R~{tag}:s:*:poison",
                f"~{tag}:s:*:nudge",
                *shard_logs]
    if role == "hands":
        # Reads everything; writes the run records (claims, heartbeats, results), their
        # commit ids and its own receipts stream, the nudge and the shard's wakes stream:
        # never meta, intents, entries, tasks, documents, submissions, applied runs, the
        # outbox, nor the Brains' or clients' receipts.
        return [f"%R~{ns}:*", f"~{tag}:s:*:runs", f"~{tag}:s:*:runs_applied",
                f"~{tag}:s:*:receipts_hands", f"~{tag}:s:*:nudge", f"~{tag}:wakes",
                *shard_logs]
    if role == "brain":
        # Every session key but the Hands' run records (runs, runs_applied), which it only
        # reads; the outbox and timers; reads the rest.
        own = [f"~{tag}:s:*:{k}" for k in BRAIN_SESSION_KEYS]
        # adm*: the shard's fair admission (a first wake received lets the next start).
        return [f"%R~{ns}:*", *own, f"~{tag}:outbox", f"~{tag}:timers",
                f"~{tag}:sessions", f"~{tag}:archived", f"~{tag}:adm*", *shard_logs]
    # client: reads the granted sessions; writes only their inbox (submit, start, cancel,
    # approve and reject requests), nudge and its own receipts stream (not the Brains' or
    # the Hands'), and appends to the shard's wakes
    # stream (the relay publishes a request's wake on the session's wake subject): write
    # only, since its rows name every session of the shard (their ids, request ids and
    # subjects), the other tenants' too: XADD needs write alone (the scripts declare the
    # key through the FCALL selector, which grants no read). No other shard-wide
    # key: the Brain lists a new session in the shard's index and arms its timers when it
    # takes the request up, and the relay's inbox sweep wakes a session whose request's
    # wake was lost. The Brain writes the session, its entries, tasks, submissions and
    # dispatches.
    own = [f"~{tag}:s:{sessions}:{k}"
           for k in ("inbox", "nudge", "receipts_client", "inbox_applied")]
    # full: a relay's mark that JetStream is full (submit.lua refuses new input then);
    # adm*: the shard's fair admission of new sessions, which a submission joins (its
    # queue names the waiting sessions of every tenant of the shard: docs/threat-model.md)
    return [f"%R~{tag}:s:{sessions}", *own, f"%W~{tag}:wakes", f"%R~{tag}:full",
            f"~{tag}:adm*", *shard_logs]


#: The key of the applied commit ids each role's scripts keep (store/lua/_applied.lua).
_APPLIED_KEY = {"brain": "applied", "hands": "runs_applied", "client": "inbox_applied"}


def _fcall_selector(role: Role, ns: str, sessions: str) -> str:
    """The selector letting a role's scripts declare the keys they touch (read-only ones
    included): ``FCALL`` alone, on the keys of the namespace's shards (a client: its granted
    sessions' and the shard keys its requests name: wakes, full, outbox)."""
    tag = f"{ns}:{{{ns}-*}}"
    if role == "client":
        keys = [f"~{tag}:s:{sessions}:*", f"~{tag}:wakes", f"~{tag}:full", f"~{tag}:outbox",
                f"~{tag}:adm*"]
    else:
        keys = [f"~{tag}:*"]
    return f"(+fcall {' '.join(keys)})"


def _scoped(role: Role, ns: str, sessions: str) -> list[str]:
    """Selectors granting SET and PEXPIRE on the one key each needs them for.

    A key pattern grants every command of the role on every key it matches: SET replaces a
    key of any type (a shard's wakes stream with a string stalls every shard its relay
    reads) and PEXPIRE deletes any key in time (a session's receipts), so neither is a root
    command. Each command a script calls is checked against the root rules and every
    selector, so these bound the scripts as they bound direct calls."""
    tag = f"{ns}:{{{ns}-*}}"
    grant = sessions if role == "client" else "*"
    out = []
    if role in _APPLIED_KEY:
        out.append(f"(+pexpire ~{tag}:s:{grant}:{_APPLIED_KEY[role]})")
    if role == "brain":
        # Archival (archive.lua) moves a settled session out of Redis: its tombstone
        # expires, and the other roles' records of it (the Hands' runs, the commit ids of
        # Hands and clients) are deleted with it. Delete only: a Brain still cannot write
        # a run record (restore.lua leaves the runs hash out: a settled session's records
        # there are applied runs the Hands had yet to drop).
        out.append(f"(+pexpire ~{tag}:s:*:archived)")
        theirs = ("runs", "runs_applied", "inbox_applied", "receipts_hands", "receipts_client")
        out.append(f"(+del {' '.join(f'~{tag}:s:*:{k}' for k in theirs)})")
        # Restoring an archived session (restore.lua) writes the Hands' and clients' receipts
        # back into their streams: XADD alone there (a Brain, which decides the session's
        # state, could forge them: see docs/threat-model.md).
        out.append(f"(+xadd ~{tag}:s:*:receipts_hands ~{tag}:s:*:receipts_client)")
        # The fleet-wide budgets of models (model_limit.lua, baton.store.budgets): these
        # commands on those keys alone.
        out.append(f"({' '.join('+' + c for c in _BUDGET_COMMANDS)} "
                   f"~{ns}:{{{ns}-model-*}}:*)")
    if role in ("hands", "client"):  # a result, a request: the Brain's nudge
        out.append(f"(+set ~{tag}:s:{grant}:nudge)")
    if role == "hands":
        # The fleet-wide slots and rates of capped tools (tool_limit.lua, baton.store.limits):
        # these commands on those keys alone.
        out.append(f"({' '.join('+' + c for c in _LIMIT_COMMANDS)} ~{ns}:{{{ns}-limit-*}}:*)")
    elif role == "relay":  # a fired timer
        out.append(f"(+set ~{tag}:s:*:nudge)")
        out.append(f"(+set ~{tag}:full)")  # JetStream full: clients refuse new input
    return out


def redis_acl(
    role: Role, namespace: str, password: str | None = None, *, sessions: str = "*"
) -> list[str]:
    """The ``ACL SETUSER <role>`` rules of a role (without the user name).

    ``password=None`` leaves the password out (e.g. for a users.acl template).
    ``sessions`` (clients only): the glob of session ids the client is granted, e.g.
    ``acme-*`` for one tenant; keys and settled channels of other sessions are refused.
    """
    if not SESSION_GRANT.match(sessions):
        raise ValidationError(
            f"invalid session grant {sessions!r}: letters, digits, '_.:-', optionally ending "
            "in '*'", grant=sessions[:128])
    rules = ["on", "resetkeys", "resetchannels", "-@all"]
    if password is not None:
        rules += ["resetpass", f">{password}"]
    if role == "operator":
        # Reads every key of the namespace and writes none: read commands only (SCAN and
        # ZSCAN included, KEYS, DEBUG and the like not), no EVAL/EVALSHA/FUNCTION/SCRIPT, no
        # write command, and read-only key patterns; the epoch is read like any other key.
        return [*rules, "+@read", "-@dangerous",
                *(f"+{c}" for c in [*_CONNECT, *_REDIS_COMMANDS[role]]), f"%R~{namespace}:*"]
    if role == "client":  # watch reads its sessions; no key listing outside the grant
        rules += ["+@read", "-@dangerous", "-scan", "-randomkey"]
    rules += [f"+{c}" for c in [*_CONNECT, *_SCRIPTS, *_ANNOUNCE, *_REDIS_COMMANDS[role]]]
    rules += _redis_keys(role, namespace, sessions)
    rules += _scoped(role, namespace, sessions)
    rules.append(_fcall_selector(role, namespace, sessions))
    # Every role reads the store's epoch and may write it once on a new store (see
    # baton.store.epoch): a selector grants GET/MGET/SETNX on the epoch keys and nothing
    # else. SETNX, not SET: with SET (NX or not, ACLs cannot tell) any role could replace
    # the epoch, and every worker of the namespace would stop as if the store were lost.
    rules.append(f"(+get +mget +setnx ~{namespace}:{{{namespace}-*}}:epoch)")
    # Commits announce settled submissions (SPUBLISH), clients wait for their own (SSUBSCRIBE):
    # sharded channels under the session's hash tag. A Hands' completion, and a client's
    # request, tell the Brain holding the session (SPUBLISH on the Brain's hold channel of
    # the shard, which it SSUBSCRIBEs to): a signal only makes that Brain recheck a session it
    # holds, so they may speak on any Brain's channel. Channel patterns grant publishing and
    # subscribing alike, so a client, which subscribes to its settled channels, gets the
    # hold ones (named ``held`` in Redis) in a selector with SPUBLISH alone: it cannot hear
    # a Brain's signals.
    held = f"&{namespace}:{{{namespace}-*}}:held:*"
    if role == "brain":
        rules += [f"&{namespace}:{{{namespace}-*}}:settled:*", held]
    elif role == "hands":
        rules.append(held)
    elif role == "client":
        rules += [f"&{namespace}:{{{namespace}-*}}:settled:{sessions}", f"(+spublish {held})"]
    return rules


def nats_permissions(role: Role, namespace: str) -> dict[str, dict[str, list[str]]]:
    """The ``permissions`` block of a role's NATS user (allow lists; deny is the default)."""
    names = BusNames(namespace)
    api = "$JS.API"
    if role == "client":
        return {"publish": {"deny": [">"]}, "subscribe": {"deny": [">"]}}
    if role == "operator":
        # ``baton inspect``'s cluster view (baton.bus.backlog): stream and consumer info and
        # the oldest message per subject; it publishes no work, creates and pulls from no
        # consumer, and subscribes to nothing but its replies.
        info = [f"{api}.INFO", f"{api}.STREAM.NAMES", f"{api}.STREAM.LIST"]
        for stream in (names.wake_stream, names.tool_stream):
            info += [f"{api}.STREAM.INFO.{stream}", f"{api}.STREAM.MSG.GET.{stream}",
                     f"{api}.CONSUMER.NAMES.{stream}", f"{api}.CONSUMER.LIST.{stream}",
                     f"{api}.CONSUMER.INFO.{stream}.*"]
        return {"publish": {"allow": info}, "subscribe": {"allow": ["_INBOX.operator.>"]}}
    publish = [f"{api}.INFO", f"{api}.STREAM.INFO.{names.wake_stream}",
               f"{api}.STREAM.INFO.{names.tool_stream}"]
    if role == "relay":
        # and their copies around a stream with no leader (baton.bus.fallback)
        publish += [f"{namespace}.wake.>", f"{namespace}.tool.>", f"{namespace}.fallback.>"]
        for stream in (names.wake_stream, names.tool_stream):
            publish += [f"{api}.STREAM.CREATE.{stream}", f"{api}.STREAM.UPDATE.{stream}",
                        # the Brains' and Hands' durable consumers (baton.bus.consumers)
                        f"{api}.CONSUMER.CREATE.{stream}.>", f"{api}.CONSUMER.INFO.{stream}.*"]
    else:
        # Wildcards match whole tokens only: any consumer of the role's own stream. No
        # CONSUMER.CREATE: a consumer's config says where the stream delivers (a push
        # consumer could route tool messages onto wake subjects), so a relay makes them,
        # asked on the role's own consumers subject (baton.bus.consumers).
        stream = names.wake_stream if role == "brain" else names.tool_stream
        publish += [
            f"{api}.CONSUMER.INFO.{stream}.*",
            f"{api}.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.ACK.{stream}.>",
            names.consumers_subject(role),
            # reading the stream around a consumer with no leader (baton.bus.fallback)
            f"{api}.DIRECT.GET.{stream}",
        ]
    subscribe = [f"_INBOX.{role}.>"]
    if role in ("brain", "hands"):  # the relay's copies around a stream with no leader
        subscribe.append(f"{namespace}.fallback.{'wake' if role == 'brain' else 'tool'}.>")
    if role == "brain":  # commits that arm timers notify the relays (baton.bus.timer_notify)
        publish.append(names.timers_subject)
        # and a model budget's slot freed, announced to the Brains waiting (brain.budget)
        budgets = f"{namespace}.budget.*"
        publish.append(budgets)
        subscribe.append(budgets)
    elif role == "relay":
        subscribe += [names.timers_subject, names.consumers_subject("brain"),
                      names.consumers_subject("hands")]
    if role == "hands":  # liveness: each Hands answers on its subject, asks its peers'
        live = f"{namespace}.live.hands.*"
        # and a capped tool's slot freed, announced to the Hands waiting (baton.store.limits)
        limits = f"{namespace}.limits.*"
        publish += [live, "_INBOX.hands.>", limits]
        subscribe += [live, limits]
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def allows_responses(role: Role) -> bool:
    """Whether the role's NATS user may answer the requests it receives (``allow_responses``:
    one reply per request, on the request's own reply subject): the relay answers the
    workers' consumer requests (baton.bus.consumers) on their private reply inboxes, which
    it may not publish on otherwise; a Brain or Hands tells the relay it took a copy sent
    around a stream without a leader (baton.bus.fallback)."""
    return role in ("relay", "brain", "hands")


def _quote(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def nats_users_config(
    namespace: str, passwords: dict[str, str], admin_password: str | None = None
) -> str:
    """A nats-server ``authorization { users = [...] }`` block for the given roles.

    ``passwords`` maps role to password; a value like ``$BRAIN_PASSWORD`` is written bare,
    so nats-server reads it from its environment (as the deploy files do). An ``admin``
    user without limits (for setup and administration; the read-only views have the
    ``operator`` role) is added when ``admin_password`` is given.
    """
    users = []
    if admin_password is not None:
        secret = admin_password if admin_password.startswith("$") else f'"{admin_password}"'
        users.append(f'    {{ user: "admin", password: {secret} }}')
    for role, password in passwords.items():
        perms = nats_permissions(role, namespace)  # type: ignore[arg-type]
        secret = password if password.startswith("$") else f'"{password}"'
        kinds = ",\n".join(
            f"        {kind}: {{ "
            + ", ".join(f"{k}: {_quote(v)}" for k, v in perms[kind].items()) + " }"
            for kind in ("publish", "subscribe")
        )
        if allows_responses(role):  # type: ignore[arg-type]
            kinds += ",\n        allow_responses: true"
        users.append(f'    {{ user: "{role}", password: {secret}, permissions: {{\n'
                     f"{kinds}\n    }} }}")
    return "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"


def nats_users_file(namespace: str) -> str:
    """``deploy/nats/users.conf``: the role users, passwords from the server's environment."""
    passwords: dict[str, str] = {role: f"${role.upper()}_NATS_PASSWORD" for role in ROLES}
    return (
        f'# Generated by `baton auth --namespace {namespace}`: one NATS user per\n'
        "# role; passwords come from the server's environment (see deploy/.env.example).\n"
        + nats_users_config(namespace, passwords, admin_password="$ADMIN_NATS_PASSWORD")
    )


HELM_BEGIN = "        # users:begin (generated by `baton auth`, like nats/users.conf)"
HELM_END = "        # users:end"


def helm_users_block(namespace: str) -> str:
    """The users of ``deploy/k8s/nats-values.yaml`` (the NATS Helm chart's ``merge``
    syntax, passwords from the pod's environment): the same permissions as users.conf."""
    lines = [HELM_BEGIN, "        - user: admin",
             "          password: << $ADMIN_NATS_PASSWORD >>"]
    for role in ROLES:
        perms = nats_permissions(role, namespace)
        lines += [f"        - user: {role}",
                  f"          password: << ${role.upper()}_NATS_PASSWORD >>",
                  "          permissions:"]
        for kind in ("publish", "subscribe"):
            rules = ", ".join(f"{k}: {_quote(v)}" for k, v in perms[kind].items())
            lines.append(f"            {kind}: {{{rules}}}")
        if allows_responses(role):
            lines.append("            allow_responses: true")
    return "\n".join([*lines, HELM_END]) + "\n"


def with_helm_users(values: str, namespace: str) -> str:
    """``values`` (nats-values.yaml) with its generated users block replaced."""
    start = values.index(HELM_BEGIN.split(" (")[0])  # the marker, whatever its note says
    end = values.index(HELM_END)
    return values[:start] + helm_users_block(namespace) + values[end + len(HELM_END) + 1:]


#: No connection can log in as ``default`` (off, no password): every client must AUTH as a
#: role. Its permissions are all the same: Redis replays the AOF as ``default``, and its
#: EXEC re-checks ACLs, so a ``default`` without permissions drops every transaction (all
#: script effects) at the next start, silently (redis/redis#14541).
DEFAULT_USER = "user default off resetpass ~* &* +@all"
DEFAULT_USER_NOTE = (
    "default: nobody can log in as it (off, no password); it keeps every permission because",
    "Redis replays the AOF as default and EXEC re-checks ACLs there: without them a restart",
    "drops every committed transaction (redis/redis#14541).",
)


def redis_acl_file(namespace: str, client_sessions: str = "*") -> str:
    """``deploy/redis/users.acl``: ``${ROLE_REDIS_PASSWORD}`` placeholders are filled in
    from the environment when the Redis container starts (deploy/redis/start.sh).

    ``client_sessions``: the session ids the ``client`` user is granted (see
    :func:`redis_acl`); more clients with narrower grants are added the same way."""
    grant = "" if client_sessions == "*" else f" --client-sessions '{client_sessions}'"
    lines = [
        f"# Generated by `baton auth --namespace {namespace}{grant}`: one Redis ACL "
        "user per",
        "# role. start.sh drops these comments and fills in the ${ROLE_REDIS_PASSWORD} values.",
        *[f"# {line}" for line in DEFAULT_USER_NOTE],
        DEFAULT_USER,
        "user admin on ~* &* +@all >${ADMIN_REDIS_PASSWORD}",
    ]
    for role in ROLES:
        rules = " ".join(redis_acl(role, namespace, sessions=client_sessions))
        lines.append(f"user {role} {rules} >${{{role.upper()}_REDIS_PASSWORD}}")
    return "\n".join(lines) + "\n"



if __name__ == "__main__":  # the older way in, which no longer does anything here
    import sys

    sys.exit("error: `python -m baton.auth` is now `baton auth` (see `baton auth --help`)")
