"""The child side of process isolation: ``python -m baton.hands.isolated``.

Runs one call of a tool declared ``isolation="process"`` (see :mod:`baton.hands.isolation`
for the parent side and why). Protocol, one JSON document each way:

    stdin   {"v": 1, "target": "module:qualname", "call": "tool" | "confirm",
             "arguments": {...}, "ctx": {"session_id", "run_id", "operation_id", "attempt"},
             "sys_path": [...], "memory_mb": 256 | null,
             "confine": {"uid": 2000000123 | null, "loopback": bool, "hide": [path, ...],
                         "expose": {closed directory: [path below it, ...]},
                         "drop_capabilities": bool}}
    stdout  {"ok": true, "output": ...}  or  {"ok": false, "code": "...", "message": "..."}

The process starts (``python -I``, in a fresh directory) with only the environment the tool
declares and no inherited file descriptors beyond stdin/stdout/stderr. Before the tool's
module is imported, :func:`confine` does what ``confine`` asks, as root in the namespaces
``unshare`` made (:mod:`baton.hands.isolation` says when): bring up the loopback of a network
namespace of its own, cover the worker's secrets in its mount namespace, show only the needed
paths of a directory the uid given could not enter (the interpreter's, say), and take that
uid; or, where it is root only in a user namespace of its own (a Hands that is not root),
drop every capability for good (bounding set, securebits, no new privileges), so that it
cannot unmount what covers the secrets; and makes the process non-dumpable. A step that
fails ends the call (``tool_unavailable``): a tool never runs less confined than its worker
asked.

Before the tool's code runs, file descriptor 1 is moved aside for the answer and pointed at
stderr, so whatever the tool prints cannot corrupt the answer; the address-space limit is set
last, once the interpreter and the tool's module are loaded, so ``memory_mb`` is what the
tool itself may allocate. Running out of it exits with :data:`EXIT_MEMORY` after writing an
answer prepared before the limit was set.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import importlib
import os
import resource
import signal
import socket
import struct
import sys
import tempfile
from typing import Any

import orjson

EXIT_MEMORY = 3  # the tool ran out of its memory limit (baton.hands.isolation reads it)
EXIT_BAD_REQUEST = 4  # the request could not be read or the tool not imported
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_MOVE, MS_REC = 4096, 8192, 16384
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 24, 28, 38
#: SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS, SECBIT_NO_CAP_AMBIENT_RAISE, each
#: with its lock: uid 0 gains no capability by execve, nor by anything else.
SECUREBITS_NONE_EVER = 0b1111_1111
CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def confine(spec: dict[str, Any]) -> None:
    """Confine this process as ``spec`` asks (see the module docstring), then make it
    non-dumpable. Raises OSError when a step fails."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    if spec.get("loopback"):  # a new network namespace's lo is down
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            got = fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
            flags = struct.unpack("16sH14x", got)[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    for path in spec.get("hide", []):
        if os.path.isdir(path):
            check(libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs",
                             MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                             b"mode=0,size=4k,nr_inodes=1"), f"covering {path}")
        else:
            check(libc.mount(b"/dev/null", os.fsencode(path), None, MS_BIND, None),
                  f"covering {path}")
    for closed, paths in spec.get("expose", {}).items():
        _expose(closed, paths, check, libc)
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        # A change of uid clears the parent-death signal unshare --kill-child set.
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    if spec.get("drop_capabilities"):
        _drop_capabilities(check, libc)
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")


def _drop_capabilities(check: Any, libc: Any) -> None:
    """Give up every capability, for good: this process and whatever it runs next (root of
    its user namespace) could otherwise unmount the secrets' covers or remount /proc."""
    with open("/proc/sys/kernel/cap_last_cap") as found:
        last = int(found.read())
    for cap in range(last + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    check(libc.prctl(PR_SET_SECUREBITS, SECUREBITS_NONE_EVER, 0, 0, 0), "PR_SET_SECUREBITS")
    header = struct.pack("Ii", CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(6 * 4)  # effective, permitted, inheritable; twice: 0
    check(libc.capset(header, data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


def _expose(closed: str, paths: list[str], check: Any, libc: Any) -> None:
    """Replace ``closed`` with a root-owned tmpfs showing only ``paths`` (bound from where
    they are, through a staging directory only root may enter)."""
    stage = tempfile.mkdtemp(prefix="baton-expose-")
    try:
        staged = []
        for i, path in enumerate(paths):
            point = os.path.join(stage, str(i))
            _mount_point(point, path)
            check(libc.mount(os.fsencode(path), os.fsencode(point), None, MS_BIND | MS_REC,
                             None), f"binding {path}")
            staged.append((point, path))
        check(libc.mount(b"tmpfs", os.fsencode(closed), b"tmpfs", MS_NOSUID | MS_NODEV,
                         b"mode=755,size=64k"), f"replacing {closed}")
        for point, path in staged:
            _mount_point(path, point)
            check(libc.mount(os.fsencode(point), os.fsencode(path), None, MS_MOVE, None),
                  f"showing {path}")
    finally:
        for entry in os.listdir(stage):
            (os.rmdir if os.path.isdir(os.path.join(stage, entry)) else os.unlink)(
                os.path.join(stage, entry))
        os.rmdir(stage)


def _mount_point(point: str, like: str) -> None:
    """An empty directory or file at ``point`` for ``like`` (a directory or a file)."""
    if os.path.isdir(like):
        os.makedirs(point, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(point), exist_ok=True)
        open(point, "a").close()


def _answer(fd: int, payload: dict[str, Any]) -> None:
    try:
        data = orjson.dumps(payload)
    except TypeError:  # values JSON has no form for: their text, where they are
        try:
            data = orjson.dumps(payload, default=repr, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:
            data = orjson.dumps({**payload, "output": repr(payload.get("output"))})
    _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _virtual_size() -> int:
    """This process's address space in bytes (what RLIMIT_AS counts)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _resolve(target: str) -> Any:
    """The Tool a ``module:qualname`` names: the decorator left a Tool at that name; a
    ``Tool(fn, ...)`` built by hand is found among the module's globals by its function."""
    from baton.app import Tool

    module_name, _, qualname = target.partition(":")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, Tool):
        return obj
    # Declared as Tool(fn, ...) rather than by the decorator: the name is the function.
    for value in vars(module).values():
        if isinstance(value, Tool) and value.fn is obj:
            return value
    raise TypeError(f"{target} is not a baton tool (got {type(obj).__name__})")


async def _call(tool: Any, request: dict[str, Any]) -> Any:
    import httpx

    from baton.app import ToolContext
    from baton.observability.log import get_logger
    from baton.settings import Settings

    args = tool.parse_args(request["arguments"])
    c = request["ctx"]
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        # Settings() are the defaults, not the worker's: nothing here may reach its stores.
        ctx = ToolContext(
            session_id=c["session_id"], run_id=c["run_id"], operation_id=c["operation_id"],
            attempt=c["attempt"], settings=Settings(), http=http,
            log=get_logger("baton.tool").bind(tool=tool.name),
        )
        if request["call"] == "confirm":
            return await tool.confirm_fn(c["operation_id"], args, ctx)
        return await tool.fn(args, ctx)


def main() -> int:
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # the tool's prints go to stderr, never into the answer
    try:
        request = orjson.loads(sys.stdin.buffer.read())
        if sys.platform.startswith("linux"):
            confine(request.get("confine", {}))
        for path in request.get("sys_path", []):
            if path not in sys.path:
                sys.path.append(path)
        tool = _resolve(request["target"])
    except Exception as exc:
        _answer(answer_fd, {"ok": False, "code": "tool_unavailable",
                            "message": f"isolated tool could not start: "
                                       f"{type(exc).__name__}: {exc}"})
        return EXIT_BAD_REQUEST
    out_of_memory = orjson.dumps({
        "ok": False, "code": "tool_memory_limit",
        "message": f"{tool.name} exceeded its memory limit of {request.get('memory_mb')} MB",
    })
    if request.get("memory_mb"):
        limit = _virtual_size() + int(request["memory_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        output = asyncio.run(_call(tool, request))
    except MemoryError:
        _write_all(answer_fd, out_of_memory)
        os._exit(EXIT_MEMORY)  # unwinding may need memory there is none of
    except Exception as exc:
        from baton.errors import ToolError, ValidationError

        if isinstance(exc, ValidationError):
            code = "invalid_arguments"
        elif isinstance(exc, ToolError):
            code = exc.code
        else:
            code = "tool_exception"
        text = str(exc)
        message = text if isinstance(exc, ToolError | ValidationError) else (
            f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
        _answer(answer_fd, {"ok": False, "code": code, "message": message})
        return 0
    _answer(answer_fd, {"ok": True, "output": output})
    return 0


if __name__ == "__main__":
    sys.exit(main())
