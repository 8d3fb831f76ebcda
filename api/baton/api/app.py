"""The FastAPI application: the HTTP API under ``/v1``, its OpenAPI document, the console.

FastAPI because it derives the OpenAPI document (``/openapi.json``, browsable at ``/docs``)
from the same pydantic models the handlers validate requests with, and Baton's wire models
are pydantic already; it runs on uvicorn (:mod:`baton.api.server`).

Reads need a token with the ``read`` role, writes one with ``operate``
(:mod:`baton.api.auth`); every error is problem details (:mod:`baton.api.problems`). What a
web page may make a browser send is checked first (:mod:`baton.api.guard`: Host, Origin,
changes as JSON only, a Content-Security-Policy on every answer). ``/healthz`` says that the
process is alive, and only to a token holder anything more; ``/readyz`` whether the store
answers (the deployments' readiness probes).
Writes are the client's idempotent scripts: ``POST /v1/submissions`` and ``POST /v1/tasks``
take an ``Idempotency-Key`` header that becomes the request id, so a retried request answers
with the same submission (200) instead of creating another (201); without a session id the
session's id is derived from the key too. A key sent again with another request (other
text or agent; for a task, another kind or input) is refused (409), not answered with what
the first one made while the second request is silently dropped.

Reads fall through to the archive (:mod:`baton.store.archived`): an archived session is
shown as it was, marked (``archived`` and ``archived_ms`` in the views' JSON; a
``Baton-Archived`` header with the archival time on a submission or a task, whose bodies
are the wire models); the archive, ``Settings.archive_location()``, is opened when first
needed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, cast

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from baton.api import problems, views
from baton.api.auth import OPERATE, Tokens, caller_key
from baton.api.events import Slot, Watchers, receipt_order, stream_session
from baton.api.guard import SWAGGER_UI, Guard, allowed_hosts
from baton.client import Client
from baton.client.input import agent_for
from baton.errors import ConflictError, UnauthenticatedError
from baton.models import Submission, Task
from baton.observability.log import get_logger
from baton.settings import Settings
from baton.store.archived import ArchivedReads, SessionSource
from baton.store.redis_client import redis_user
from baton.store.store import Store, worker_ref

__all__ = ["create_app"]

log = get_logger("baton.api")

SessionId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\s/]+$")]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1,
                                              max_length=200)]
#: The header that marks a submission or task of an archived session: its archival time (ms).
ARCHIVED_HEADER = "Baton-Archived"
#: A receipt id: ASCII digits only (``\d`` would take other scripts' digits, which int()
#: reads as numbers too).
RECEIPT_ID = r"^[0-9]{1,20}-[0-9]{1,20}$"
#: Seconds a client refused a stream (too many open) is told to wait.
STREAMS_RETRY_AFTER_S = 5


def _role(request: Request) -> str:
    tokens: Tokens = request.app.state.tokens
    host = request.client.host if request.client is not None else None
    return tokens.role_of(request.headers.get("authorization"), host)


def _operator(request: Request) -> str:
    role = _role(request)
    Tokens.require(role, OPERATE, f"{request.method} {request.url.path}")
    return role


Read = Annotated[str, Depends(_role)]
Operate = Annotated[str, Depends(_operator)]


# ---------------------------------------------------------------------- request bodies


class SubmitRequest(BaseModel):
    text: str = Field(min_length=1, max_length=1_000_000, description="the user's input")
    agent: str = Field(min_length=1, max_length=200, description="the agent that answers")
    compat: int = Field(default=1, ge=1, le=1_000_000)
    session_id: str | None = Field(default=None, min_length=1, max_length=200,
                                   description="continue this session (default: a new one)")
    tenant: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description=(
        "whose work a new session is, for fair admission (default: the API's tenant)"))
    priority: int = Field(default=3, ge=1, le=5, description=(
        "a new session's admission priority: 1 first .. 5 last"))


class SubmitAnswer(BaseModel):
    created: bool
    submission: Submission
    warnings: list[str] = Field(default_factory=list, description=(
        "why the input may wait: no live Brain serves its agent at its level (it is kept "
        "and waits until one starts)"))


class StartRequest(BaseModel):
    kind: str = Field(min_length=1, max_length=200, description="the task definition's kind")
    input: dict[str, Any] = Field(default_factory=dict)
    agent: str | None = Field(default=None, min_length=1, max_length=200,
                              description="the agent whose Brains run it (default: the kind)")
    compat: int = Field(default=1, ge=1, le=1_000_000)
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    tenant: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description=(
        "whose work a new session is, for fair admission (default: the API's tenant)"))
    priority: int = Field(default=3, ge=1, le=5, description=(
        "a new session's admission priority: 1 first .. 5 last"))


class StartAnswer(BaseModel):
    created: bool
    session_id: str
    task_id: str
    warnings: list[str] = Field(default_factory=list, description=(
        "why the task may wait: no live Brain serves its agent at its level"))


class CancelRequest(BaseModel):
    task_id: str | None = Field(default=None, description="one task (default: the session)")
    reason: str = Field(default="", max_length=2_000)


class ApproveRequest(BaseModel):
    digest: str = Field(min_length=1, max_length=200,
                        description="the digest of the arguments approved (session view)")


class RejectRequest(BaseModel):
    reason: str = Field(default="", max_length=2_000)


class DecisionAnswer(BaseModel):
    run_id: str
    seq: int


# ---------------------------------------------------------------------- the app


def create_app(settings: Settings, tokens: Tokens, reads: Settings | None = None,
               host: str = "127.0.0.1") -> FastAPI:
    """The API and console over the stack ``settings`` names.

    ``reads``: the credential of the views that read across sessions (the session list,
    a session's detail, entries, trace, documents and tasks, dead letters, workers), where
    it differs from ``settings``': a client's ACL reads its granted sessions only and no
    shard-wide key, the operator's reads everything and writes nothing. ``host``: the
    address it is bound to, a name its requests' Host may carry (:mod:`baton.api.guard`)."""
    hosts = allowed_hosts(host, settings.api_hosts)
    watchers = Watchers(settings.api_max_streams, settings.api_max_streams_per_token)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["client"] = await Client.connect(settings)
        state["client"].warn_unserved = False  # the answers carry it (warnings)
        # Its commits (submit, approve, ...) name the API in the sessions' timelines.
        state["client"].worker = worker_ref("client", settings.worker_id("api"))
        state["reads"] = (await Store.connect(reads) if reads is not None
                          else state["client"].store)
        # Where the reads find archived sessions: the client's archive, opened when needed.
        state["archived"] = state["client"].archived.on(state["reads"])
        log.info("api_ready", namespace=settings.namespace, open=tokens.anonymous is not None,
                 reads_as=redis_user(reads or settings))
        try:
            yield
        finally:
            watchers.stop()
            await state["client"].close()
            if reads is not None:
                await state["reads"].close()

    app = FastAPI(title="Baton API", version="1",
                  summary="Submit, follow, decide and inspect durable agent sessions.",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.watchers = watchers
    app.state.tokens = tokens
    # A submission's text is at most a million characters (12 bytes each at worst, as a
    # JSON-escaped surrogate pair): a body over that is refused before it is read whole
    problems.install(app, max_body=12 * 1_000_000 + 64 * 1024)
    app.add_middleware(Guard, hosts=hosts)  # outermost: before any route, on every answer

    def client() -> Client:
        return cast(Client, state["client"])

    def reader() -> Store:
        return cast(Store, state["reads"])

    def archived_reads() -> ArchivedReads:
        return cast(ArchivedReads, state["archived"])

    def mark(response: Response, source: SessionSource) -> None:
        if source.archival is not None:
            response.headers[ARCHIVED_HEADER] = str(source.archival.archived_ms)

    errors_doc: dict[int | str, dict[str, Any]] = {
        code: {"description": text, "content": {problems.PROBLEM_JSON: {
            "schema": {"$ref": "#/components/schemas/Problem"}}}}
        for code, text in ((401, "no or unknown bearer token"),
                           (403, "the token's role may not do this"),
                           (404, "no such session, task, submission or run"),
                           (409, "the request contradicts committed state"),
                           (422, "invalid request"), (503, "the store cannot be reached"))}

    # ------------------------------------------------------------------ health, console

    @app.get("/healthz", include_in_schema=False)
    async def healthz(request: Request) -> dict[str, Any]:
        """Liveness to anyone; with a token, whether the store answers and the open streams
        (what a caller without one learns of the deployment: nothing)."""
        try:
            _role(request)
        except UnauthenticatedError:
            return {"status": "ok"}
        await client().store.redis.ping()
        return {"status": "ok", "streams": watchers.open, "feeds": len(watchers.feeds)}

    @app.get("/readyz", include_in_schema=False, response_model=None)
    async def readyz(request: Request) -> dict[str, str] | Response:
        """Readiness to anyone (an orchestrator's probe carries no token): 200 while the
        store answers with both credentials the API uses and has this version's scripts
        (its function library, which `baton load-functions` loads), 503 (problem details)
        while it does not. It tells a caller without a token nothing but that: why goes to
        the log, not the store's address to whoever asks."""
        try:
            await client().store.redis.ping()
            await client().store.scripts.registered.library.ensure()
            if reader() is not client().store:
                await reader().redis.ping()
        except Exception as exc:
            log.warning("api_not_ready", error=f"{type(exc).__name__}: {exc}"[:300])
            return problems.problem_response(503, "not_ready", "the store does not answer",
                                             request, retryable=True)
        return {"status": "ready"}

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        """Swagger UI over /openapi.json: pinned, with Subresource Integrity."""
        return HTMLResponse(_DOCS_PAGE)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/console/")

    console = resources.files("baton.api") / "console"
    app.mount("/console", StaticFiles(directory=str(console), html=True), name="console")

    async def _newest(store: Store, session_id: str) -> str | None:
        """The id of the session's newest receipt, of any role's stream (None without one)."""
        async with store.redis.pipeline(transaction=False) as p:
            for _, key in store.keys.session(session_id).receipt_streams():
                p.xrevrange(key, count=1)
            ids = [str(newest[0][0]) for newest in await p.execute() if newest]
        return max(ids, key=receipt_order, default=None)

    # ------------------------------------------------------------------ writes

    async def _waits(session_id: str, agent: str, compat: int,
                     kind: str = "generation") -> list[str]:
        """What the CLI warns of: no live Brain serves the input's agent at its level, or
        (a task) knows its kind."""
        why = await client().waits(agent, compat, session_id=session_id, kind=kind)
        return [f"{why}: kept, it waits until one starts"] if why else []

    @app.post("/v1/submissions", response_model=SubmitAnswer, status_code=201,
              responses=errors_doc, tags=["sessions"])
    async def submit(body: SubmitRequest, response: Response, role: Operate,
                     key: IdempotencyKey = None) -> SubmitAnswer:
        """Submit input to a session (a new one by default); once per Idempotency-Key."""
        sub, created = await client().submit(body.text, agent=body.agent, compat=body.compat,
                                             session_id=body.session_id, request_id=key,
                                             tenant=body.tenant, priority=body.priority)
        if not created:
            # Its text (and a task's kind and input) the store compares itself (409).
            _same_request(key, {"agent": (sub.agent, body.agent)})
            response.status_code = 200
        response.headers["Location"] = f"/v1/sessions/{sub.session_id}/submissions/{sub.id}"
        return SubmitAnswer(created=created, submission=sub,
                            warnings=await _waits(sub.session_id, body.agent, body.compat))

    @app.post("/v1/tasks", response_model=StartAnswer, status_code=201, responses=errors_doc,
              tags=["sessions"])
    async def start(body: StartRequest, response: Response, role: Operate,
                    key: IdempotencyKey = None) -> StartAnswer:
        """Start a root task of ``kind``; once per Idempotency-Key."""
        sid, task_id, created = await client().start_task(
            body.session_id, body.kind, body.input, agent=agent_for(body.kind, body.agent),
            compat=body.compat,
            request_id=key, tenant=body.tenant, priority=body.priority)
        if not created:
            response.status_code = 200
        response.headers["Location"] = f"/v1/sessions/{sid}/tasks/{task_id}"
        return StartAnswer(created=created, session_id=sid, task_id=task_id,
                           warnings=await _waits(sid, agent_for(body.kind, body.agent),
                                                 body.compat, body.kind))

    @app.post("/v1/sessions/{session_id}/cancel", responses=errors_doc, tags=["decisions"])
    async def cancel(session_id: SessionId, role: Operate,
                     body: Annotated[CancelRequest | None, Body()] = None) -> dict[str, str]:
        """Cancel the session's tasks (or one): committed now, carried out by a Brain. The
        body is optional."""
        body = body or CancelRequest()
        answer = await client().cancel(session_id, body.task_id, reason=body.reason)
        return answer.to_dict()

    @app.post("/v1/sessions/{session_id}/runs/{run_id}/approve", response_model=DecisionAnswer,
              responses=errors_doc, tags=["decisions"])
    async def approve(session_id: SessionId, run_id: str, body: ApproveRequest,
                      role: Operate) -> DecisionAnswer:
        """Approve a run awaiting approval, bound to its arguments' digest."""
        return DecisionAnswer(run_id=run_id,
                              seq=await client().approve(session_id, run_id, body.digest))

    @app.post("/v1/sessions/{session_id}/runs/{run_id}/reject", response_model=DecisionAnswer,
              responses=errors_doc, tags=["decisions"])
    async def reject(session_id: SessionId, run_id: str, role: Operate,
                     body: Annotated[RejectRequest | None, Body()] = None) -> DecisionAnswer:
        """Reject a run awaiting approval: it ends with error code ``rejected``. The body
        (a reason) is optional."""
        reason = body.reason if body is not None else ""
        return DecisionAnswer(run_id=run_id,
                              seq=await client().reject(session_id, run_id, reason))

    # ------------------------------------------------------------------ reads

    @app.get("/v1/sessions", responses=errors_doc, tags=["sessions"])
    async def sessions(
        role: Read,
        status: Annotated[str | None, Query(
            pattern="^(blocked|leased|pending|failed|settled|archived|completed|cancelled)$",
            description=("a live session's state; archived; or the status of an archived "
                         "session's newest submission (completed, failed, cancelled)"))] = None,
        agent: str | None = None,
        blocked: bool | None = None,
        quarantined: bool | None = None,
        archived: Annotated[bool | None, Query(description=(
            "true: archived sessions only (older ones from the archive's index too); false: "
            "live ones only"))] = None,
        since_ms: Annotated[int | None, Query(ge=0, description=(
            "created (archived, for an archived session) at or after"))] = None,
        until_ms: Annotated[int | None, Query(ge=0, description=(
            "created (archived, for an archived session) at or before"))] = None,
        limit: Annotated[int, Query(ge=1, le=1_000)] = 50,
    ) -> dict[str, Any]:
        """The newest sessions matching every filter given: live ones, then archived ones."""
        return await views.list_sessions(
            reader(), archived_reads(), status=status, agent=agent, blocked=blocked,
            quarantined=quarantined, since_ms=since_ms, until_ms=until_ms, limit=limit,
            archived=archived)

    @app.get("/v1/sessions/{session_id}", responses=errors_doc, tags=["sessions"])
    async def session(session_id: SessionId, role: Read) -> dict[str, Any]:
        """Lease, submissions, tasks, tool runs with their marks, approvals, documents."""
        return await views.session_detail(reader(), archived_reads(), session_id)

    @app.get("/v1/sessions/{session_id}/entries", responses=errors_doc, tags=["sessions"])
    async def entries(session_id: SessionId, role: Read, start: int = 0,
                      limit: Annotated[int, Query(ge=0, le=1_000)] = 200) -> dict[str, Any]:
        """Conversation entries (a negative ``start`` counts from the end)."""
        return await views.session_entries(reader(), archived_reads(), session_id, start, limit)

    @app.get("/v1/sessions/{session_id}/trace", responses=errors_doc, tags=["sessions"])
    async def trace(session_id: SessionId, role: Read) -> dict[str, Any]:
        """The handoff timeline built from the session's receipts."""
        return await views.session_trace(reader(), archived_reads(), session_id)

    @app.get("/v1/sessions/{session_id}/documents/{name}", responses=errors_doc,
             tags=["sessions"])
    async def document(session_id: SessionId, name: str, role: Read,
                       version: Annotated[int | None, Query(ge=1)] = None) -> dict[str, Any]:
        """A document as it is, or as it was at a retained ``version``."""
        return await views.document_at(archived_reads(), session_id, name, version)

    @app.get("/v1/sessions/{session_id}/submissions/{submission_id}", response_model=Submission,
             responses=errors_doc, tags=["sessions"])
    async def submission(session_id: SessionId, submission_id: str, role: Read,
                         response: Response,
                         wait: Annotated[float, Query(ge=0, le=60, description=(
                             "seconds to wait for it to settle"))] = 0) -> Submission:
        """A submission; with ``wait``, once it settled (or as it is when the wait ends)."""
        c = client()

        async def read(source: SessionSource) -> tuple[Submission, SessionSource]:
            return await source.store.inbox.submission(session_id, submission_id), source

        sub, source = await c.archived.read(session_id, read)
        mark(response, source)
        if wait and not sub.settled and not source.archived:
            try:
                sub = await c.wait(sub, timeout=wait)
            except TimeoutError:
                sub = await c.store.inbox.submission(session_id, submission_id)
        return sub

    @app.get("/v1/sessions/{session_id}/tasks/{task_id}", response_model=Task,
             responses=errors_doc, tags=["sessions"])
    async def task(session_id: SessionId, task_id: str, role: Read, response: Response) -> Task:
        """A task, live or finished."""
        async def read(source: SessionSource) -> tuple[Task, SessionSource]:
            return await source.store.inbox.task(session_id, task_id), source

        found, source = await archived_reads().read(session_id, read)
        mark(response, source)
        return found

    @app.get("/v1/sessions/{session_id}/events", tags=["sessions"], responses={
        **errors_doc, 200: {"description": "Server-Sent Events: a snapshot, then each change",
                            "content": {"text/event-stream": {}}}})
    async def events(
        session_id: SessionId, role: Read, request: Request,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=60,
                                                    pattern=RECEIPT_ID)] = None,
        after: Annotated[str | None, Query(max_length=60, pattern=RECEIPT_ID,
                                           description="resume after this receipt id")] = None,
    ) -> Response:
        """A snapshot of the session, then its changes live; resumable with Last-Event-ID.
        An archived session's stream ends after what the archive holds, with an
        ``archived`` event; a reconnect after its newest change is answered 204. Past the
        open streams allowed per token or in all, 429 with Retry-After."""
        caller = caller_key(request.headers.get("authorization"))
        slot = watchers.admit(caller)
        if slot is None:
            log.warning("events_refused", session_id=session_id, open=watchers.open,
                        caller_open=watchers.by_caller[caller])
            return problems.problem_response(
                429, "too_many_streams", f"too many open event streams (at most "
                f"{watchers.max_per_caller} per token, {watchers.max_streams} in all): "
                "close one, or retry later", request, retryable=True,
                headers={"Retry-After": str(STREAMS_RETRY_AFTER_S)})
        try:
            return await _events(session_id, last_event_id or after, slot)
        except BaseException:
            slot.release()
            raise

    async def _events(session_id: str, resume: str | None, slot: Slot) -> Response:
        store = client().store
        source = SessionSource(store)
        if not await store.inbox.exists(session_id):
            source = await client().archived.require(session_id)
        newest = await _newest(source.store, session_id) if resume is not None else None
        if resume is not None and newest is not None and \
                receipt_order(resume) > receipt_order(newest):
            # An id this session's stream never sent (the store restored from an older
            # backup, another session's id): waiting after it would be silent for good; a
            # snapshot gives the client the session as it is.
            log.info("events_resume_unknown", session_id=session_id, after=resume)
            resume = None
        if source.archived and resume is not None and resume == newest:
            slot.release()
            return Response(status_code=204)  # it has all: nothing more until a restore
        stream = stream_session(settings, session_id, resume, watchers, store, source, slot)
        return _EventStream(slot, stream, media_type="text/event-stream", headers={
            "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/v1/dead-letters", responses=errors_doc, tags=["operations"])
    async def dead_letters(role: Read, limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
                           ) -> dict[str, Any]:
        """The newest dead letters of every shard, and how many are kept."""
        return await views.dead_letter_page(reader(), limit)

    @app.get("/v1/admission", responses=errors_doc, tags=["operations"])
    async def admission(role: Read) -> dict[str, Any]:
        """New sessions waiting to start, per tenant, and the bounds on them (past one,
        a submission is answered 429 with Retry-After); the fleet-wide limits of tools and
        models: slots in use and runs in line by tenant, the rates' next admissions."""
        return await views.admission_view(reader())

    @app.get("/v1/workers", responses=errors_doc, tags=["operations"])
    async def workers(role: Read) -> dict[str, Any]:
        """Announced services, and the live Brains serving each (agent, compat level)."""
        return await views.workers_view(reader())

    @app.get("/v1/whoami", tags=["operations"], responses=errors_doc)
    async def whoami(role: Read) -> dict[str, Any]:
        """The role of the presented token (the console shows what it may do)."""
        return {"role": role, "may_operate": role == OPERATE, "namespace": settings.namespace}

    _problem_schema(app)
    return app


class _EventStream(StreamingResponse):
    """An event stream that gives its slot back however it ends, even when it never
    started (the client left before its first byte)."""

    def __init__(self, slot: Slot, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def _same_request(key: str | None, fields: dict[str, tuple[Any, Any]]) -> None:
    """ConflictError (409, as the store answers another text) when a request that found
    what its Idempotency-Key made differs from the one that made it in any of ``fields``
    (as made, as asked now)."""
    differ = sorted(name for name, (made, asked) in fields.items() if made != asked)
    if differ:
        raise ConflictError(f"Idempotency-Key {key!r} was used before for another request "
                            f"(its {', '.join(differ)} differ): use a new key for a new "
                            "request", field="Idempotency-Key")


_DOCS_PAGE = f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Baton API</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="{SWAGGER_UI['css']}" integrity="{SWAGGER_UI['css_integrity']}"
        crossorigin="anonymous">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{SWAGGER_UI['js']}" integrity="{SWAGGER_UI['js_integrity']}"
          crossorigin="anonymous"></script>
  <script src="/console/docs.js"></script>
</body>
</html>
"""


def _problem_schema(app: FastAPI) -> None:
    """Add the Problem schema the error responses refer to."""
    original: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original()
            schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = \
                problems.Problem.model_json_schema()
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

