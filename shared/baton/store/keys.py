"""Every Redis key name Baton uses, in one place.

A session lives on one of ``settings.shards`` shards. All keys of the session *and* its
shard's outbox stream and timer set share one hash tag, ``{<ns>-<shard>}``, so every
transition is one Lua script on one Redis Cluster slot. Layout (``T`` = the hash tag)::

    <ns>:T:s:<sid>:meta      HASH   agent, compat, fence, holder, lease_until, seq, dirty, created,
                                    handed (the fence that last handed the session over),
                                    cancel:<task id|*> intents, blocked:<task id> reasons
    <ns>:T:s:<sid>:entries   LIST   entry JSON, append-only; the index is the entry's position
    <ns>:T:s:<sid>:tasks     HASH   task id -> task JSON (live tasks)
    <ns>:T:s:<sid>:done      HASH   task id -> task JSON (terminal tasks, moved out of the live set)
    <ns>:T:s:<sid>:docs      HASH   per document: head, baseline, deltas (baton.store.documents)
    <ns>:T:s:<sid>:subs      HASH   submission id -> submission JSON
    <ns>:T:s:<sid>:reqs      HASH   client request id -> submission id (idempotent submit),
                                    "task:<request id>" -> task id (idempotent start)
    <ns>:T:s:<sid>:intents   HASH   the Brain's side of live runs (only Brains, and a person's
                                    approval or rejection, write it; the Hands read it):
                                    run id -> committed intent; "<run id>.<f>" for f in
                                    state.BRAIN_RUN_FIELDS: status (dispatched |
                                    awaiting_approval, or completed with result and completed
                                    ms for a run ended without the Hands), cancel (ms the Brain
                                    asked it to stop), digest (what an approval must present),
                                    approved (ms); "grp:<group>" -> results the group awaits;
                                    "gc" -> applied runs and groups whose records in the runs
                                    hash the Hands may drop
    <ns>:T:s:<sid>:runs      HASH   the Hands' side: "<run id>.<f>" for the attempt fields of
                                    RUN_FIELDS (status running | completed, attempt, accepted,
                                    heartbeat, worker, result, completed, attempts),
                                    "grp:<group>" -> results of the group so far; Brains only
                                    read it
    <ns>:T:s:<sid>:inbox     HASH   a client's requests the Brain has not consumed yet:
                                    "cancel:<task id|*>" -> ms (or JSON {at, reason}),
                                    "decide:<run id>" -> JSON {decision, ms, result},
                                    "submit:<request id>" and
                                    "start:<request id>" -> JSON {agent, compat, wake, ...}
                                    (written by clients, consumed by the Brain's commit; a
                                    Brain's lease opens a session that has only requests)
    <ns>:T:s:<sid>:nudge     STRING "1" once a tool result or a request arrived for the
                                    holder, a timer's firing time (ms) once a timer did (the
                                    dirty mark of those who may not write meta)
    <ns>:T:s:<sid>:runs_done HASH   same layout, runs whose result was applied
    <ns>:T:s:<sid>:receipts  STREAM the Brains' receipts: one entry per commit, lease or refused
                                    write (a session written before per-role streams has
                                    every role's receipts here)
    <ns>:T:s:<sid>:receipts_hands   STREAM the Hands' receipts (claims, results, refusals)
    <ns>:T:s:<sid>:receipts_client  STREAM the clients' receipts (submit, start, cancel,
                                    approve, reject); each role's ACL appends only to its own
                                    stream, and the ids of the three are one order (receipt_id
                                    in lua/_lib.lua): readers merge them by id
                                    (:meth:`SessionKeys.receipt_streams`)
    <ns>:T:s:<sid>:applied   HASH   commit id -> reply of a transition (retries in doubt apply
                                    once; expires, see lua/_applied.lua)
    <ns>:T:s:<sid>:archived  HASH   the tombstone of an archived session (lua/archive.lua):
                                    at, fence, seq, object, agent, compat, wake, created,
                                    summary; expires after tombstone_ttl_s. While it is there
                                    every session script refuses the session (ARCHIVED)
    <ns>:T:outbox            STREAM outbox rows of the shard (consumer group "relay"), written
                                    by Brains
    <ns>:T:wakes             STREAM wake rows written by Hands (a result arrived) and clients
                                    (a request waits), same fields; the relay publishes
                                    one only on its session's wake subject
    <ns>:T:timers            ZSET   "<kind>|<sid>|<id>|<wake subject>" scored by due time (ms);
                                    kinds: task (a sleeping task), deadline (progress),
                                    retain (a settled session's archival is due)
    <ns>:T:full              STRING why JetStream refuses the relay's messages (a stream is
                                    full); set by the relay for a few seconds at each refusal:
                                    submit.lua and start.lua refuse new input meanwhile
    <ns>:T:archived          ZSET   ids of the shard's archived sessions by archival time (ms),
                                    kept as long as their tombstones (lua/archive.lua)
    <ns>:T:epoch             STRING the store's epoch on this shard (baton.store.epoch)
    <ns>:T:sessions          ZSET   ids of the shard's sessions by creation time (inspect);
                                    written by the script that opens the session
    <ns>:T:requested         ZSET   sessions whose request wakes the relay published since
                                    its last inbox sweep (id -> ms); the sweep
                                    (arm_requests.lua) removes those it looked at
    <ns>:T:dead:<role>       STREAM dead letters recorded by services of one role (relay,
                                    brain, hands) whose session (or message id) hashes here;
                                    each keeps its share of the role's records
                                    (baton.store.deadletter.shard_cap)
    <ns>:T:workers:<role>    HASH   liveness of the services of one role whose name hashes
                                    here: each role writes only its own (its ACL), so no
                                    credential can forge or remove another role's records;
                                    a record silent past dead_worker_keep_s is deleted by a
                                    live worker of its role (baton.store.workers.prune_gone)
    <ns>:T:relay             HASH   the shard's relay lease: holder, fence, until (ms)
    <ns>:T:adm               HASH   fair admission of new sessions (lua/admitted.lua):
                                    pending (starting), V, vt:<tenant>, n, n:<tenant>
    <ns>:T:adm_info          HASH   a waiting or starting session -> its tenant and wake row
    <ns>:T:adm_fly           ZSET   starting sessions -> ms their first wake was written
    <ns>:T:adm_q             ZSET   queued sessions -> priority * 2^44 + start tag
    pub/sub (sharded): <ns>:T:settled:<sid>  settled submissions of a session (SPUBLISH)
                       <ns>:T:held:<brain>   tool results for the sessions of shard T a
                                    Brain holds (commit.lua 'hd', complete.lua)

A capped or rate-limited tool's fleet-wide limits (lua/tool_limit.lua), one hash tag per tool,
L = ``{<ns>-limit-<tool>}``:

    <ns>:L:slots             ZSET   run ids holding a slot -> until (ms, Redis clock)
    <ns>:L:waiting           ZSET   run ids waiting for a slot -> ticket (arrival order)
    <ns>:L:alive             HASH   run id waiting -> until (ms): a waiter gone is dropped
    <ns>:L:tickets           STRING the last ticket given
    <ns>:L:tat               STRING the rate's theoretical arrival time (ms, GCRA)

A budgeted model's fleet-wide budget (lua/model_limit.lua, baton.store.budgets), one hash tag
per model, M = ``{<ns>-model-<provider/model>}``:

    <ns>:M:slots             ZSET   calls holding a slot -> until (ms, Redis clock)
    <ns>:M:waiting           ZSET   calls waiting -> ticket (arrival order)
    <ns>:M:alive             HASH   call waiting -> until (ms): a waiter gone is dropped
    <ns>:M:tickets           STRING the last ticket given
    <ns>:M:rtat              STRING the requests' theoretical arrival time (ms, GCRA)
    <ns>:M:ttat              STRING the tokens' theoretical arrival time (ms, GCRA)
    <ns>:M:paused            STRING until when (ms) the provider asked the fleet to wait

There are no cluster-wide keys: the indexes a reader needs across the namespace (sessions,
dead letters, services) are split over the shards like everything else, so none of them
becomes one hot slot on a Redis Cluster; readers scan every shard (:meth:`Keys.every`).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Literal

from baton.errors import ValidationError

SESSION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_TOOL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as a tool's subject token (baton.bus.subjects)
# A model budget's key (baton.budgets.budget_key): no '{', '}' (a hash tag) nor glob characters
# (an ACL key pattern names these keys).
_MODEL = re.compile(r"^[A-Za-z0-9._:/@+-]{1,200}$")


def valid_model_key(model: str) -> bool:
    """Whether ``model`` may name a model budget's keys (:meth:`Keys.model_budget`)."""
    return bool(_MODEL.match(model))
RELAY_GROUP = "relay"

#: Fields of a tool run inside the ``runs`` hash, as ``<run id>.<field>``.
RUN_FIELDS = (
    "intent",  # JSON ToolIntent, written once by the Brain's commit
    "status",  # dispatched | awaiting_approval | running | completed
    "attempt",  # current attempt fence (0 = never claimed)
    "accepted",  # ms of the first accepted mark
    "completed",  # ms of the completed mark
    "applied",  # ms of the applied mark
    "heartbeat",  # ms of the current attempt's last heartbeat
    "worker",  # worker of the current attempt
    "result",  # JSON ToolResult
    "attempts",  # JSON list of finished attempt summaries (appended by Lua as text)
    "cancel",  # ms the Brain asked the run to stop (intents hash while live; its heartbeat
    # answers "cancelled")
    "digest",  # arguments digest an approval must present (intents hash while live)
    "approved",  # ms of the approval that dispatched it
)


#: The roles that write receipts, each to a stream of its own (SessionKeys.receipt_streams).
ReceiptRole = Literal["brain", "hands", "client"]

#: The roles that keep liveness records and dead letters, each in keys of its own.
LOG_ROLES = ("relay", "brain", "hands")


def _log_role(role: str) -> str:
    if role not in LOG_ROLES:
        raise ValueError(f"no liveness or dead-letter keys for role {role!r}")
    return role


def check_session_id(session_id: str) -> str:
    if not SESSION_ID.match(session_id):
        raise ValidationError(
            f"invalid session id {session_id!r}: 1-128 characters of letters, digits, '_.:-'",
            session_id=session_id[:128],
        )
    return session_id


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session plus the shard keys its commits write to."""

    session_id: str
    shard: int
    meta: str
    entries: str
    tasks: str
    done: str
    docs: str
    subs: str
    reqs: str
    runs: str
    runs_done: str
    receipts: str
    outbox: str
    timers: str
    applied: str

    @property
    def poison(self) -> str:
        """HASH of the session's undecodable-state failures and its quarantine (poison.lua);
        apart from the 13 script keys, so a session too corrupt to run can still be marked."""
        return self.meta.removesuffix("meta") + "poison"
    sessions: str

    @property
    def archived(self) -> str:
        """HASH: the tombstone of the session once archived (lua/archive.lua)."""
        return self.meta.removesuffix("meta") + "archived"

    @property
    def intents(self) -> str:
        """HASH run id -> committed intent of a live run (written by the Brain only)."""
        return self.meta.removesuffix("meta") + "intents"

    @property
    def inbox(self) -> str:
        """HASH of a client's requests to the Brain (``cancel:<target>``, ``decide:<run>``):
        the one session key a client's cancel or decision writes; the Brain consumes them
        in its commit."""
        return self.meta.removesuffix("meta") + "inbox"

    @property
    def nudge(self) -> str:
        """STRING set by a tool result or a timer: work arrived for the lease holder."""
        return self.meta.removesuffix("meta") + "nudge"

    @property
    def receipts_hands(self) -> str:
        """STREAM of the Hands' receipts (only the Hands' ACL user may append to it)."""
        return self.meta.removesuffix("meta") + "receipts_hands"

    @property
    def receipts_client(self) -> str:
        """STREAM of the clients' receipts (only the client's ACL user may append to it)."""
        return self.meta.removesuffix("meta") + "receipts_client"

    def receipt_streams(self) -> tuple[tuple[ReceiptRole, str], ...]:
        """Each role's receipts stream, as ``(role, key)``: the role a receipt read from it
        is attributed to (:attr:`baton.receipts.Receipt.role`)."""
        return (("brain", self.receipts), ("hands", self.receipts_hands),
                ("client", self.receipts_client))

    @property
    def wakes(self) -> str:
        """The shard's stream of Hands' wake rows."""
        return self.outbox.removesuffix("outbox") + "wakes"

    def all(self) -> list[str]:
        """KEYS for the session scripts, in the order every script expects them."""
        return [
            self.meta,
            self.entries,
            self.tasks,
            self.done,
            self.docs,
            self.subs,
            self.reqs,
            self.runs,
            self.runs_done,
            self.receipts,
            self.outbox,
            self.timers,
            self.applied,
            self.sessions,
        ]


class Keys:
    """Key names for one namespace."""

    #: How many sessions' key sets :meth:`session` keeps (a worker asks for the same few
    #: sessions many times per step).
    CACHED_SESSIONS = 4096

    def __init__(self, namespace: str, shards: int) -> None:
        self.ns = namespace
        self.shards = shards
        self._sessions: dict[str, SessionKeys] = {}

    def shard_of(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % self.shards

    def every(self, name: str, role: str | None = None) -> list[str]:
        """The per-shard key ``name`` (``sessions``, ``dead``, ``workers``) of every shard;
        for the per-role logs (``dead``, ``workers``) every role's key of every shard, or
        only ``role``'s."""
        if name in ("dead", "workers"):
            roles = LOG_ROLES if role is None else (_log_role(role),)
            return [f"{self.ns}:{self.tag(s)}:{name}:{r}" for s in range(self.shards)
                    for r in roles]
        return [f"{self.ns}:{self.tag(s)}:{name}" for s in range(self.shards)]

    def sessions(self, shard: int) -> str:
        return f"{self.ns}:{self.tag(shard)}:sessions"

    def archived(self, shard: int) -> str:
        """The shard's archived sessions by archival time (ms), as long as their tombstones."""
        return f"{self.ns}:{self.tag(shard)}:archived"

    def full(self, shard: int) -> str:
        """STRING set by a relay while JetStream refuses its messages for want of room
        (expires within seconds unless set again): clients refuse new input meanwhile."""
        return f"{self.ns}:{self.tag(shard)}:full"

    def admission(self, shard: int) -> list[str]:
        """The shard's fair admission of new sessions (lua/admitted.lua, in the order it
        takes them): adm HASH, adm_info HASH, adm_fly ZSET, adm_q ZSET."""
        return [f"{self.ns}:{self.tag(shard)}:{k}" for k in ("adm", "adm_info", "adm_fly",
                                                              "adm_q")]

    def requested(self, shard: int) -> str:
        """The shard's sessions whose request wakes the relay published since its last inbox
        sweep (id -> ms published): what the sweep looks at instead of the keyspace."""
        return f"{self.ns}:{self.tag(shard)}:requested"

    def dead(self, about: str, role: str) -> str:
        """The dead-letter stream of ``role`` for a record about ``about`` (a session or
        message id)."""
        return f"{self.ns}:{self.tag(self.shard_of(about or '-'))}:dead:{_log_role(role)}"

    def workers(self, field: str) -> str:
        """The liveness hash a service's field (``role:name``) is announced in: its role's."""
        role = _log_role(field.partition(":")[0])
        return f"{self.ns}:{self.tag(self.shard_of(field))}:workers:{role}"

    def tool_limit(self, tool: str) -> list[str]:
        """A tool's limit keys (lua/tool_limit.lua), in the order the script takes them."""
        if not _TOOL.match(tool):
            raise ValidationError(f"invalid tool name {tool[:100]!r}", field="tool",
                                  value=tool[:100])
        base = f"{self.ns}:{{{self.ns}-limit-{tool}}}"
        return [f"{base}:{k}" for k in ("slots", "waiting", "alive", "tickets", "tat")]

    def model_budget(self, model: str) -> list[str]:
        """A model budget's keys (lua/model_limit.lua), in the order the script takes them;
        ``model`` is the budget's key, ``provider/model``."""
        if not _MODEL.match(model):
            raise ValidationError(f"invalid model budget key {model[:100]!r}", field="model",
                                  value=model[:100])
        base = f"{self.ns}:{{{self.ns}-model-{model}}}"
        return [f"{base}:{k}" for k in ("slots", "waiting", "alive", "tickets", "rtat", "ttat",
                                        "paused")]

    def relay_lease(self, shard: int) -> str:
        """The shard's relay lease (one slot with the outbox it guards)."""
        return f"{self.ns}:{self.tag(shard)}:relay"

    def tag(self, shard: int) -> str:
        return f"{{{self.ns}-{shard}}}"

    def outbox(self, shard: int) -> str:
        return f"{self.ns}:{self.tag(shard)}:outbox"

    def wakes(self, shard: int) -> str:
        return f"{self.ns}:{self.tag(shard)}:wakes"

    def timers(self, shard: int) -> str:
        return f"{self.ns}:{self.tag(shard)}:timers"

    def epoch(self, shard: int) -> str:
        """The shard's copy of the store epoch: on the slot of the shard's sessions, so it
        is lost exactly when they are."""
        return f"{self.ns}:{self.tag(shard)}:epoch"

    def settled_channel(self, session_id: str) -> str:
        """Sharded pub/sub channel announcing settled submissions of a session (for
        waiters): under the session's hash tag, so the commit SPUBLISHes on its own slot and
        only clients waiting on this session hear it."""
        return f"{self.ns}:{self.tag(self.shard_of(session_id))}:settled:{session_id}"

    def hold_channel(self, shard: int, brain: str) -> str:
        """Sharded pub/sub channel on which a completion tells Brain ``brain`` that a
        session of ``shard`` it holds has its results (``listening_holder`` in _lib.lua):
        one per Brain and shard, under the shard's hash tag, so a completion SPUBLISHes
        on its own slot. The stored name keeps the word ``held``."""
        return f"{self.ns}:{self.tag(shard)}:held:{brain}"

    def session(self, session_id: str) -> SessionKeys:
        """The keys of a session (cached: SessionKeys is immutable)."""
        sk = self._sessions.get(session_id)
        if sk is None:
            sk = self._session(session_id)
            if len(self._sessions) >= self.CACHED_SESSIONS:
                del self._sessions[next(iter(self._sessions))]  # the oldest entry
            self._sessions[session_id] = sk
        return sk

    def _session(self, session_id: str) -> SessionKeys:
        check_session_id(session_id)
        shard = self.shard_of(session_id)
        base = f"{self.ns}:{self.tag(shard)}:s:{session_id}"
        return SessionKeys(
            session_id=session_id,
            shard=shard,
            meta=f"{base}:meta",
            entries=f"{base}:entries",
            tasks=f"{base}:tasks",
            done=f"{base}:done",
            docs=f"{base}:docs",
            subs=f"{base}:subs",
            reqs=f"{base}:reqs",
            runs=f"{base}:runs",
            runs_done=f"{base}:runs_done",
            receipts=f"{base}:receipts",
            outbox=self.outbox(shard),
            timers=self.timers(shard),
            applied=f"{base}:applied",
            sessions=self.sessions(shard),
        )
