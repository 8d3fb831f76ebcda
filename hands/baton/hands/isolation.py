"""Process isolation for tools declared ``isolation="process"``: the parent side.

A Hands worker holds credentials that let it write tool-run records; the tools it runs are
the least trusted code of the system (interpreters, browsers, third-party clients). A tool
declared with process isolation runs each call in a fresh child
(``python -m baton.hands.isolated``, see there for the protocol) that gets:

- only the environment the tool declares (``env=``): no ``BATON_*`` variables, no URLs,
  no passwords; nothing secret in its argv either (the request travels on stdin);
- no file descriptors but stdin, stdout and stderr (``close_fds``), so no inherited Redis or
  NATS socket;
- an address-space limit (``memory_mb``, RLIMIT_AS set in the child) and a wall-time limit
  (``wall_time_s``; the child and everything it started are killed when it passes);
- ``python -I`` (no working directory, user site or ``PYTHON*`` variable on its path) in a
  fresh directory of its own, removed after: a file a tool writes there reaches no later
  child;
- non-dumpable (``prctl(PR_SET_DUMPABLE, 0)`` before the tool runs): no other process of its
  user reads its ``/proc/<pid>/environ`` or memory, or attaches to it.

Where the Hands runs as root on Linux with ``unshare`` (util-linux), each child is confined
further (:func:`confinement` says what this machine allows, logged once at start):

- its own PID namespace (``unshare --pid --fork --mount-proc``): it sees only its own
  processes, and its end (or the wall-time kill, which reaches the namespace's first process
  directly) ends every process in it, a grandchild that ``setsid()``-ed out of the process
  group included;
- its own network namespace with only a loopback of its own, unless the tool declares
  ``network=True``;
- its own mount namespace, where the worker's secrets are covered by an empty read-only
  tmpfs (or ``/dev/null`` for a file): ``$BATON_HOME`` (the dev stack's ``credentials.json``,
  TLS key and API tokens) and the NATS credentials and TLS keys the settings name;
- its own uid and gid, taken at random from a range no account uses (:data:`TOOL_UIDS`), and
  no supplementary groups: it reads only what any user may (not the worker's ``0600`` files)
  and can signal, trace or read no other child. Where the interpreter or a directory on
  ``sys.path`` lies below a directory other users may not enter (a pyenv under ``/root``),
  that directory is replaced, in the child's mount namespace, by one holding only what the
  child needs (:func:`exposed`).

Without root (a Kubernetes pod that drops every capability, say), where the kernel lets an
unprivileged process make a user namespace, each child gets the same PID, mount and network
namespaces, made in a user namespace of its own (``unshare --user --map-root-user``): it is
root there (mapped to the worker's uid outside), which lets it mount its own ``/proc``, bring
up its loopback and cover the secrets, and then drops every capability for good (bounding
set, locked securebits, no new privileges) before the tool's module is imported, so it
cannot unmount those covers, nor gain a capability by running anything. What it does not get
is a uid of its own: only the worker's uid is mapped, and taking another needs root. So it
reads and writes every file the worker may (its ``0600`` files included, less the secrets
covered) and a file it leaves outside its directory reaches later children; another child it
cannot see, signal or read (their PID namespaces differ; each is non-dumpable). This is logged
as ``tool_isolation_degraded`` with ``namespaces=user,pid,mount,net``.

Where the kernel refuses that (``user.max_user_namespaces`` 0, Debian's
``kernel.unprivileged_userns_clone`` 0, Ubuntu's AppArmor restriction, a container runtime's
default seccomp profile, which denies ``unshare`` without ``CAP_SYS_ADMIN``, or a container's
``/proc`` with masked paths, which a new PID namespace may not mount again), a child gets the
first list only: it runs as the worker's user, with the worker's network, sees every process
and file the worker does, and a grandchild that leaves the process group outlives the kill.
The reason is logged (``tool_isolation_degraded``, ``namespaces=none``); give such tools their
own pod, allow user namespaces (``deploy/k8s/hands.yaml`` says how), or run the Hands as root
in its container.

Its crash, hang or memory blow-up becomes a :class:`~baton.errors.ToolError` with code
``tool_crashed``, ``tool_timeout`` or ``tool_memory_limit``: a result of that attempt (the
replay policy decides what happens next), never the worker's end. The parent keeps
heartbeating the attempt meanwhile (:meth:`~baton.hands.execute.ToolExecution._supervised`
runs this like any tool call) and kills the child when the attempt is cancelled or lost.

What this does not do: the worker itself is made non-dumpable (:func:`harden_worker`,
called by ``baton hands`` when it serves an isolated tool) but root in a child (a tool of a
non-root Hands cannot get it; root of its own user namespace is not, and is given up) would
bypass all of the above; the child's view of the file
system is the worker's, less the secrets named above (it reads every world-readable file);
it keeps running if the worker itself is killed, until it ends (its wall time is the
worker's to enforce).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from baton.app import Tool, ToolContext
from baton.errors import ToolError
from baton.observability.log import bounded, get_logger
from baton.settings import Settings

__all__ = ["Confinement", "confinement", "harden_worker", "run_isolated"]

log = get_logger("baton.hands")

STDERR_TAIL = 4_096  # bytes of the child's stderr kept for a crash report
ANSWER_SLACK = 64 * 1024  # an answer may exceed the payload limit by this before it is cut off
PR_SET_DUMPABLE = 4
EXIT_MEMORY = 3  # the child's status when the tool ran out of memory (baton.hands.isolated)
#: The uids (each also the child's gid) children of a root Hands run as, one at random per
#: child: above the ranges distributions give accounts and containers' user namespaces
#: commonly map, below 2**31 (tools that keep a uid in a signed int).
TOOL_UIDS = range(2_000_000_000, 2_100_000_000)
#: What ``unshare`` is asked for: PID and mount namespaces (with a /proc of that PID
#: namespace), the child killed if unshare itself ends; ``--net`` is added per tool.
UNSHARE = ("--pid", "--fork", "--mount-proc", "--kill-child")
#: Put before :data:`UNSHARE` where the Hands is not root: the namespaces are made in a user
#: namespace of the child's own, where it is root (mapped to the worker's uid) until
#: :func:`baton.hands.isolated.confine` has set them up and drops every capability.
USER_NAMESPACE = ("--user", "--map-root-user")


@dataclass(frozen=True)
class Confinement:
    """What this machine lets a child be confined by, beyond ``-I``, a fresh directory and
    non-dumpability (which every child gets)."""

    #: ``unshare`` to start children in their own PID, mount and network namespaces, or "".
    unshare: str
    #: Whether children run as uids of their own (:data:`TOOL_UIDS`): the worker is root.
    own_uid: bool
    #: Why not all of it, for the log; "" when children are fully confined.
    missing: str
    #: Whether those namespaces are made in a user namespace of the child's own
    #: (:data:`USER_NAMESPACE`): the Hands is not root.
    user_namespace: bool = False

    @property
    def namespaces(self) -> str:
        """The namespaces a child gets, for the log ("none", "pid,mount,net", ...)."""
        if not self.unshare:
            return "none"
        return ("user," if self.user_namespace else "") + "pid,mount,net"


@functools.cache
def confinement() -> Confinement:
    """Probe once (a namespace started and ended, ~10 ms) what confines children here."""
    if not sys.platform.startswith("linux"):
        return Confinement("", False, "not Linux: no namespaces, no uid of their own")
    if os.geteuid() != 0:
        return _unprivileged(shutil.which("unshare"))
    found = shutil.which("unshare")
    if found is None:
        return Confinement("", True, "no unshare (util-linux) on PATH: children keep the "
                                     "Hands' network, file system view and process list")
    try:
        probe = subprocess.run([found, *UNSHARE, "--net", "--", "true"], capture_output=True,
                               timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Confinement("", True, f"unshare did not run: {exc}")
    if probe.returncode != 0:
        return Confinement("", True, "unshare failed (a seccomp profile or missing "
                                     "capability?): " + bounded(probe.stderr.decode(
                                         errors="replace").strip(), 300))
    return Confinement(found, True, "")


def _unprivileged(found: str | None) -> Confinement:
    """What confines children of a Hands that is not root: the namespaces, made in a user
    namespace of their own where the kernel allows it; never a uid of their own."""
    unconfined = "children keep its uid, network, file system view and process list"
    if found is None:
        return Confinement("", False, "the Hands is not root and there is no unshare "
                                      f"(util-linux) on PATH: {unconfined}")
    try:
        probe = subprocess.run([found, *USER_NAMESPACE, *UNSHARE, "--net", "--", "true"],
                               capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Confinement("", False, f"the Hands is not root and unshare did not run "
                                      f"({exc}): {unconfined}")
    if probe.returncode != 0:
        said = bounded(probe.stderr.decode(errors="replace").strip(), 300)
        return Confinement("", False, f"the Hands is not root and may not make a user "
                                      f"namespace ({_why_no_user_namespace(said)}): "
                                      f"{unconfined}; unshare said: {said}")
    return Confinement(found, False, "the Hands is not root: children get their own user, "
                                     "PID, mount and network namespaces but keep its uid "
                                     "(they read what it can, less the secrets covered)",
                       user_namespace=True)


def _why_no_user_namespace(said: str) -> str:
    """The likeliest reason this machine refuses an unprivileged user namespace, from what
    ``unshare`` ``said``."""
    if "mount /proc" in said:  # the namespaces were made; their /proc may not be mounted
        return ("this /proc has masked paths, as a container's has, so a PID namespace may "
                "not mount one of its own")
    for path, refusing, reason in (
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces is 0"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0",
         "kernel.unprivileged_userns_clone is 0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
         "AppArmor restricts unprivileged user namespaces"),
    ):
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == refusing:
                return reason
    return "a seccomp profile that denies unshare, such as a container runtime's default?"


def harden_worker() -> None:
    """Make this process non-dumpable: a same-user child can no longer read its
    ``/proc/<pid>/environ`` or ``/proc/<pid>/mem``, nor attach to it (Linux only); and say
    how its isolated tools' children will be confined."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    found = confinement()
    if found.missing:
        log.warning("tool_isolation_degraded", reason=found.missing,
                    namespaces=found.namespaces)
    else:
        log.info("tool_isolation", namespaces="pid,mount,net", uid="own")


def secret_paths(settings: Settings) -> list[str]:
    """What a child's mount namespace covers: the worker's ``$BATON_HOME`` (``baton dev``'s
    stack: its credentials.json, TLS keys, API tokens) and the secret files its settings
    name, those that exist."""
    home = os.environ.get("BATON_HOME") or os.path.join(os.getcwd(), ".baton")
    named = (home, settings.nats_creds, settings.nats_tls_key, settings.redis_tls_key)
    return sorted({os.path.realpath(p) for p in named if p and os.path.exists(p)})


def exposed(needed: list[str]) -> dict[str, list[str]]:
    """The directories other users may not enter (no ``o+x``) above paths a child needs, each
    with the needed paths below it: what the child's mount namespace shows of it."""
    found: dict[str, list[str]] = {}
    for path in sorted({os.path.realpath(p) for p in needed if os.path.exists(p)}, key=len):
        for above in reversed(Path(path).parents):  # from the root down
            try:
                closed = not os.stat(above).st_mode & 0o001
            except OSError:
                break
            if closed:
                kept = found.setdefault(str(above), [])
                if not any(path == k or path.startswith(k + os.sep) for k in kept):
                    kept.append(path)
                break
    return found


async def run_isolated(
    tool: Tool, call: str, args: BaseModel, ctx: ToolContext, *, max_answer: int
) -> Any:
    """Run ``tool`` (``call`` = "tool" or "confirm") once in a child; its output, or a
    :class:`ToolError` saying why there is none."""
    found = await asyncio.to_thread(confinement)  # probed once; at start under ``baton hands``
    workdir = tempfile.mkdtemp(prefix="baton-tool-")
    uid = secrets.choice(TOOL_UIDS) if found.own_uid else None
    if uid is not None:
        os.chown(workdir, uid, uid)
    needed = [sys.executable, sys.prefix, sys.base_prefix, *(p for p in sys.path if p)]
    request = orjson.dumps({
        "v": 1, "target": tool.target, "call": call,
        "arguments": args.model_dump(mode="json"),
        "ctx": {"session_id": ctx.session_id, "run_id": ctx.run_id,
                "operation_id": ctx.operation_id, "attempt": ctx.attempt},
        "sys_path": [p for p in sys.path if p],
        "memory_mb": tool.memory_mb,
        "confine": {
            "uid": uid,
            "loopback": bool(found.unshare) and not tool.network,
            # Covered in its own mount namespace; never a directory the child runs from.
            "hide": [p for p in secret_paths(ctx.settings) if not any(
                n == p or n.startswith(p + os.sep) for n in [workdir, *needed])]
            if found.unshare else [],
            "expose": exposed(needed) if found.unshare and uid is not None else {},
            # Root in its own user namespace, it could otherwise unmount what covers them.
            "drop_capabilities": found.user_namespace,
        },
    })
    argv = [sys.executable, "-I", "-m", "baton.hands.isolated"]
    if found.unshare:
        argv = [found.unshare, *(USER_NAMESPACE if found.user_namespace else ()), *UNSHARE,
                *(() if tool.network else ("--net",)), "--", *argv]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=dict(tool.env), close_fds=True, cwd=workdir,
            start_new_session=True,  # its own process group: a kill reaches what it spawned
        )
        try:
            async with asyncio.timeout(tool.wall_time_s) as deadline:
                answer, tail = await _exchange(proc, request, max_answer + ANSWER_SLACK)
                code = await proc.wait()
        except TimeoutError:
            if deadline.expired():
                raise ToolError(f"{tool.name} did not finish within its wall time of "
                                f"{tool.wall_time_s:g}s and was killed", "tool_timeout") from None
            raise
        finally:
            if proc.returncode is None:  # deadline, cancellation (taken over, cancelled), error
                _kill(proc, namespaced=bool(found.unshare))
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, ignore_errors=True)
    return _outcome(tool, answer, tail, code)


async def _exchange(
    proc: asyncio.subprocess.Process, request: bytes, limit: int
) -> tuple[bytes, bytes]:
    """Send the request, read the answer (at most ``limit`` bytes) and the stderr tail."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr

    async def answer() -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await stdout.read(65536):
            size += len(chunk)
            if size > limit:
                raise ToolError(f"the isolated tool answered more than {limit} bytes",
                                "tool_output_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def tail() -> bytes:
        kept = b""
        while chunk := await stderr.read(65536):
            kept = (kept + chunk)[-STDERR_TAIL:]
        return kept

    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(request)
        await proc.stdin.drain()
        proc.stdin.close()
    reading = asyncio.gather(answer(), tail())
    try:
        got_answer, got_tail = await reading
    except BaseException:
        reading.cancel()
        raise
    return got_answer, got_tail


def _outcome(tool: Tool, answer: bytes, tail: bytes, code: int) -> Any:
    """The tool's output from the child's answer and exit status, or the ToolError."""
    reply: dict[str, Any] | None = None
    if answer:
        with contextlib.suppress(orjson.JSONDecodeError):
            decoded = orjson.loads(answer)
            reply = decoded if isinstance(decoded, dict) else None
    if reply is not None and reply.get("ok") is True and code == 0:
        return reply.get("output")
    if reply is not None and reply.get("ok") is False:
        raise ToolError(bounded(reply.get("message", "")), str(reply.get("code", "tool_error")))
    if code == EXIT_MEMORY:
        raise ToolError(f"{tool.name} exceeded its memory limit of {tool.memory_mb} MB",
                        "tool_memory_limit")
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 and \
        -code in signal.valid_signals() else f"exited with status {code}"
    stderr = tail.decode(errors="replace").strip()
    log.warning("isolated_tool_crashed", status=code, stderr=bounded(stderr, 1000))
    raise ToolError(f"{tool.name} {how} without an answer"
                    + (f"; its last output: {bounded(stderr, 500)}" if stderr else ""),
                    "tool_crashed")


def _kill(proc: asyncio.subprocess.Process, *, namespaced: bool) -> None:
    """SIGKILL the child and whatever it started.

    In a PID namespace, the namespace's first process (unshare's child) is killed directly:
    its end ends every process in the namespace, whatever process group or session each
    moved to, and it is killed even if it left unshare's group itself. Then unshare's
    process group: the child without a namespace, and what it started.
    """
    if namespaced:
        for pid in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``. While ``pid`` has not been reaped, its
    children (alive, or ended and unreaped) keep their pids: none can be another's."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: every process's stat
        pass
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rpartition(")")[2].split()[1] == str(pid):
                found.append(int(entry))
    return found
