"""The namespace kit itself: members reach each other, cuts and isolation drop traffic and
heal, and nothing (namespace, veth pair, bridge) outlives the kit, even after a failure.

Quick (well under a second each), so they run by default wherever root is available.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from baton.devkit.netns import HOST, Netns, sweep


def _leftovers(net: Netns) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    ours = [line.split()[0] for line in names.splitlines() if f"-{net.pid}-" in line]
    return ours + [w for w in links.split() if w.startswith((net.bridge, f"btv{net.pid}-"))]


def _reaches(net: Netns, src: str, dst: str) -> bool:
    """Whether a TCP connect from ``src`` to a listener in ``dst`` succeeds within 0.3 s."""
    code = ("import socket,sys\n"
            "s=socket.create_server((sys.argv[1],0));print(s.getsockname()[1],flush=True)\n"
            "s.settimeout(5)\n"
            "try: s.accept()\n"
            "except OSError: pass\n")
    argv = [sys.executable, "-c", code, net.address(dst)]
    server = subprocess.Popen([*([] if dst == HOST else net.wrapper(dst)), *argv],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        probe = ("import socket,sys\n"
                 "try: socket.create_connection((sys.argv[1],int(sys.argv[2])),0.3)\n"
                 "except OSError: sys.exit(1)\n")
        pre = [] if src == HOST else list(net.wrapper(src))
        return subprocess.run([*pre, sys.executable, "-c", probe, net.address(dst), str(port)],
                              check=False).returncode == 0
    finally:
        server.kill()
        server.wait()


def test_cuts_isolation_and_heal_between_members() -> None:
    with Netns(["a", "b", "c"]) as net:
        assert _reaches(net, "a", "b") and _reaches(net, "c", HOST)
        net.cut("a", "b")
        assert not _reaches(net, "a", "b") and not _reaches(net, "b", "a")
        assert _reaches(net, "a", "c") and _reaches(net, HOST, "a")
        net.isolate("c")
        assert not _reaches(net, HOST, "c")
        net.heal()
        assert _reaches(net, "a", "b") and _reaches(net, HOST, "c")
    assert _leftovers(net) == []


def test_nothing_is_left_behind_when_the_body_fails() -> None:
    with pytest.raises(RuntimeError), Netns(["a"]) as net:
        net.isolate("a")
        raise RuntimeError("boom")
    assert _leftovers(net) == []


def test_a_dead_creators_namespaces_are_swept() -> None:
    # A child creates a namespace set and dies without closing it (as a SIGKILLed run).
    code = ("from baton.devkit.netns import Netns\n"
            "import os\nn = Netns(['a', 'b']); n.create(); print(n.pid, flush=True)\n"
            "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    pid = int(out)
    assert f"baton-{pid}-0" in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                              text=True).stdout
    removed = sweep()
    assert f"baton-{pid}-0" in removed and f"btb{pid}" in removed
    assert f"baton-{pid}-" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                 text=True).stdout
