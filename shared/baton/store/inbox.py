"""A session's inbox: the requests clients write into it, and what became of them.

A client never takes a lease. It requests input (:meth:`Inbox.submit`) or a root task
(:meth:`Inbox.start_task`) once per request id: one script writes the request into the
session's inbox with a wake for a Brain, and a Brain takes it up in its own fenced commit,
which deletes it from the inbox and writes the submission or the task atomically. The reads
here therefore look at both, so a request taken up between two reads never looks unknown.
A :class:`~baton.store.store.Store` holds one as ``store.inbox``.
"""

from __future__ import annotations

import hashlib
from typing import cast

from redis.asyncio import Redis

from baton.errors import not_found
from baton.models import Entry, Submission, Task, WorkerRef, decode, dumps, loads
from baton.observability.tracing import traced_submit
from baton.settings import Settings
from baton.store.admission import shard_window, weight_of
from baton.store.clock import now_ms
from baton.store.keys import Keys
from baton.store.scripts import ScriptRunner
from baton.store.state import parse_requests, pending_submission, pending_task

__all__ = ["Inbox"]


class Inbox:
    """The client side of the store: requests into a session's inbox, and their reads."""

    def __init__(
        self, redis: Redis, keys: Keys, settings: Settings, scripts: ScriptRunner
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self.scripts = scripts

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
        probe: bool = False,
        tenant: str = "default",
        priority: int = 3,
    ) -> tuple[Submission, bool]:
        """Request input once per request id; returns (submission, created).

        The request goes to the session's inbox (with a wake); a Brain takes it up in its
        fenced commit, opening a new session for ``agent``. The same request id with the
        same text answers the original submission, pending or taken up (created False);
        with another text it is a ``ConflictError`` (checked in the script, atomically).
        ``headers`` (trace context) go with the wake row and the receipt. ``probe``: a
        session Redis does not hold (no meta, no request waiting) is NotFoundError, nothing
        written (it may be archived, its tombstone expired: see ``Client.submit``).
        ``tenant`` and ``priority`` (1 first .. 5): the new session's place in the fair
        admission of new sessions, when the settings turn it on (baton.store.admission).
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
        entry_json, sub_json = entry.to_json(), sub.to_json()
        self.scripts.check_size(entry_json, "input")
        window, wake, receipt = self._opening(
            session_id, "submit", {"submission_id": sub.id, "request_id": request_id,
                                   "task_id": task.id}, headers, tenant, priority)
        created, raw, *_ = await self.scripts.run(
            "submit",
            sk,
            [session_id, agent, compat, wake_subject, request_id, sub.id, sub_json,
             entry_json, task.id, task.to_json(), wake, worker.model_dump_json(), receipt,
             dumps(headers or {}),
             hashlib.sha1(text.encode()).hexdigest(), "1" if probe else "",
             window, tenant, priority, weight_of(self.settings, tenant)],
        )
        self._probed(created, session_id)
        if created and raw == sub_json:  # recorded now: the script answers what it was given
            return sub, True
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
        probe: bool = False,
        tenant: str = "default",
        priority: int = 3,
    ) -> tuple[str, bool]:
        """Request a root task once per request id (taken up by a Brain, as a submission
        is); returns (task id, created). ``probe``, ``tenant``, ``priority``: as
        :meth:`submit`'s."""
        sk = self.keys.session(session_id)
        task_json = task.to_json()
        self.scripts.check_size(task_json, "task")
        window, wake, receipt = self._opening(
            session_id, "start", {"task_id": task.id, "kind": task.kind,
                                  "request_id": request_id}, headers, tenant, priority)
        created, task_id, *_ = await self.scripts.run(
            "start",
            sk,
            [session_id, agent, compat, wake_subject, request_id, task.id, task_json, wake,
             worker.model_dump_json(), receipt, dumps(headers or {}), "1" if probe else "",
             window, tenant, priority, weight_of(self.settings, tenant)],
        )
        self._probed(created, session_id)
        return str(task_id), bool(created)

    def _opening(self, session_id: str, reason: str, detail: dict[str, object],
                 headers: dict[str, str] | None, tenant: str, priority: int
                 ) -> tuple[int, str, str]:
        """The shard's admission window, the wake row and the receipt of a request that may
        open a session (submit.lua, start.lua). With a window, the wake's receipt lets the
        next new session of the shard start, and the receipt names the tenant and priority."""
        window = shard_window(self.settings)
        wake: dict[str, object] = {"v": 1, "session_id": session_id, "reason": reason}
        if window:
            wake["admitted"] = True
            detail = {**detail, "tenant": tenant, "priority": priority}
        receipt = dumps({"detail": detail, "changes": {}, "trace": headers or {}})
        return window, dumps(wake), receipt

    def _probed(self, reply: object, session_id: str) -> None:
        """A probing submit or start (submit.lua, start.lua) answers 2 when Redis has no
        such session: NotFoundError, nothing written."""
        if reply == 2:
            raise not_found(f"session {session_id}", namespace=self.keys.ns,
                            session_id=session_id)

    async def task(self, session_id: str, task_id: str) -> Task:
        """A task, live or finished."""
        sk = self.keys.session(session_id)
        async with self.redis.pipeline(transaction=True) as p:
            p.hget(sk.tasks, task_id)
            p.hget(sk.done, task_id)
            p.hgetall(sk.inbox)
            live, done, inbox = await p.execute()
        if live is None and done is None:
            if (pending := pending_task(inbox, task_id)) is not None:
                return pending  # requested, not taken up by a Brain yet
            raise not_found(f"task {task_id} in session {session_id}",
                            namespace=self.settings.namespace, session_id=session_id)
        return decode(Task, live or done)

    async def exists(self, session_id: str) -> bool:
        """The session is open (its meta exists) or a submit or start request for it waits
        in its inbox for a Brain to open it."""
        sk = self.keys.session(session_id)
        async with self.redis.pipeline(transaction=True) as p:
            p.exists(sk.meta)
            p.hgetall(sk.inbox)
            opened, inbox = await p.execute()
        return bool(opened) or bool(parse_requests(inbox))

    async def submission(self, session_id: str, submission_id: str) -> Submission:
        sk = self.keys.session(session_id)
        # Single commands (a cluster client follows a slot's move for those): the inbox is
        # read only when the submission is not there, i.e. not taken up yet.
        raw = await self.redis.hget(sk.subs, submission_id)
        if raw is None:
            # cast: connect_redis decodes replies, which redis-py's types cannot express
            inbox = cast(dict[str, str], await self.redis.hgetall(sk.inbox))
            if (pending := pending_submission(inbox, submission_id)) is not None:
                return pending  # requested, not taken up by a Brain yet
            raw = await self.redis.hget(sk.subs, submission_id)  # taken up in between
        if raw is None:
            raise not_found(f"submission {submission_id} in session {session_id}",
                            namespace=self.settings.namespace, session_id=session_id)
        return decode(Submission, raw)

    async def taken_up(self, submission: Submission, *, fresh: bool = False
                       ) -> Submission | None:
        """``submission`` as committed by a Brain, or None while its request still waits in
        the inbox (read without decoding the request); ``NotFoundError`` when neither.

        ``fresh``: just submitted, so most likely still waiting: the inbox is looked at
        first (one round trip then). The commit that takes a request up deletes it from the
        inbox and writes the submission atomically, so once the request is gone the
        submission is there."""
        sid = submission.session_id
        sk = self.keys.session(sid)
        request = f"submit:{submission.request_id}"
        if fresh and await self.redis.hexists(sk.inbox, request):
            return None
        raw = await self.redis.hget(sk.subs, submission.id)
        if raw is None and not fresh:
            if await self.redis.hexists(sk.inbox, request):
                return None
            raw = await self.redis.hget(sk.subs, submission.id)  # taken up in between
        if raw is None:
            raise not_found(f"submission {submission.id} in session {sid}",
                            namespace=self.settings.namespace, session_id=sid)
        return decode(Submission, raw)

    async def submission_for_request(self, session_id: str, request_id: str) -> Submission | None:
        sk = self.keys.session(session_id)
        # Both in one transaction: a Brain taking the request up between two separate reads
        # (the record written, the inbox entry removed) would make it look unknown.
        async with self.redis.pipeline(transaction=True) as p:
            p.hget(sk.reqs, request_id)
            p.hget(sk.inbox, f"submit:{request_id}")
            sub_id, pending = await p.execute()
        if sub_id:
            return await self.submission(session_id, sub_id)
        return decode(Submission, loads(pending)["sub"]) if pending else None
