"""Linux network namespaces for partition tests: one namespace per member, cuts on demand.

:class:`Netns` builds a small private network: a bridge in the host namespace holding the
address ``<prefix>.1`` and, for every member name, a namespace ``baton-<pid>-<n>`` joined to
the bridge by a veth pair, with the address ``<prefix>.<n + 2>`` on its ``eth0``. The host
(the test process, anything started normally) reaches every member through the bridge;
members reach each other and the host. A server is placed in a member with :meth:`place`
(it then binds the member's address and is started through ``ip netns exec``).

Partitions are cuts, not delays (no ``netem`` here):

* :meth:`isolate` sets the member's host-side veth down: it reaches nobody and nobody
  reaches it, host included;
* :meth:`cut` drops the traffic between two members only, both ways, with blackhole routes
  inside each of their namespaces (silently dropped, as a partition does, not refused);
  ``"host"`` names the host side (its address on the bridge), cut by a route inside the
  member only;
* :meth:`heal` undoes every cut and isolation.

Creating needs root (``CAP_NET_ADMIN``) and ``ip`` from iproute2; :func:`unavailable` says why
not, for tests to skip with. Everything created is removed on :meth:`close` (also when
creation failed part-way): deleting a namespace deletes its veth pair. Namespaces whose
creating process has died (a SIGKILLed test run) are removed by :func:`sweep` at the next
creation, so a crash leaves nothing behind for long.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterable
from types import TracebackType
from typing import Protocol, Self

from baton.errors import ServerError
from baton.observability.log import get_logger

__all__ = ["HOST", "Netns", "Placeable", "sweep", "unavailable"]

log = get_logger("baton.devkit.netns")

HOST = "host"
_PREFIX = "baton-"
_NAME = re.compile(rf"^{_PREFIX}(\d+)-(\d+)$")


class Placeable(Protocol):
    """A server that can run inside a member: binds ``host``, spawned through ``wrapper``."""

    host: str
    wrapper: tuple[str, ...]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ServerError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}", server="netns")
    return proc


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if shutil.which("ip") is None:
        return "network namespaces need `ip` (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    probe = f"{_PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Remove the namespaces and bridges of creators that are gone; returns what it removed."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not _alive(int(match[1])):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        match = re.match(r"^\d+:\s+btb(\d+)[:@]", line)
        if match and not _alive(int(match[1])):
            _ip("link", "del", f"btb{match[1]}", check=False)
            removed.append(f"btb{match[1]}")
    return removed


class Netns:
    """Members in their own namespaces on one bridge; see the module docstring.

    One per process at a time (names derive from the PID). ``async with`` or ``with`` it, or
    call :meth:`create` / :meth:`close` (idempotent).
    """

    def __init__(self, members: Iterable[str]) -> None:
        self.members = list(members)
        if len(set(self.members)) != len(self.members) or HOST in self.members:
            raise ValueError(f"member names must be unique and not {HOST!r}")
        if len(self.members) > 250:
            raise ValueError("at most 250 members")
        self.pid = os.getpid()
        self.bridge = f"btb{self.pid}"
        self.prefix = f"10.{random.randint(64, 127)}.{random.randint(0, 255)}"
        self.isolated: set[str] = set()
        self.cuts: set[frozenset[str]] = set()
        self._created = False

    # ------------------------------------------------------------------ addresses

    def ns(self, member: str) -> str:
        return f"{_PREFIX}{self.pid}-{self.members.index(member)}"

    def _veth(self, member: str) -> str:
        return f"btv{self.pid}-{self.members.index(member)}"[:15]

    def address(self, member: str) -> str:
        """The member's address (``"host"``: the host's address on the bridge)."""
        if member == HOST:
            return f"{self.prefix}.1"
        return f"{self.prefix}.{self.members.index(member) + 2}"

    def wrapper(self, member: str) -> tuple[str, ...]:
        """The argv prefix that runs a command inside the member's namespace."""
        return ("ip", "netns", "exec", self.ns(member))

    def place(self, server: Placeable, member: str) -> None:
        """Make ``server`` (not started yet) run in ``member``, bound to its address."""
        server.host = self.address(member)
        server.wrapper = self.wrapper(member)

    # ------------------------------------------------------------------ lifecycle

    def create(self) -> None:
        if self._created:
            return
        sweep()
        self._created = True  # from here on close() has something to remove
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address(HOST)}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for member in self.members:
                ns, veth = self.ns(member), self._veth(member)
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(member)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        log.info("netns_created", bridge=self.bridge, members=len(self.members),
                 prefix=self.prefix)

    def close(self) -> None:
        """Remove every namespace, veth pair and the bridge (idempotent, never raises)."""
        if not self._created:
            return
        for member in self.members:
            _ip("netns", "del", self.ns(member), check=False)  # takes its veth pair along
            _ip("link", "del", self._veth(member), check=False)
        _ip("link", "del", self.bridge, check=False)
        self._created = False
        self.isolated.clear()
        self.cuts.clear()

    def __enter__(self) -> Self:
        self.create()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ partitions

    def isolate(self, *members: str) -> None:
        """Cut each member off from everyone (its link goes down)."""
        for member in members:
            _ip("link", "set", self._veth(member), "down")
            self.isolated.add(member)
        log.info("netns_isolated", members=list(members))

    def cut(self, a: str, b: str) -> None:
        """Drop all traffic between ``a`` and ``b`` (either may be ``"host"``), both ways."""
        if a == b:
            raise ValueError("a member cannot be cut from itself")
        for src, dst in ((a, b), (b, a)):
            if src != HOST:
                _ip("-n", self.ns(src), "route", "replace", "blackhole",
                    f"{self.address(dst)}/32")
        self.cuts.add(frozenset((a, b)))
        log.info("netns_cut", a=a, b=b)

    def split(self, side: Iterable[str], other: Iterable[str] | None = None) -> None:
        """Cut every member of ``side`` from every member of ``other`` (default: the rest)."""
        one = list(side)
        two = list(other) if other is not None else [m for m in self.members if m not in one]
        for a in one:
            for b in two:
                self.cut(a, b)

    def heal(self) -> None:
        """Undo every cut and isolation."""
        for member in sorted(self.isolated):
            _ip("link", "set", self._veth(member), "up")
        for pair in self.cuts:
            a, b = sorted(pair)
            for src, dst in ((a, b), (b, a)):
                if src != HOST:
                    _ip("-n", self.ns(src), "route", "del", "blackhole",
                        f"{self.address(dst)}/32", check=False)
        log.info("netns_healed", isolated=sorted(self.isolated), cuts=len(self.cuts))
        self.isolated.clear()
        self.cuts.clear()
