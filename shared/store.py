"""The session store on Redis: every state transition is one fenced Lua script.

``Store`` owns the session-side transitions (submit, lease, load, commit) and the tool-run
transitions of Hands (claim, heartbeat, complete). The relay's outbox and timer operations
live in :mod:`shared.outbox`. Each method is one round trip.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

from shared.documents import documents_from_hash
from shared.errors import (
    BatonError,
    ConfigError,
    NotFoundError,
    PayloadTooLarge,
    RedisUnavailable,
    from_redis_error,
)
from shared.keys import RUN_FIELDS, Keys, SessionKeys
from shared.models import (
    Document,
    Entry,
    MarkRef,
    Receipt,
    SessionMeta,
    Submission,
    Task,
    ToolIntent,
    ToolResult,
    ToolRun,
    WorkerRef,
    decode,
    dumps,
    loads,
)
from shared.scripts import Scripts
from shared.settings import Settings
from shared.tracing import (
    counted_refusals,
    traced_claim,
    traced_commit,
    traced_complete,
    traced_lease,
    traced_submit,
)
from shared.writes import Writes


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def connect_redis(settings: Settings, *, socket_timeout: float | None = 10.0) -> Redis:
    """A client that fails fast and never retries on its own.

    Automatic retries are off on purpose: re-sending a commit whose reply was lost could
    apply it twice. Callers decide what is safe to retry (submit is idempotent, a Brain
    re-acquires and reloads, a Hands attempt re-checks its run).

    The pool is a blocking one: past ``redis_max_connections`` a caller waits for a free
    connection (up to the connect timeout) instead of failing at once, as a burst of
    concurrent tool runs and heartbeats would otherwise make it.
    """
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_max_connections,
        timeout=max(settings.connect_timeout_s, 5.0),
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
        **_tls_options(settings),
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def _tls_options(settings: Settings) -> dict[str, Any]:
    """TLS files for a ``rediss://`` URL (a CA bundle, and a client cert for mutual TLS)."""
    s = settings
    files = {"ssl_ca_certs": s.redis_tls_ca, "ssl_certfile": s.redis_tls_cert,
             "ssl_keyfile": s.redis_tls_key}
    if not s.redis_url.startswith("rediss://"):
        if any(files.values()):
            raise ConfigError("BATON_REDIS_TLS_* is set but BATON_REDIS_URL is not rediss://")
        return {}
    return {k: v for k, v in files.items() if v}


def redis_user(settings: Settings) -> str:
    """The ACL user of the Redis URL ("default" when none is named)."""
    return urlsplit(settings.redis_url).username or "default"


def worker_ref(role: str, name: str) -> WorkerRef:
    return WorkerRef(role=role, name=name, pid=os.getpid())


@dataclass(frozen=True, slots=True)
class Lease:
    session_id: str
    fence: int
    takeover: bool
    previous_holder: str


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of a Hands claim (see claim.lua)."""

    status: Literal["claimed", "busy", "done", "gone"]
    attempt: int = 0
    previous_attempt: int = 0
    previous_status: str = ""
    intent: ToolIntent | None = None
    previous_worker: str = ""
    holder: str = ""
    remaining_ms: int = 0
    cancelled: bool = False  # the Brain asked the run to stop: complete it as cancelled

    @property
    def recovering(self) -> bool:
        """An earlier attempt ended without a result: the replay policy decides."""
        return self.status == "claimed" and self.previous_attempt > 0


@dataclass(frozen=True, slots=True)
class Partial:
    """Text a model was streaming when the last partial commit saved it (partial.lua)."""

    task_id: str
    request_id: str
    text: str


class Entries(Sequence[Entry]):
    """A page of entries, each decoded only when read: most steps never look at them.

    A Brain step that applies tool results or marks a phase running does not need the
    conversation; the model request that does pays for exactly what it reads.
    """

    def __init__(self, raw: Iterable[str | Entry] = ()) -> None:
        self._items: list[str | Entry] = list(raw)

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Entry: ...
    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._items)))]
        item = self._items[index]
        if isinstance(item, str):
            item = self._items[index] = decode(Entry, item)
        return item

    def extend(self, entries: Iterable[Entry]) -> None:
        self._items.extend(entries)

    def append(self, entry: Entry) -> None:
        self._items.append(entry)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Entries({len(self._items)})"


@dataclass
class SessionState:
    """A session's live state as one consistent snapshot."""

    meta: SessionMeta
    tasks: dict[str, Task] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)
    submissions: dict[str, Submission] = field(default_factory=dict)
    runs: dict[str, ToolRun] = field(default_factory=dict)
    entry_count: int = 0
    entries: Entries = field(default_factory=lambda: Entries())  # the newest page

    @property
    def entries_start(self) -> int:
        return self.entry_count - len(self.entries)


def parse_runs(fields: dict[str, str]) -> dict[str, ToolRun]:
    grouped: dict[str, dict[str, str]] = {}
    for name, value in fields.items():
        rid, _, f = name.rpartition(".")
        grouped.setdefault(rid, {})[f] = value
    runs = {}
    for rid, f in grouped.items():
        if "intent" not in f:
            continue
        runs[rid] = ToolRun(
            intent=decode(ToolIntent, f["intent"]),
            status=f.get("status", "dispatched"),  # type: ignore[arg-type]
            attempt=int(f.get("attempt", 0)),
            accepted_ms=_int(f.get("accepted")),
            completed_ms=_int(f.get("completed")),
            applied_ms=_int(f.get("applied")),
            heartbeat_ms=_int(f.get("heartbeat")),
            worker=f.get("worker"),
            result=decode(ToolResult, f["result"]) if f.get("result") else None,
            attempts=tuple(loads(f["attempts"])) if f.get("attempts") else (),
            cancel_ms=_int(f.get("cancel")),
            approved_ms=_int(f.get("approved")),
        )
    return runs


def parse_meta(session_id: str, m: dict[str, str]) -> SessionMeta:
    return SessionMeta(
        session_id=session_id,
        agent=m["agent"],
        compat=int(m["compat"]),
        wake_subject=m["wake"],
        fence=int(m.get("fence", 0)),
        holder=m.get("holder", ""),
        lease_until_ms=int(m.get("lease_until", 0)),
        seq=int(m.get("seq", 0)),
        dirty=m.get("dirty") == "1",
        created_ms=int(m.get("created", 0)),
        groups={k[4:]: int(v) for k, v in m.items() if k.startswith("grp:")},
        cancels=tuple(sorted(k[7:] for k in m if k.startswith("cancel:"))),
        blocked={k[8:]: v for k, v in m.items() if k.startswith("blocked:")},
    )


def parse_receipt(stream_id: str, f: dict[str, str]) -> Receipt:
    data = loads(f.get("data") or "{}")
    known = {k: data.pop(k) for k in ("marks", "changes", "detail", "trace") if k in data}
    detail = {**data, **known.get("detail", {})}
    # A commit's step (prepare, tools, apply, final, redispatch ...) rides in its data.
    step = detail.pop("kind", None)
    if step and f.get("kind") == "commit":
        detail["step"] = step
    kind = f.get("kind", "")
    worker = loads(f["worker"]) if f.get("worker", "").startswith("{") else None
    marks = list(known.get("marks", []))
    if kind in ("claim", "reclaim") and detail.get("accepted_mark") == 1:
        marks.append({"run_id": detail["run_id"], "mark": "accepted", "attempt": detail["attempt"]})
    return Receipt(
        seq=int(f.get("seq", 0)),
        ts_ms=int(f.get("ts", 0)),
        kind=kind,
        worker=WorkerRef(**worker) if worker else None,
        fence=int(f.get("fence", 0)),
        marks=tuple(MarkRef(**m) for m in marks),
        changes=known.get("changes", {}),
        detail={"stream_id": stream_id, **detail},
        trace=known.get("trace", {}),
    )


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


class Store:
    """Session and tool-run transitions. One instance per process; safe for concurrent use."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.namespace, settings.shards)
        # A named ACL user may lack a command a script runs later: check before writing.
        self.scripts = Scripts(redis, acl_checks=redis_user(settings) != "default")

    @classmethod
    async def connect(cls, settings: Settings) -> Store:
        """Connect and check the server answers; ``RedisUnavailable`` within the timeout."""
        redis = connect_redis(settings)
        store = cls(redis, settings)
        try:
            await redis.ping()
        except (AuthenticationError, NoPermissionError) as exc:
            await redis.aclose()
            raise from_redis_error(exc, role=redis_user(settings)) from None
        except (RedisError, OSError) as exc:
            await redis.aclose()
            raise RedisUnavailable(
                f"cannot reach Redis at {settings.redis_url}: {exc}", url=settings.redis_url
            ) from None
        return store

    async def close(self) -> None:
        await self.redis.aclose()

    async def _run(self, script: str, sk: SessionKeys, args: list[Any], run_id: str = "") -> Any:
        try:
            return await getattr(self.scripts, script)(keys=sk.all(), args=args)
        except (RedisError, OSError) as exc:
            raise from_redis_error(
                exc, session_id=sk.session_id, run_id=run_id, role=redis_user(self.settings)
            ) from None

    def _check_size(self, payload: str | list[str], what: str) -> None:
        size = len(payload) if isinstance(payload, str) else sum(map(len, payload))
        if size > self.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"{what} is {size} bytes, over the {self.settings.max_payload_bytes} limit",
                size=size,
            )

    # ------------------------------------------------------------------ client side

    @traced_submit("submit")
    async def submit(
        self,
        session_id: str,
        *,
        agent: str,
        compat: int,
        wake_subject: str,
        request_id: str,
        text: str,
        task: Task,
        worker: WorkerRef,
        submission_id: str,
        headers: dict[str, str] | None = None,
    ) -> tuple[Submission, bool]:
        """Accept input once per request id; returns (submission, created).

        ``headers`` (trace context) go with the wake row and the receipt.
        """
        sk = self.keys.session(session_id)
        now = now_ms()
        sub = Submission(
            id=submission_id,
            session_id=session_id,
            request_id=request_id,
            agent=agent,
            text=text,
            task_id=task.id,
            created_ms=now,
        )
        entry = Entry(kind="user", text=text, submission_id=sub.id, task_id=task.id, ts_ms=now)
        self._check_size(entry.to_json(), "input")
        wake = dumps({"v": 1, "session_id": session_id, "reason": "submit"})
        receipt = dumps({"detail": {"submission_id": sub.id, "request_id": request_id,
                                    "task_id": task.id}, "changes": {"entries": 1, "tasks": 1},
                         "trace": headers or {}})
        created, raw = await self._run(
            "submit",
            sk,
            [session_id, agent, compat, wake_subject, request_id, sub.id, sub.to_json(),
             entry.to_json(), task.id, task.to_json(), wake, self.settings.progress_deadline_ms,
             worker.model_dump_json(), receipt, dumps(headers or {})],
        )
        await self.redis.zadd(self.keys.sessions, {session_id: now}, nx=True)
        return decode(Submission, raw), bool(created)

    @traced_submit("start")
    async def start_task(
        self,
        session_id: str,
        *,
        agent: str,
        compat: int,
        wake_subject: str,
        request_id: str,
        task: Task,
        worker: WorkerRef,
        headers: dict[str, str] | None = None,
    ) -> tuple[str, bool]:
        """Create a root task once per request id; returns (task id, created)."""
        sk = self.keys.session(session_id)
        self._check_size(task.to_json(), "task")
        wake = dumps({"v": 1, "session_id": session_id, "reason": "start"})
        receipt = dumps({"detail": {"task_id": task.id, "kind": task.kind,
                                    "request_id": request_id}, "changes": {"tasks": 1},
                         "trace": headers or {}})
        created, task_id = await self._run(
            "start",
            sk,
            [session_id, agent, compat, wake_subject, request_id, task.id, task.to_json(), wake,
             self.settings.progress_deadline_ms, worker.model_dump_json(), receipt,
             dumps(headers or {})],
        )
        await self.redis.zadd(self.keys.sessions, {session_id: now_ms()}, nx=True)
        return str(task_id), bool(created)

    async def task(self, session_id: str, task_id: str) -> Task:
        """A task, live or finished."""
        sk = self.keys.session(session_id)
        async with self.redis.pipeline(transaction=True) as p:
            p.hget(sk.tasks, task_id).hget(sk.done, task_id)
            live, done = await p.execute()
        if live is None and done is None:
            raise NotFoundError(f"no task {task_id} in session {session_id}",
                                session_id=session_id)
        return decode(Task, live or done)

    async def submission(self, session_id: str, submission_id: str) -> Submission:
        raw = await self.redis.hget(self.keys.session(session_id).subs, submission_id)
        if raw is None:
            raise NotFoundError(f"no submission {submission_id} in session {session_id}")
        return decode(Submission, raw)

    async def submission_for_request(self, session_id: str, request_id: str) -> Submission | None:
        sk = self.keys.session(session_id)
        sub_id = await self.redis.hget(sk.reqs, request_id)
        return await self.submission(session_id, sub_id) if sub_id else None

    # ------------------------------------------------------------------ Brain side

    async def acquire(self, session_id: str, worker: WorkerRef, ttl_ms: int) -> Lease:
        """Take the lease: ``LeaseBusyError`` while another live worker holds it."""
        sk = self.keys.session(session_id)
        fence, prev, takeover = await self._run(
            "acquire", sk, [worker.name, ttl_ms, worker.model_dump_json()]
        )
        return Lease(session_id, int(fence), bool(takeover), prev or "")

    @counted_refusals("renew")
    async def renew(
        self, session_id: str, fence: int, ttl_ms: int, worker: WorkerRef | None = None
    ) -> int:
        """Extend the lease; a stale holder gets ``StaleFenceError`` (and a receipt says so)."""
        args: list[Any] = [fence, ttl_ms]
        if worker is not None:
            args.append(worker.model_dump_json())
        return int(await self._run("renew", self.keys.session(session_id), args))

    async def release(self, session_id: str, fence: int, ttl_ms: int) -> bool:
        """Release the lease; True means work arrived meanwhile and the lease is kept."""
        sk = self.keys.session(session_id)
        return bool(await self._run("release", sk, [fence, ttl_ms]))

    async def load(self, session_id: str, *, page: int | None = None) -> SessionState:
        """A consistent snapshot of the live state and the newest page of entries."""
        sk = self.keys.session(session_id)
        try:
            async with self.redis.pipeline(transaction=True) as p:
                self._queue_load(p, sk, page)
                results = await p.execute()
        except (RedisError, OSError) as exc:
            raise from_redis_error(
                exc, session_id=session_id, role=redis_user(self.settings)
            ) from None
        return self._state(session_id, results)

    @traced_lease
    async def acquire_and_load(
        self, session_id: str, worker: WorkerRef, ttl_ms: int, *, page: int | None = None
    ) -> tuple[Lease, SessionState]:
        """Take the lease and load the state in one round trip (one MULTI/EXEC).

        The snapshot is taken right after the acquire, atomically, so it is exactly what the
        new fence holder may build on.
        """
        sk = self.keys.session(session_id)
        try:
            async with self.redis.pipeline(transaction=True) as p:
                await self.scripts.acquire(
                    keys=sk.all(), args=[worker.name, ttl_ms, worker.model_dump_json()], client=p
                )
                self._queue_load(p, sk, page)
                results = await p.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            raise from_redis_error(
                exc, session_id=session_id, role=redis_user(self.settings)
            ) from None
        if isinstance(results[0], Exception):
            raise from_redis_error(
                results[0], session_id=session_id, role=redis_user(self.settings)
            )
        fence, prev, takeover = results[0]
        lease = Lease(session_id, int(fence), bool(takeover), prev or "")
        return lease, self._state(session_id, results[1:])

    def _queue_load(self, p: Any, sk: SessionKeys, page: int | None) -> None:
        page = page or self.settings.entries_page
        p.hgetall(sk.meta).hgetall(sk.tasks).hgetall(sk.docs).hgetall(sk.subs)
        p.hgetall(sk.runs).llen(sk.entries).lrange(sk.entries, -page, -1)

    def _state(self, session_id: str, results: list[Any]) -> SessionState:
        for r in results:
            if isinstance(r, Exception):
                raise from_redis_error(r, session_id=session_id, role=redis_user(self.settings))
        meta, tasks, docs, subs, runs, count, entries = results
        if not meta:
            raise NotFoundError(f"no session {session_id}", session_id=session_id)
        return SessionState(
            meta=parse_meta(session_id, meta),
            tasks={k: decode(Task, v) for k, v in tasks.items()},
            documents=documents_from_hash(docs),
            submissions={k: decode(Submission, v) for k, v in subs.items()},
            runs=parse_runs(runs),
            entry_count=int(count),
            entries=Entries(entries),
        )

    async def entries(self, session_id: str, start: int = 0, stop: int = -1) -> list[Entry]:
        """Entries ``start..stop`` (inclusive, Redis LRANGE semantics)."""
        raw = await self.redis.lrange(self.keys.session(session_id).entries, start, stop)
        return [decode(Entry, e) for e in raw]

    @traced_commit
    async def commit(
        self, session_id: str, fence: int, writes: Writes, worker: WorkerRef
    ) -> tuple[int, int]:
        """Apply a write-set atomically under the fence; returns (seq, entry count)."""
        sk = self.keys.session(session_id)
        args = writes.to_script()
        self._check_size(args, "commit")
        seq, count = await self._run(
            "commit", sk, [fence, worker.model_dump_json(), session_id, *args]
        )
        return int(seq), int(count)

    async def save_partial(
        self, session_id: str, fence: int, worker: WorkerRef, *, task_id: str,
        request_id: str, text: str, delta: str,
    ) -> bool:
        """Save a streaming answer's text so far (partial.lua); False when the fence is stale.

        Losable by design: the caller drops a failure; the next commit clears the text.
        """
        sk = self.keys.session(session_id)
        receipt = dumps({"detail": {"task_id": task_id, "request_id": request_id,
                                    "delta": delta, "chars": len(text)}})
        saved = await self._run("partial", sk, [fence, worker.model_dump_json(), task_id,
                                                request_id, text, receipt])
        return bool(saved)

    async def partial(self, session_id: str) -> Partial | None:
        """The streamed text saved since the last commit, if any."""
        sk = self.keys.session(session_id)
        text, of = await self.redis.hmget(sk.meta, ["partial", "partial_of"])
        if of is None:
            return None
        task_id, _, request_id = of.partition(" ")
        return Partial(task_id=task_id, request_id=request_id, text=text or "")

    # ------------------------------------------------------------------ Hands side

    @traced_claim
    async def claim(
        self, session_id: str, run_id: str, worker: WorkerRef, *, delivery: int = 1
    ) -> Claim:
        sk = self.keys.session(session_id)
        r = await self._run(
            "claim",
            sk,
            [run_id, worker.name, self.settings.attempt_ttl_ms, worker.model_dump_json(), delivery],
            run_id,
        )
        status = r[0]
        if status == "claimed":
            return Claim(
                "claimed",
                attempt=int(r[1]),
                previous_attempt=int(r[2]),
                previous_status=r[3] or "",
                intent=decode(ToolIntent, r[4]),
                previous_worker=r[5],
                cancelled=len(r) > 6 and int(r[6]) == 1,
            )
        if status == "busy":
            return Claim("busy", holder=r[1], remaining_ms=int(r[2]))
        if status == "done":
            return Claim("done", previous_status=r[1])
        return Claim("gone")

    @counted_refusals("heartbeat")
    async def heartbeat(
        self, session_id: str, run_id: str, attempt: int, worker: WorkerRef | None = None
    ) -> bool:
        """True when the run was asked to stop (cancelled); raises ``StaleAttemptError``
        once the attempt is no longer current."""
        args: list[Any] = [run_id, attempt]
        if worker is not None:
            args.append(worker.model_dump_json())
        reply = await self._run("heartbeat", self.keys.session(session_id), args, run_id)
        return reply == "cancelled"

    @traced_complete
    async def complete(
        self,
        session_id: str,
        intent: ToolIntent,
        attempt: int,
        result: ToolResult,
        worker: WorkerRef,
        *,
        force_wake: bool = False,
        detail: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> bool:
        """Commit the result under the attempt fence; True when it woke the Brain."""
        sk = self.keys.session(session_id)
        payload = result.to_json()
        self._check_size(payload, "tool result")
        wake = dumps({"v": 1, "session_id": session_id, "reason": f"tool:{intent.run_id}"})
        receipt = dumps({
            "marks": [{"run_id": intent.run_id, "mark": "completed", "attempt": attempt}],
            "detail": {"run_id": intent.run_id, "tool": intent.tool, "outcome": result.outcome,
                       "recovery": result.recovery, "duration_ms": round(result.duration_ms, 1),
                       **(detail or {})},
            "trace": headers or {},
        })
        (woke,) = await self._run(
            "complete",
            sk,
            [intent.run_id, attempt, payload, worker.model_dump_json(), intent.group or "",
             "1" if force_wake or intent.wake_each else "0", wake, session_id, receipt,
             dumps(headers or {})],
            intent.run_id,
        )
        return bool(woke)

    async def run(self, session_id: str, run_id: str) -> ToolRun | None:
        """A tool run, live or applied, as a recovering worker or an operator sees it."""
        sk = self.keys.session(session_id)
        names = [f"{run_id}.{f}" for f in RUN_FIELDS]
        async with self.redis.pipeline(transaction=True) as p:
            p.hmget(sk.runs, names).hmget(sk.runs_done, names)
            live, done = await p.execute()
        for values in (live, done):
            if values[0] is not None:
                fields = {n: v for n, v in zip(names, values, strict=True) if v is not None}
                return parse_runs(fields)[run_id]
        return None

    async def applied_runs(self, session_id: str) -> dict[str, ToolRun]:
        return parse_runs(await self.redis.hgetall(self.keys.session(session_id).runs_done))

    async def finished_tasks(self, session_id: str) -> dict[str, Task]:
        raw = await self.redis.hgetall(self.keys.session(session_id).done)
        return {k: decode(Task, v) for k, v in raw.items()}

    async def receipts(
        self, session_id: str, after: str = "-", count: int = 10_000
    ) -> list[Receipt]:
        start = after if after == "-" else f"({after}"
        raw = await self.redis.xrange(self.keys.session(session_id).receipts, start, "+", count)
        return [parse_receipt(sid, f) for sid, f in raw]

    async def receipts_for(
        self, session_id: str, *, task_id: str | None = None, run_id: str | None = None
    ) -> list[Receipt]:
        """The session's receipts about one task (its commits and its runs) and/or one run."""
        return receipts_about(await self.receipts(session_id), task_id=task_id, run_id=run_id)


def receipts_about(
    receipts: list[Receipt], *, task_id: str | None = None, run_id: str | None = None
) -> list[Receipt]:
    """Filter a session's receipts to one task and/or one tool run."""
    if task_id is not None:
        runs = {rid for r in receipts if r.detail.get("task_id") == task_id
                for rid in r.detail.get("runs", ())}
        receipts = [r for r in receipts
                    if r.detail.get("task_id") == task_id or _runs_of(r) & runs]
    if run_id is not None:
        receipts = [r for r in receipts if run_id in _runs_of(r)]
    return receipts


def _runs_of(r: Receipt) -> set[str]:
    """The tool runs a receipt is about: its run, the runs it dispatched, the marks it wrote."""
    runs = {m.run_id for m in r.marks} | set(r.detail.get("runs", ()))
    if r.detail.get("run_id"):
        runs.add(str(r.detail["run_id"]))
    return runs


__all__ = [
    "BatonError", "Claim", "Lease", "Partial", "SessionState", "Store", "connect_redis", "now_ms",
    "receipts_about",
]
