"""Loads Baton's Lua scripts (``shared/lua/*.lua``), each prefixed with ``_lib.lua`` and
wrapped by ``_applied.lua``, and runs the session scripts.

The scripts are one Redis Functions library (:class:`Library`): ``FUNCTION LOAD`` once, then
``FCALL`` by name, so no worker role needs ``EVAL`` (arbitrary Lua, within its ACL) or
``SCRIPT LOAD`` (see baton.auth). Functions are persisted and replicated with the data, so
a restart or a failover keeps them. The library's name carries a digest of its code
(``baton_<digest>``): Baton versions side by side during a rolling upgrade each call their
own, and loading one never replaces another's. A client logged in as the unrestricted
``default`` user (a development server) loads a missing library itself; a role user may not,
and waits for the admin to load it (``baton load-functions``, see :meth:`Library.load`).
:class:`ScriptRunner` is the one way a session
transition reaches Redis: the store, the tool-run transitions and the operator decisions
all share it, so every transition maps Redis errors to Baton's error tree the same way, and
in cluster mode every transition that moves a session forward is acknowledged only once a
replica has it (:mod:`baton.store.replication`), under a commit id that makes its retry
apply at most once.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Literal, get_args

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from baton.errors import PayloadTooLarge, RedisUnavailable, from_redis_error
from baton.settings import Settings
from baton.store import lua_profile
from baton.store.keys import SessionKeys
from baton.store.redis_client import REDIS_ERRORS, redis_user
from baton.store.replication import Reads, ReplicatedWrites, missing

SessionScript = Literal[
    "submit",
    "start",
    "acquire",
    "renew",
    "release",
    "commit",
    "claim",
    "heartbeat",
    "complete",
    "partial",
    "cancel",
    "approve",
    "archive",
    "slot_wait",
]
SESSION_SCRIPTS: tuple[str, ...] = get_args(SessionScript)
SHARD_SCRIPTS = ("fire_timers", "poison", "relay_lease", "relay_ack", "arm_requests",
                 "admitted")
#: Scripts of the fleet-wide limits of one tool (its own hash tag, see baton.store.limits)
#: and of one model's budget (baton.store.budgets).
LIMIT_SCRIPTS = ("tool_limit", "model_limit")
#: Scripts of an archived session: they expect its tombstone, so neither the guard (which
#: refuses an archived session) nor the commit-id wrapper runs around them; they get the
#: _lib.lua definitions they use (the session's key names first).
TOMBSTONE_SCRIPTS = ("restore", "ask_restore", "reinstate")
#: Transitions a failover must not lose once acknowledged: fences (acquire), commits, input,
#: tool-run claims and results, operator decisions. Heartbeats, lease renewals and streamed
#: partial text are losable by design (a lost one at worst causes a fenced takeover), so
#: they skip the replica acknowledgement, as do the Hands' notes of a run's wait for a capped
#: tool's slot (slot_wait: a lost one only leaves the wait unshown).
REPLICATED: frozenset[str] = frozenset(
    {"submit", "start", "acquire", "release", "commit", "claim", "complete", "cancel",
     "approve"})
#: The Hands' scripts: they declare the run records, the only session key the Hands write.
HANDS_SCRIPTS = frozenset({"claim", "heartbeat", "complete", "slot_wait"})
#: The client's requests that go to the session's inbox (the key they declare and write).
INBOX_SCRIPTS = frozenset({"cancel", "approve", "submit", "start"})
#: How long a session keeps the replies of its applied commit ids (see _applied.lua).
APPLIED_TTL_MS = 600_000
APPLIED_MAX = 256
#: Records each call past APPLIED_MAX looks at for expired ones (see _applied.lua).
APPLIED_SAMPLE = 16
#: The receipts a session's stream keeps, about (``XADD MAXLEN ~``, see _lib.lua's receipt()):
#: :attr:`Settings.receipts_kept`'s default.
RECEIPTS_KEPT = 10_000


# _lib.lua helpers that name keys only to ask Redis whether the caller may write them
# (redis.acl_check_cmd reads no key), so calling them touches none of those keys.
_ACL_ONLY = frozenset({"acl_refusal", "log_checks"})
_KEY = re.compile(r"\bK_([A-Z][A-Z_]*)\b")
_NON_KEYS = frozenset({"BASE", "SHARD"})  # K_BASE/K_SHARD: prefixes of the others
_META_READ = re.compile(r"\bMETA\[")  # a script using meta_refusal's read of meta's fields
#: The type of each session key (see _lib.lua), as corrupt_refusal checks it.
KEY_TYPES: dict[str, str] = {
    "meta": "hash", "entries": "list", "tasks": "hash", "done": "hash", "docs": "hash",
    "subs": "hash", "reqs": "hash", "runs": "hash", "runs_done": "hash",
    "receipts": "stream", "receipts_hands": "stream", "receipts_client": "stream",
    "outbox": "stream", "timers": "zset", "applied": "hash",
    "sessions": "zset", "nudge": "string", "wakes": "stream", "intents": "hash",
    "inbox": "hash", "archived": "hash", "poison": "hash", "runs_applied": "hash",
    "inbox_applied": "hash", "archived_ix": "zset", "full": "string",
    "adm": "hash", "adm_info": "hash", "adm_fly": "zset", "adm_q": "zset"}
#: The shard's keys among them (``<ns>:{<ns>-<shard>}:<name>``; ``archived_ix`` is the
#: shard's ``archived`` index): the others are the session's, ``<ns>:{..}:s:<sid>:<name>``.
SHARD_KEYS = {"outbox": "outbox", "timers": "timers", "sessions": "sessions", "wakes": "wakes",
              "archived_ix": "archived", "full": "full", "adm": "adm", "adm_info": "adm_info",
              "adm_fly": "adm_fly", "adm_q": "adm_q"}
_DEFINES = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)", re.M)


@cache
def _lib_parts(lib: str) -> list[tuple[frozenset[str], str]]:
    """_lib.lua after its header as top-level statements, each with the comment lines above
    it and the names it defines (none: always sent). A statement starts with ``local`` or
    ``if`` at the start of a line; a function's runs up to its ``end`` there."""
    parts: list[tuple[frozenset[str], list[str]]] = []
    comment: list[str] = []
    in_function = False
    for line in lib[lib.index("]==]") + len("]==]"):].splitlines(keepends=True):
        if in_function or not line.startswith(("--", "local ", "if ")):
            (parts[-1][1] if parts else comment).append(line)
            in_function = in_function and not line.startswith("end")
        elif line.startswith("--"):
            comment.append(line)
        else:
            m = _DEFINES.match(line)
            names = {n.strip() for n in (m.group(1) or m.group(2)).split(",")} if m else set()
            parts.append((frozenset(names), [*comment, line]))
            comment = []
            in_function = line.startswith("local function ")
    return [(names, "".join(lines)) for names, lines in parts]


#: A name called in Lua text (``name(`` or ``name (``), as a whole word.
_CALL = re.compile(r"\b(\w++)\s*+\(")


@cache
def _lib_functions(lib: str) -> dict[str, str]:
    """Each ``local function`` of _lib.lua -> its text (up to the next top-level ``end``)."""
    return {m.group(1): m.group(2) for m in re.finditer(
        r"^local function (\w+)\(.*?\n(.*?)^end\b", lib, re.S | re.M)}


@cache
def guarded_keys(name: str) -> frozenset[str]:
    """The session keys (:data:`KEY_TYPES`) whose types a session script checks before
    running, found in its text: the keys it names and those of the _lib.lua helpers it
    calls (transitively), plus the applied-commit record of _applied.lua.

    A key the script never touches cannot fail it midway, so checking only these keeps
    the validate-before-write rule at a fraction of the TYPE calls; over-approximating
    (a key named in a comment) only costs a check. Nor can a key the script only reads
    before its first write (a WRONGTYPE there fails it with nothing written), or touches
    only with commands that work on any type (EXISTS, DEL, SET): its header lists those on an
    ``UNGUARDED:`` line, and they are not checked. Nor are the keys on a ``SELF-GUARDED:``
    line: the script checks those itself, before its first write, when a call touches them.
    """
    lua = resources.files("baton.store") / "lua"
    functions = _lib_functions((lua / "_lib.lua").read_text())
    seen: set[str] = set()
    own = (lua / f"{name}.lua").read_text()
    texts = [own, (lua / "_applied.lua").read_text()]
    keys: set[str] = set()
    while texts:
        text = texts.pop()
        keys.update(k.lower() for k in _KEY.findall(text) if k not in _NON_KEYS)
        if _META_READ.search(text):  # meta's fields as the guard read them
            keys.add("meta")
        called = _calls(text)
        for fn, body in functions.items():
            if fn not in seen and fn not in _ACL_ONLY and fn in called:
                seen.add(fn)
                texts.append(body)
    unguarded = re.findall(r"^(?:UNGUARDED|SELF-GUARDED):(.*)$", own, re.M)
    return frozenset(keys - {k for line in unguarded for k in line.split()})


def _guard(name: str) -> str:
    """The script's corrupt_refusal (see _lib.lua): meta_refusal() when it touches meta (its
    read of meta's fields checks meta's type), then a TYPE check per other guarded key, the
    applied record's only with a commit id. Every session script first refuses an archived
    session (archived_refusal)."""
    keys = guarded_keys(name)
    # An archived session first: its keys are gone, so nothing else is worth checking.
    checks = ["archived_refusal()"]
    checks += ["meta_refusal()"] if "meta" in keys else []
    checks += [f"wrong_type(K_{k.upper()}, '{k}', '{KEY_TYPES[k]}')"
               for k in sorted(keys - {"applied", "meta"}, key=list(KEY_TYPES).index)]
    if "applied" in keys:
        checks.append("(with_applied and wrong_type(K_APPLIED, 'applied', 'hash'))")
    return ("-- corrupt_refusal(with_applied): the checks of _lib.lua's header for this script\n"
            "local function corrupt_refusal(with_applied)\n"
            f"  return {' or '.join(checks) or 'nil'}\n"
            "end\n")


_WORD = re.compile(r"\w+")


@cache
def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text))


@cache
def _calls(text: str) -> frozenset[str]:
    return frozenset(_CALL.findall(text))


def _prelude(lib: str, texts: list[str]) -> str:
    """The parts of _lib.lua that ``texts`` use (transitively), in their order: those that
    define a name a text holds as a whole word (a worker builds every script as it starts,
    so each text is split into its words once, not searched once per name)."""
    parts = _lib_parts(lib)
    used: set[int] = set()
    pending = list(texts)
    while pending:
        words = _words(pending.pop())
        for i, (names, part) in enumerate(parts):
            if i not in used and (not names or not names.isdisjoint(words)):
                used.add(i)
                pending.append(part)
    return "".join(part for i, (_, part) in enumerate(parts) if i in used)


@cache
def source(name: str, *, acl_checks: bool = True, receipts_kept: int = RECEIPTS_KEPT) -> str:
    """The full source of a script as sent to Redis.

    ``acl_checks``: whether the script checks, before its first write, that the caller's
    ACL allows every write it will make (see ``acl_refusal`` in _lib.lua). Needed only for
    a restricted ACL user; the checks cost tens of microseconds of server time per call.
    ``receipts_kept``: about how many receipts a session's stream keeps (older ones are
    trimmed as new ones come, see _lib.lua's receipt()).
    A session script gets the parts of _lib.lua it uses, its corrupt_refusal (:func:`_guard`)
    and the commit-id wrapper of _applied.lua.
    """
    lua = resources.files("baton.store") / "lua"
    # Every script checks its numeric arguments before any write (int_in, bad_args).
    args = (lua / "_args.lua").read_text()
    return args + _source(name, lua, acl_checks=acl_checks, receipts_kept=receipts_kept)


@cache
def script_keys(name: str) -> tuple[str, ...]:
    """The keys (:data:`KEY_TYPES` names) a session or tombstone script touches, in the
    order its caller declares them (:func:`declared`): the session's first (the script finds
    the others' names from the first, see _lib.lua), then the shard's.

    Every key a script touches is declared, so that on a Redis Cluster a slot in migration
    (resharding) redirects the whole call, ASK or TRYAGAIN, before anything ran: a key found
    only by its name inside the script would fail the call at that key, after its first
    writes, once the key had moved, or read as empty on the node importing the slot. These
    are the keys whose names the script's text defines (_lib.lua's ``local K_<NAME>`` parts
    it is sent, see :func:`_prelude`), a slight over-approximation: a key named but not
    touched costs only its declaration.
    """
    _source(name, resources.files("baton.store") / "lua", acl_checks=True)
    return _KEYS_OF[name]


_KEYS_OF: dict[str, tuple[str, ...]] = {}
_KEY_DEFINED = re.compile(r"^local K_([A-Z_]+) = ", re.M)


def _declared_check(name: str, prelude: str) -> str:
    """The statement checking that the caller declared exactly the keys the script touches,
    in :func:`script_keys`'s order (records them there for :func:`declared`)."""
    found = {k.lower() for k in _KEY_DEFINED.findall(prelude)} - {"base", "shard"}
    keys = tuple(k for k in KEY_TYPES if k in found and k not in SHARD_KEYS) + tuple(
        k for k in KEY_TYPES if k in found and k in SHARD_KEYS)
    _KEYS_OF[name] = keys
    names = ", ".join(f"K_{k.upper()}" for k in keys)
    return ("-- The caller declares every key the script touches (scripts.script_keys), so a\n"
            "-- Cluster slot in migration redirects the call before anything ran.\n"
            f"if #KEYS ~= {len(keys)} then\n"
            f"  return redis.error_reply('ERR {name}.lua takes {len(keys)} keys, not ' .. #KEYS)\n"
            "end\n"
            f"for i, k in ipairs({{{names}}}) do\n"
            "  if KEYS[i] ~= k then\n"
            "    return redis.error_reply('ERR key ' .. i .. ' is ' .. KEYS[i] .. ', not ' .. k)\n"
            "  end\n"
            "end\n")


def _source(name: str, lua: Any, *, acl_checks: bool,
            receipts_kept: int = RECEIPTS_KEPT) -> str:
    body = (lua / f"{name}.lua").read_text()
    if name in SESSION_SCRIPTS:
        # The Hands and clients record their commit ids apart from the Brains' (runs_applied,
        # inbox_applied), so no role needs write access to another's records.
        applied = _applied_key(name)
        head = (f"local ACL_CHECKS = {'true' if acl_checks else 'false'}\n"
                f"local APPLIED_TTL_MS, APPLIED_MAX = {APPLIED_TTL_MS}, {APPLIED_MAX}\n"
                f"local APPLIED_SAMPLE = {APPLIED_SAMPLE}\n"
                f"local RECEIPTS_KEPT = {int(receipts_kept)}\n"
                f"local APPLIED_KEY = '{applied}'\n")
        wrapper = (lua / "_applied.lua").read_text()
        guard = _guard(name)
        lib = (lua / "_lib.lua").read_text()
        prelude = _prelude(lib, [body, wrapper, guard])
        prelude += _declared_check(name, prelude)
        if lua_profile.enabled():  # baton bench lua: a checkpoint before each statement
            body = lua_profile.profiled(name, body)
            head, wrapper = lua_profile.wrap(name, head, wrapper)
        # The body becomes a function of its own ARGV: _applied.lua strips the commit id.
        return (head + prelude + guard
                + "local function __script(ARGV)\n" + body + "\nend\n" + wrapper)
    if name in TOMBSTONE_SCRIPTS:
        lib = (lua / "_lib.lua").read_text()
        prelude = _prelude(lib, [body])
        return (f"local ACL_CHECKS = false\nlocal RECEIPTS_KEPT = {int(receipts_kept)}\n"
                + prelude + _declared_check(name, prelude) + body)
    return body


def _applied_key(script: str) -> str:
    """The commit-id record of the role running ``script`` (APPLIED_KEY in _lib.lua): the
    Hands and clients record theirs apart from the Brains', so no role needs write access
    to another's records."""
    return ("runs_applied" if script in HANDS_SCRIPTS
            else "inbox_applied" if script in INBOX_SCRIPTS else "applied")


def declared(script: str, sk: SessionKeys) -> list[str]:
    """The keys a session or tombstone script declares: every key it touches
    (:func:`script_keys`), named for session ``sk``."""
    base = sk.meta.removesuffix("meta")
    shard = sk.outbox.removesuffix("outbox")
    return [shard + SHARD_KEYS[k] if k in SHARD_KEYS
            else base + (_applied_key(script) if k == "applied" else k)
            for k in script_keys(script)]


@cache
def library_code(acl_checks: bool, receipts_kept: int = RECEIPTS_KEPT) -> tuple[str, str]:
    """The library's name and its code: one function per script, ``<library>_<script>``,
    whose body is the script's source (:func:`source`), with ``KEYS`` and ``ARGV`` its
    arguments, and ``<library>_ping`` (whether the library is there)."""
    names = (*SESSION_SCRIPTS, *SHARD_SCRIPTS, *TOMBSTONE_SCRIPTS, *LIMIT_SCRIPTS)
    sources = {n: source(n, acl_checks=acl_checks, receipts_kept=receipts_kept) for n in names}
    digest = hashlib.sha256("\0".join(f"{n}\0{s}" for n, s in sources.items()).encode())
    name = f"baton_{digest.hexdigest()[:16]}"
    parts = [f"#!lua name={name}\n",
             f"redis.register_function('{name}_ping', function() return 1 end)\n"]
    for n, text in sources.items():
        parts.append(f"redis.register_function('{name}_{n}', function(KEYS, ARGV)\n"
                     f"{text}\nend)\n")
    return name, "".join(parts)


class Library:
    """Baton's scripts as a Redis Functions library, on one client (see the module)."""

    def __init__(self, redis: Any, *, acl_checks: bool, receipts_kept: int = RECEIPTS_KEPT
                 ) -> None:
        self.redis = redis
        self.name, self.code = library_code(acl_checks, receipts_kept)

    async def load(self) -> None:
        """``FUNCTION LOAD REPLACE`` (on every primary of a cluster): the same code under
        the same name, so loading it again, or from several processes at once, changes
        nothing. A user without ``FUNCTION LOAD`` (every role's) gets
        :class:`RedisUnavailable` saying who loads it: the worker waits and tries again."""
        try:
            await self.redis.function_load(self.code, replace=True)
        except NoPermissionError:
            why = (f"Redis has no function library {self.name} (the scripts of this Baton "
                   "version) and this user may not load it: run `baton load-functions` with "
                   "the admin's Redis URL (deploy: the setup job)")
            raise RedisUnavailable(why, cause=why) from None

    async def ensure(self) -> None:
        """Load the library unless every node serving this client has it already."""
        try:
            await self.redis.execute_command("FCALL", f"{self.name}_ping", 0)
        except ResponseError as exc:
            if not missing(exc):
                raise
            await self.load()


async def load_functions(redis: Any, settings: Settings) -> list[str]:
    """Load this version's libraries (with and without the ACL checks, see :func:`source`)
    with ``redis``, a client allowed ``FUNCTION LOAD`` (the admin's); their names."""
    names = []
    for acl_checks in (True, False):
        library = Library(redis, acl_checks=acl_checks, receipts_kept=settings.receipts_kept)
        await library.load()
        names.append(library.name)
    return names


class Function:
    """One script of a :class:`Library`: ``FCALL <library>_<script>``."""

    def __init__(self, library: Library, script: str) -> None:
        self.library = library
        self.script = script
        self.name = f"{library.name}_{script}"

    def command(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The command running the script (for a pipeline or a batch)."""
        return ("FCALL", self.name, len(keys), *keys, *args)

    async def load(self) -> None:
        await self.library.load()

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Any:
        """The script's reply; a library the server does not have is loaded first."""
        try:
            return await self.library.redis.execute_command(*self.command(keys, args))
        except ResponseError as exc:
            if not missing(exc):
                raise
        await self.library.load()
        return await self.library.redis.execute_command(*self.command(keys, args))


async def pipelined(redis: Any, script: Function,
                    queue: Callable[[Any], None], *, transaction: bool) -> list[Any]:
    """Run a pipeline whose commands ``queue`` adds, ``script`` among them (queued with
    :func:`queue_call`), with results as values or exceptions.

    A library the server does not have (never loaded there, a node restarted empty) comes
    back as "function not found", and the pipeline runs once more after it is loaded.
    Nothing in it ran then: inside MULTI/EXEC the refused FCALL wrote nothing, and without
    a transaction only the pipeline's reads ran.
    """
    for attempt in (1, 2):
        async with redis.pipeline(transaction=transaction) as pipe:
            queue(pipe)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        if attempt == 1 and any(missing(r) for r in results):
            await script.load()
            continue
        return results
    raise AssertionError("unreachable")


def queue_call(pipe: Any, script: Function, keys: list[str], args: list[Any]) -> None:
    """Queue a script on a pipeline (see :func:`pipelined`)."""
    pipe.execute_command(*script.command(keys, args))


def _new_id() -> str:
    return uuid.uuid4().hex


class Scripts:
    """The scripts of one Redis client, as functions of its :class:`Library`."""

    def __init__(self, redis: Redis, *, acl_checks: bool = True,
                 receipts_kept: int = RECEIPTS_KEPT) -> None:
        self.redis = redis
        self.library = Library(redis, acl_checks=acl_checks, receipts_kept=receipts_kept)
        self._scripts: dict[str, Function] = {
            name: Function(self.library, name)
            for name in SESSION_SCRIPTS + SHARD_SCRIPTS + TOMBSTONE_SCRIPTS + LIMIT_SCRIPTS
        }

    def __getattr__(self, name: str) -> Function:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None


class ScriptRunner:
    """Runs session scripts over one session's keys; one per :class:`~baton.store.store.Store`.

    A named ACL user may lack a command a script runs later, so its scripts check that before
    writing (``acl_checks``); the default user skips the checks.

    With ``min_replicas`` > 0 (:meth:`Settings.min_replicas`: 1 on a cluster) each
    :data:`REPLICATED` transition gets a fresh commit id and is answered only after ``WAIT``
    saw that many replicas acknowledge it; one in doubt raises
    :class:`~baton.errors.WriteInDoubtError` after its retries.
    """

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.role = redis_user(settings)
        self.registered = Scripts(redis, acl_checks=self.role != "default",
                                  receipts_kept=settings.receipts_kept)
        self.namespace = settings.namespace
        self.max_payload_bytes = settings.max_payload_bytes
        self.min_replicas = settings.min_replicas()
        self.writes = ReplicatedWrites(
            redis, min_replicas=self.min_replicas, timeout_ms=settings.redis_replica_timeout_ms,
            retry_ms=settings.redis_in_doubt_retry_ms)

    def replicated(self, script: str) -> bool:
        return self.min_replicas > 0 and script in REPLICATED

    async def run(
        self, script: SessionScript, sk: SessionKeys, args: list[Any], run_id: str = "",
        *, commit_id: str | None = None,
    ) -> Any:
        """The script's reply; a Redis error becomes the matching :class:`BatonError`.

        ``commit_id``: the id of a write retried after :class:`WriteInDoubtError` (its
        ``commit_id``): the script returns the original reply if that write was applied.
        """
        if self.replicated(script):
            reply, _ = await self._replicated(script, sk, args, commit_id or _new_id(), None)
            return reply
        try:
            return await getattr(self.registered, script)(
                keys=declared(script, sk), args=[commit_id or "", *args])
        except REDIS_ERRORS as exc:
            raise self._error(exc, sk, run_id) from None

    async def run_and_read(
        self, script: SessionScript, sk: SessionKeys, args: list[Any], reads: Reads
    ) -> tuple[Any, list[Any]]:
        """The script's reply and the results of the reads ``reads`` queues, one round trip.

        Without replica acknowledgement the reads share a MULTI/EXEC with the script (a
        snapshot taken atomically after it); with it they follow the ``WAIT`` on the same
        connection, so they also see the writes of others made meanwhile (each checked by
        its own fence, as any later read would be). A read's error comes back as its result.
        """
        if self.replicated(script):
            return await self._replicated(script, sk, args, _new_id(), reads)
        registered = getattr(self.registered, script)

        def queue(pipe: Any) -> None:
            queue_call(pipe, registered, declared(script, sk), ["", *args])
            reads(pipe)

        try:
            results = await pipelined(self.registered.redis, registered, queue,
                                      transaction=True)
        except REDIS_ERRORS as exc:
            raise self._error(exc, sk, "") from None
        if isinstance(results[0], Exception):
            raise self._error(results[0], sk, "")
        return results[0], list(results[1:])

    async def _replicated(
        self, script: str, sk: SessionKeys, args: list[Any], commit_id: str,
        reads: Reads | None,
    ) -> tuple[Any, list[Any]]:
        try:
            return await self.writes.run(
                getattr(self.registered, script), declared(script, sk), [commit_id, *args],
                commit_id=commit_id, what=script, session_id=sk.session_id, reads=reads)
        except REDIS_ERRORS as exc:
            raise self._error(exc, sk, "") from None

    def _error(self, exc: Exception, sk: SessionKeys, run_id: str) -> Exception:
        return from_redis_error(exc, session_id=sk.session_id, run_id=run_id, role=self.role,
                                namespace=self.namespace)

    def check_size(self, payload: str | list[str], what: str, times: int = 1) -> None:
        """``PayloadTooLarge`` when ``payload`` is over ``times`` x ``max_payload_bytes``,
        counted in bytes of UTF-8 as Redis stores it (a character takes up to four)."""
        chars = len(payload) if isinstance(payload, str) else sum(map(len, payload))
        limit = self.max_payload_bytes * times
        if chars * 4 <= limit:  # within the limit however it is written: nothing to encode
            return
        parts = [payload] if isinstance(payload, str) else payload
        size = sum(len(p.encode("utf-8", "surrogatepass")) for p in parts)
        if size > limit:
            raise PayloadTooLarge(f"{what} is {size} bytes, over the {limit} limit", size=size)
