"""Baton's one error tree.

Every error Baton raises on purpose is a :class:`BatonError`. Each says whether retrying the
same operation later can succeed (``retryable``) and carries its facts as fields, not only as
text::

    BatonError
    ├── ConfigError                  terminal  bad settings or arguments
    ├── ValidationError              terminal  bad input: a message, a tool argument, a write-set
    │   ├── PayloadTooLarge          terminal
    │   └── ToolMismatchError        terminal  a tool message names another tool than its run's
    │                                          committed intent (presented, committed)
    ├── NotFoundError                terminal  session / run / submission does not exist
    ├── ConflictError                terminal  the request contradicts committed state
    │   └── NotArchivable            terminal  a session changed, is live or is not due since
    │                                          its archival began (session_id, reason)
    ├── ArchiveError                 terminal  the archive refused an operation (url, operation,
    │   │                                      key, reason): denied, no bucket, malformed
    │   └── ArchiveUnavailable       retryable the archive cannot be reached now (also an
    │                                          UnavailableError)
    ├── ArchivedError                terminal  the session was archived (its keys left Redis):
    │                                          a write to it is refused; a new submission
    │                                          restores it (session_id, archived_ms, fence)
    ├── ForbiddenError               terminal  the server refused this role an action (role, action,
    │   │                                      target): a NATS subject permission or a Redis ACL
    │   └── CredentialsError         terminal  wrong or missing credentials (server, user)
    ├── UnauthenticatedError         terminal  an HTTP API request without a valid bearer token
    ├── FenceError                   terminal  a newer worker owns the thing: stop touching it
    │   ├── StaleFenceError          session fence (Brain)  (session_id, presented, current)
    │   └── StaleAttemptError        tool-run attempt fence (Hands)  (session_id, run_id, ...)
    ├── LeaseBusyError               retryable another live worker holds the session lease
    ├── WaitTimeout                  retryable a wait ended before the work did (also a
    │                                          TimeoutError; the work goes on) (session_id)
    ├── StoreEpochError              terminal  the store lost its state: its epoch changed or
    │                                          vanished since this process saw it (namespace,
    │                                          reason, shards, expected, found)
    ├── StoreLayoutError             terminal  the store was written by another key layout
    │                                          (namespace, found, expected)
    ├── UnavailableError             retryable a server cannot be reached
    │   ├── RedisUnavailable
    │   │   ├── WriteInDoubtError    retryable no replica acknowledged a write in time: it
    │   │   │                                  may survive or vanish (what, session_id,
    │   │   │                                  commit_id, wanted, reason)
    │   │   └── StoreFullError       retryable a write refused for want of room: Redis out of
    │   │                                      memory, its append-only file not written, or
    │   │                                      JetStream full (reason, retry_after_s);
    │   │                                      nothing of the refused write was applied
    │   └── NatsUnavailable
    ├── ModelError                   terminal  a model provider refused the request or sent a
    │   │                                      malformed answer (provider, status)
    │   └── ModelRetryableError      retryable 429 / 5xx / overloaded, connection errors, timeouts,
    │                                          a truncated stream (retry_after_s: the server's hint)
    ├── ServerError                  terminal  an embedded server could not start or stop
    │   └── ServerBinaryMissing      terminal  redis-server / nats-server not installed
    └── ToolError                    terminal  a tool failed; becomes a result the model sees
        └── HttpError                terminal  a tool's HTTP request failed (method, url, error,
            │                                  detail): the HTTP library's error, named
            ├── ResponseTooLarge     terminal  a body, as sent or decoded, past the Hands'
            │                                  client's bound (limit, decoded)
            └── RequestDeadlineExceeded
                                     terminal  no whole response within the request's deadline
                                               (deadline_s); it may have acted, as after a
                                               read timeout

:func:`from_redis_error` maps redis-py exceptions (including the error replies of Baton's Lua
scripts, which start with a stable code word) onto this tree.
"""

from __future__ import annotations

from typing import Any


class BatonError(Exception):
    """Base of every error Baton raises on purpose."""

    retryable: bool = False
    code: str = "baton_error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable, **{
            k: v for k, v in self.fields.items() if isinstance(v, str | int | float | bool | None)
        }}


class ConfigError(BatonError):
    code = "config"


class ValidationError(BatonError):
    code = "invalid"


class PayloadTooLarge(ValidationError):
    code = "too_large"


class ToolMismatchError(ValidationError):
    """A tool message's tool is not the one its run's committed intent names.

    Refused by claim.lua before any write: the message is a forgery or a misroute (published
    on another tool's subject), so it is dead-lettered and the run is left for the message
    the Brain's own dispatch produced.
    """

    code = "tool_mismatch"
    session_id: str
    run_id: str
    presented: str
    committed: str

    def __init__(self, session_id: str, run_id: str, presented: str, committed: str) -> None:
        super().__init__(
            f"tool mismatch for run {run_id} of session {session_id}: the message names "
            f"{presented!r}, the committed intent {committed!r}",
            session_id=session_id, run_id=run_id, presented=presented, committed=committed,
        )


class NotFoundError(BatonError):
    code = "not_found"


def not_found(what: str, *, namespace: str = "", **fields: Any) -> NotFoundError:
    """A NOT_FOUND as a sentence: ``no session s-x in namespace baton``,
    ``no run r-1 in session s-x (namespace baton)``."""
    where = ""
    if namespace:
        where = f" (namespace {namespace})" if " in " in what else f" in namespace {namespace}"
    return NotFoundError(f"no {what}{where}", namespace=namespace, **fields)


class ConflictError(BatonError):
    code = "conflict"


class NotArchivable(ConflictError):
    """archive.lua refused: since the snapshot the session changed (a commit, a request, a
    result), or it has live work, or its retention has not passed. Nothing was written; the
    archive object already written is harmless (a later archival writes it again)."""

    code = "not_archivable"
    session_id: str
    reason: str

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id} cannot be archived now: {reason}",
                         session_id=session_id, reason=reason)


class ArchivedError(BatonError):
    """The session was archived: its keys left Redis for the archive, a tombstone stays. Every
    write to it (a late wake, a tool result, a stale worker, a request) is refused with
    nothing written; reads fall through to the archive, and a client's new submission asks a
    Brain to restore it first (:meth:`baton.client.Client.submit` does so by itself)."""

    code = "archived"
    session_id: str
    archived_ms: int
    fence: int

    def __init__(self, session_id: str, archived_ms: int, fence: int) -> None:
        super().__init__(f"session {session_id} is archived (since {archived_ms} ms); a new "
                         "submission restores it", session_id=session_id,
                         archived_ms=archived_ms, fence=fence)


class CorruptStateError(BatonError):
    """A session's stored state cannot be decoded, or a script refused to write over it.

    A wrong-typed key, a meta hash without its agent, a non-numeric fence, task or entry JSON
    that does not parse. Retrying cannot fix it: the Brain counts such failures and
    quarantines the session after a bounded number (:mod:`baton.store.quarantine`).
    """

    code = "corrupt"
    session_id: str
    reason: str

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id or '-'} has corrupt state: {reason}",
                         session_id=session_id, reason=reason)


class QuarantinedError(CorruptStateError):
    """The session was quarantined: its state could not be processed within the bound.

    A waiting client gets this instead of waiting for ever; ``baton inspect`` shows why.
    """

    code = "quarantined"

    def __init__(self, session_id: str, reason: str) -> None:
        BatonError.__init__(self, f"session {session_id} is quarantined: {reason}",
                            session_id=session_id, reason=reason)


class ForbiddenError(BatonError):
    """The server refused this role an action: fix the deployment's permissions, not the data.

    Raised for a NATS permission violation (publish or subscribe outside the role's subjects)
    and for a Redis ``NOPERM`` reply (a command or key outside the role's ACL).
    """

    code = "forbidden"

    def __init__(self, role: str, action: str, target: str, detail: str = "") -> None:
        super().__init__(
            f"{role or 'this process'} may not {action}" + (f" {target}" if target else "")
            + (f": {detail}" if detail else ""),
            role=role, action=action, target=target, detail=detail,
        )


class CredentialsError(ForbiddenError):
    """The server refused the connection: wrong user, password, credentials file or cert."""

    code = "bad_credentials"

    def __init__(self, server: str, user: str, detail: str = "") -> None:
        reason = detail or "wrong or missing credentials"
        BatonError.__init__(
            self, f"{server} refused the credentials of user {user or '(none)'}: {reason}",
            role=user, action="connect to", target=server, detail=reason,
            server=server, user=user,
        )


class UnauthenticatedError(BatonError):
    """A request to the HTTP API carried no bearer token, or one the API does not know."""

    code = "unauthenticated"


class FenceError(BatonError):
    """A newer worker owns the session or run; the holder of the old token must stop."""

    code = "fenced"


class StaleFenceError(FenceError):
    code = "stale_fence"
    session_id: str
    presented: int
    current: int

    def __init__(self, session_id: str, presented: int, current: int) -> None:
        super().__init__(
            f"stale fence for session {session_id}: presented {presented}, current {current}",
            session_id=session_id,
            presented=presented,
            current=current,
        )


class StaleAttemptError(FenceError):
    code = "stale_attempt"
    session_id: str
    run_id: str
    presented: int
    current: int
    status: str

    def __init__(
        self, session_id: str, run_id: str, presented: int, current: int, status: str = ""
    ) -> None:
        super().__init__(
            f"stale attempt for run {run_id} of session {session_id}: "
            f"presented {presented}, current {current} ({status or 'unknown'})",
            session_id=session_id,
            run_id=run_id,
            presented=presented,
            current=current,
            status=status,
        )


class WaitTimeout(BatonError, TimeoutError):
    """``Client.wait`` / ``wait_task`` / ``wait_cancelled`` gave up: the work was not done
    within the timeout. Nothing failed and nothing is lost; waiting again may see it end."""

    retryable = True
    code = "wait_timeout"
    session_id: str
    why: str  # what the session most likely waits for, in words ("" when not known)


class LeaseBusyError(BatonError):
    retryable = True
    code = "lease_busy"
    session_id: str
    holder: str
    remaining_ms: int

    def __init__(self, session_id: str, holder: str, remaining_ms: int) -> None:
        super().__init__(
            f"session {session_id} is leased by {holder} for {remaining_ms} ms more",
            session_id=session_id,
            holder=holder,
            remaining_ms=remaining_ms,
        )


class StoreEpochError(BatonError):
    """The store is not the one this process started with: stop, do not start sessions anew.

    Each shard of a store carries an epoch written when the store was first used
    (:mod:`baton.store.epoch`). It vanishes when the Redis node holding it restarts empty
    (non-durable mode) or fails over to a replica that never had it; a different one means
    the store was re-initialised meanwhile. Either way sessions this process knew are gone,
    and carrying on would treat them as new (a lost submission reads as "not found").
    ``reason`` is ``missing``, ``changed`` or ``mixed``; ``shards`` lists the affected ones.
    """

    code = "store_epoch"
    namespace: str
    reason: str
    shards: str
    expected: str
    found: str

    def __init__(self, namespace: str, reason: str, shards: list[int], expected: str = "",
                 found: str = "") -> None:
        listed = ",".join(map(str, shards[:16])) + ("..." if len(shards) > 16 else "")
        what = {"missing": "is missing", "changed": "changed",
                "mixed": "differs between shards"}.get(reason, reason)
        super().__init__(
            f"the store of namespace {namespace} lost its state: its epoch {what} on shard(s) "
            f"{listed} (expected {expected or '-'}, found {found or 'none'}); Redis restarted "
            f"empty or failed over without the data. Stop and investigate (restore a backup "
            f"if there is one); the sessions that lived there are gone from it, and once that "
            f"is accepted, `baton accept-loss` lets the workers start again",
            namespace=namespace, reason=reason, shards=listed, expected=expected, found=found,
        )



class StoreLayoutError(BatonError):
    """The store's keys were written by another layout than this version of Baton uses.

    The layout version is stamped in the store's epoch when the store is first used
    (:mod:`baton.store.epoch`); a process refuses a store of another version at start
    rather than misread it (e.g. a run's cancel mark looked up where it no longer is).
    """

    code = "store_layout"
    namespace: str
    found: int
    expected: int

    def __init__(self, namespace: str, found: int, expected: int) -> None:
        super().__init__(
            f"the store of namespace {namespace} uses key layout {found}, this version of "
            f"Baton needs layout {expected}: let its sessions finish with the version that "
            f"wrote them, or start this version on a new namespace or an empty store",
            namespace=namespace, found=found, expected=expected,
        )

class UnavailableError(BatonError):
    retryable = True
    code = "unavailable"


class BacklogFullError(UnavailableError):
    """New work refused at the edge: the new sessions waiting to start (``waiting``) reached
    the bound set for ``tenant`` or in total (``bound``: ``tenant`` or ``total``,
    ``limit``). Nothing of the submission was written. Retryable: the backlog drains as
    Brains start sessions; ``retry_after_s`` is a hint for the edge's Retry-After (HTTP 429).
    """

    code = "backlog_full"
    retry_after_s: float

    def __init__(self, tenant: str, bound: str, waiting: int, limit: int,
                 retry_after_s: float) -> None:
        whose = f"tenant {tenant}'s" if bound == "tenant" else "all tenants'"
        super().__init__(f"{whose} new sessions waiting to start ({waiting}) reached the "
                         f"bound of {limit}: nothing was written; retry later",
                         tenant=tenant, bound=bound, waiting=waiting, limit=limit,
                         retry_after_s=retry_after_s)


class ArchiveError(BatonError):
    """The archive refused an operation or failed for good: access denied, no such bucket,
    a malformed request. Terminal: fix the deployment (``url`` names the archive without
    credentials; ``operation`` and ``key`` what was asked)."""

    code = "archive"
    url: str
    operation: str
    key: str
    reason: str

    def __init__(self, url: str, operation: str, key: str, reason: str) -> None:
        super().__init__(
            f"the archive {url} failed to {operation} {key or 'its objects'}: {reason}",
            url=url, operation=operation, key=key, reason=reason)


class ArchiveUnavailable(ArchiveError, UnavailableError):
    """The archive cannot be reached now (refused connection, timeout, a 5xx, a full disk):
    the same operation may succeed later."""

    retryable = True
    code = "archive_unavailable"


class RedisUnavailable(UnavailableError):
    code = "redis_unavailable"


class StoreFullError(RedisUnavailable):
    """Redis refused a write for want of room (``reason``: ``memory``, its maxmemory is
    reached under the noeviction policy; ``disk``, it cannot write its append-only file).
    Baton's scripts check everything before their first write, so the refused write applied
    nothing. Retryable: it resumes by itself once there is room (baton.store.capacity);
    ``retry_after_s`` is a hint for the edge's Retry-After."""

    code = "store_full"
    reason: str
    retry_after_s: float

    def __init__(self, reason: str, detail: str) -> None:
        what = {"memory": "Redis is out of memory (maxmemory reached)",
                "disk": "Redis cannot write its append-only file (disk full or failing)",
                "bus": "JetStream's streams are full: the relays cannot deliver more work"
                }.get(reason, f"the store is full ({reason})")
        super().__init__(f"{what}: the write was refused and nothing of it applied; retry "
                         f"later ({detail})", cause=detail, reason=reason, retry_after_s=5.0)


class WriteInDoubtError(RedisUnavailable):
    """A write ran on a primary but no replica acknowledged it in time: it is in doubt.

    It may survive (no failover came) or vanish (the primary failed over, or was on the
    minority side of a partition). The writer must not act on it (publish, reply, execute);
    retrying it is safe: the same ``commit_id`` applies at most once (see
    :mod:`baton.store.replication`), and the callers' own retries are idempotent. A subclass
    of :class:`RedisUnavailable`, so a worker treats it as "try again later".
    """

    code = "write_in_doubt"
    what: str
    session_id: str
    commit_id: str
    wanted: int
    reason: str
    slot: int | None  # on a Redis Cluster: the slot written and the node serving it
    node: str

    def __init__(self, what: str, *, session_id: str, commit_id: str, wanted: int,
                 reason: str, slot: int | None = None, node: str = "") -> None:
        shard = "" if slot is None else f" (slot {slot} on {node})" if node else f" (slot {slot})"
        super().__init__(
            f"{what} of session {session_id or '-'}{shard} is in doubt (commit {commit_id}): "
            f"{reason}; it was not acknowledged by {wanted} replica(s) and may be lost on a "
            f"failover. Do not act on it; retry",
            what=what, session_id=session_id, commit_id=commit_id, wanted=wanted,
            reason=reason, slot=slot, node=node,
        )


class NatsUnavailable(UnavailableError):
    code = "nats_unavailable"


class ModelError(BatonError):
    """A model call failed in a way that asking again will not fix (4xx, malformed answer)."""

    code = "model_error"
    provider: str
    status: int | None

    def __init__(self, message: str, *, provider: str = "", status: int | None = None,
                 **fields: Any) -> None:
        super().__init__(message, provider=provider, status=status, **fields)


class ModelRetryableError(ModelError):
    """A model call failed in a way that the same request may succeed later.

    ``retry_after_s`` is the provider's hint (``Retry-After``), or None.
    """

    retryable = True
    code = "model_unavailable"
    retry_after_s: float | None

    def __init__(self, message: str, *, provider: str = "", status: int | None = None,
                 retry_after_s: float | None = None, **fields: Any) -> None:
        super().__init__(message, provider=provider, status=status,
                         retry_after_s=retry_after_s, **fields)


class ServerError(BatonError):
    code = "server"


class ServerBinaryMissing(ServerError):
    code = "binary_missing"


class ToolError(BatonError):
    """Raised by tool code to return a coded error result to the model."""

    code = "tool_error"

    def __init__(self, message: str, code: str = "tool_error", **fields: Any) -> None:
        super().__init__(message, **fields)
        self.code = code


class HttpError(ToolError):
    """A tool's HTTP request failed; what the model reads of it.

    ``error`` names the HTTP library's exception (``RemoteProtocolError``, ``ConnectError``,
    ...) and ``detail`` is its text; ``url`` has no query or credentials. The Hands' shared
    client (:mod:`baton.hands.http`) raises the two subclasses itself; an httpx error a tool
    lets escape becomes this class's result (``code`` ``http_error``).
    """

    code = "http_error"
    method: str
    url: str
    error: str
    detail: str

    def __init__(self, method: str, url: str, error: str, detail: str = "", *,
                 message: str = "", **fields: Any) -> None:
        super().__init__(
            message or f"{method} {url} failed: {error}" + (f": {detail}" if detail else ""),
            code=type(self).code, method=method, url=url, error=error, detail=detail, **fields)


class ResponseTooLarge(HttpError):
    """A response body went past the Hands' shared client's bound: ``limit`` bytes as sent
    (its Content-Length, or what arrived, chunked or until the close), or once decoded
    (``decoded``: gzip or deflate). Nothing past the bound was read into memory."""

    code = "response_too_large"
    limit: int
    decoded: bool

    def __init__(self, method: str, url: str, limit: int, *, decoded: bool = False) -> None:
        what = "decoded body" if decoded else "body"
        super().__init__(
            method, url, "ResponseTooLarge", message=(
                f"{method} {url}: the response's {what} is larger than the {limit} bytes "
                f"the tools' HTTP client reads"),
            limit=limit, decoded=decoded)


class RequestDeadlineExceeded(HttpError):
    """A request's response did not end within its deadline: ``deadline_s`` from the request
    to the last byte of the body, however slowly the server sent it. The request may have
    acted (as after a read timeout)."""

    code = "request_deadline"
    deadline_s: float

    def __init__(self, method: str, url: str, deadline_s: float) -> None:
        super().__init__(
            method, url, "RequestDeadlineExceeded", message=(
                f"{method} {url}: the response did not end within the request's deadline "
                f"of {deadline_s:g} s (the request may have taken effect)"),
            deadline_s=deadline_s)


def from_redis_error(
    exc: Exception, *, session_id: str = "", run_id: str = "", role: str = "",
    namespace: str = "",
) -> BatonError:
    """Map a redis-py exception (or a Baton Lua error reply) to the error tree.

    Baton's scripts fail with replies of the form ``CODE detail...`` where CODE is one of
    ``NOPERM command key`` (the caller's ACL lacks it; checked before any write),
    ``STALE_FENCE presented current``, ``STALE_ATTEMPT presented current status``,
    ``BUSY holder remaining_ms``, ``NOT_FOUND what``, ``INVALID what``, ``CONFLICT what``,
    ``CORRUPT what`` (the session's stored state; checked before any write),
    ``WRONG_TOOL presented committed``, ``ARCHIVED archived_ms fence`` (the session's
    tombstone), ``CHANGED``/``NOT_DUE``/``LIVE what`` (archive.lua's refusals).
    A NOT_FOUND becomes a sentence naming the id and ``namespace`` (see :func:`not_found`).
    """
    import redis.exceptions as rex

    if isinstance(exc, BatonError):
        return exc
    if isinstance(exc, rex.AuthenticationError | rex.AuthenticationWrongNumberOfArgsError):
        return CredentialsError("redis", role, str(exc))
    text = str(exc)
    if isinstance(exc, rex.NoPermissionError) and "no permissions" not in text:
        # A Baton script's own check ("NOPERM <command> <key>"), made before any write.
        return ForbiddenError(role, "run", f"Redis {text}", "not in its ACL")
    # "can't access at least one of the keys": a command a function calls, on a key the
    # caller's ACL does not grant (Redis checks each one with the caller's permissions).
    if (isinstance(exc, rex.NoPermissionError) or "can't run this" in text
            or "can't access at least one of the keys" in text):
        return ForbiddenError(role, "run", _denied_redis_target(text), text)
    if isinstance(exc, rex.ConnectionError | rex.TimeoutError | ConnectionError | OSError):
        return RedisUnavailable(f"redis unavailable: {exc}", cause=str(exc))
    if ("CROSSSLOT" in text or "blocked when running redis in cluster mode" in text
            or isinstance(exc, rex.ClusterCrossSlotError)):
        # Keys of one call on several Cluster slots, or a call redis-py cannot route on a
        # cluster: a bug in Baton's key layout, never a passing state; terminal so it is
        # reported, not retried forever.
        return BatonError(f"redis cluster refused a cross-slot call: {text}", cause=text)
    if isinstance(exc, rex.RedisClusterException | rex.ClusterError | rex.TryAgainError
                  | rex.MasterDownError | rex.ReadOnlyError):
        # A Redis Cluster between states (no node serves a slot yet, a failover, a slot
        # migrating, a primary turned replica): redis-py's RedisClusterException is not even
        # a RedisError. Retryable.
        return RedisUnavailable(f"redis cluster unavailable: {text or type(exc).__name__}",
                                cause=text or type(exc).__name__)
    if "NOREPLICAS" in text:
        # A primary's split-brain guard (min-replicas-to-write): too few replicas acknowledge
        # it now; it refused the write before running it. Retryable: a replica back, or
        # promoted in its place, and it takes writes again.
        return RedisUnavailable(f"redis refused a write for want of replicas: {text}",
                                cause=text)
    if isinstance(exc, rex.OutOfMemoryError) or text.startswith("OOM "):
        return StoreFullError("memory", text)
    if text.startswith("MISCONF") or "MISCONF " in text:
        return StoreFullError("disk", text)
    if text.startswith("FULL ") or " FULL " in text:  # a relay found JetStream full
        return StoreFullError("bus", text[text.find("FULL ") + 5:])
    if text.startswith("WRONGTYPE"):  # a read of a session key that holds another type
        return CorruptStateError(session_id, f"a key holds the wrong type ({text})")
    # redis-py may prefix script errors; find our code word.
    for word in ("ARCHIVED", "CHANGED", "NOT_DUE", "LIVE"):
        idx = text.find(word + " ")
        if idx >= 0:
            parts = text[idx:].split(" ")
            if word == "ARCHIVED":
                at, fence = [*parts[1:3], "0", "0"][:2]
                return ArchivedError(session_id, int(at) if _is_int(at) else 0,
                                     int(fence) if _is_int(fence) else 0)
            return NotArchivable(session_id, f"{word.lower().replace('_', ' ')}: "
                                             f"{' '.join(parts[1:])}")
    for word in ("STALE_FENCE", "STALE_ATTEMPT", "BUSY", "NOT_FOUND", "INVALID", "CONFLICT",
                 "CORRUPT", "WRONG_TOOL"):
        idx = text.find(word + " ")
        if idx < 0 and text.endswith(word):
            idx = text.find(word)
        if idx >= 0:
            parts = text[idx:].split(" ")
            numbers = parts[2:3] if word == "BUSY" else parts[1:3]
            if word in ("STALE_FENCE", "STALE_ATTEMPT", "BUSY") and not all(
                    _is_int(n) for n in numbers):
                # the numbers come from the stored record: one that is not an integer is a
                # corrupt record (a raw ValueError here would loop the caller)
                return CorruptStateError(session_id, f"a record holds a non-integer ({text})")
            if word == "STALE_FENCE":
                return StaleFenceError(session_id, int(parts[1]), int(parts[2]))
            if word == "STALE_ATTEMPT":
                status = parts[3] if len(parts) > 3 else ""
                return StaleAttemptError(session_id, run_id, int(parts[1]), int(parts[2]), status)
            if word == "BUSY":
                return LeaseBusyError(session_id, parts[1], int(parts[2]))
            if word == "WRONG_TOOL":
                return ToolMismatchError(session_id, run_id, parts[1] if len(parts) > 1 else "",
                                         " ".join(parts[2:]))
            detail = " ".join(parts[1:])
            if word == "NOT_FOUND":
                if detail == "session" and session_id:
                    detail = f"session {session_id}"
                return not_found(detail, namespace=namespace, session_id=session_id)
            if word == "INVALID":
                return ValidationError(detail, session_id=session_id)
            if word == "CORRUPT":
                return CorruptStateError(session_id, detail)
            return ConflictError(detail, session_id=session_id)
    return BatonError(f"redis error: {text}", cause=text)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _denied_redis_target(text: str) -> str:
    """What a Redis ACL refusal was about, e.g. "the command 'flushall'" or "a key"."""
    low = text.lower()
    for marker in ("run the '", "command '"):
        at = low.find(marker)
        if at >= 0:
            name = low[at + len(marker):].split("'", 1)[0]
            return f"the Redis command {name!r}"
    if "key" in low:
        return "a Redis key outside its ACL key patterns"
    if "channel" in low:
        return "a Redis channel outside its ACL channel patterns"
    return "a Redis command"
