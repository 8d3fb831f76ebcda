"""Child processes of a local stack (:mod:`baton.devkit.devstack`): each one a :class:`Proc`
(one incarnation at a time, the same name across restarts), started by a
:class:`Supervisor` that, when asked to supervise, starts again a child that exits on its
own after a backoff (the way an orchestrator would), and stopped by :func:`terminate`
(SIGTERM, then SIGKILL past a timeout).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.observability.log import get_logger

__all__ = ["Proc", "Supervisor", "keep_previous_log", "terminate"]

log = get_logger("baton.dev")

_BACKOFF_S = (0.3, 1.0, 3.0)  # by consecutive quick crashes; reset after a stable run
_STABLE_S = 10.0


@dataclass(eq=False)
class Proc:
    """One supervised child process (one incarnation at a time, same name across restarts)."""

    role: str
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    wrapper: tuple[str, ...] = ()  # argv prefix: its network namespace (netns stacks)
    member: str = ""  # its member of the stack's Netns ("" outside one)
    restarts: int = 0
    respawn: bool = True
    paused: bool = False
    started_at: float = 0.0
    crashes: int = 0  # consecutive quick exits, for the backoff
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def info(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "pid": self.pid,
                "alive": self.alive, "restarts": self.restarts}

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def keep_previous_log(path: Path) -> None:
    """A stack started again in the same directory keeps the last run's log as
    ``<name>.previous.log`` (one run back): after a crash and a restart it is the one that
    says what happened."""
    try:
        if path.stat().st_size:
            path.replace(path.with_name(f"{path.stem}.previous{path.suffix}"))
    except FileNotFoundError:
        pass


class Supervisor:
    """Starts :class:`Proc` children with the stack's environment; with ``supervise`` it
    watches each one and starts it again whenever it exits, until :attr:`stopping` is set
    or the process's ``respawn`` is off (``on_restart`` is told after each restart)."""

    def __init__(self, env: dict[str, str], *, supervise: bool = True,
                 on_restart: Callable[[], Any] | None = None) -> None:
        self.env = env  # the stack's extra variables, under each process's own
        self.supervise = supervise
        self.on_restart = on_restart
        self.stopping = False

    async def launch(self, proc: Proc) -> None:
        env = {**os.environ, **self.env, **proc.env, "PYTHONUNBUFFERED": "1"}
        mode = "ab" if proc.started_at else "wb"
        if not proc.started_at:
            keep_previous_log(proc.log_path)
        with proc.log_path.open(mode) as out:
            proc.process = await asyncio.create_subprocess_exec(
                *proc.wrapper, *proc.argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C is for the supervisor only
            )
        proc.started_at = time.monotonic()
        if self.supervise and (proc.watcher is None or proc.watcher.done()):
            proc.watcher = asyncio.create_task(self._watch(proc), name=f"watch-{proc.name}")

    async def _watch(self, proc: Proc) -> None:
        """Restart ``proc`` whenever it exits, until the stack stops or respawn is off."""
        while True:
            assert proc.process is not None
            code = await proc.process.wait()
            if self.stopping or not proc.respawn:
                log.info("process_exited", name=proc.name, code=code, respawn=False)
                return
            quick = time.monotonic() - proc.started_at < _STABLE_S
            proc.crashes = proc.crashes + 1 if quick else 1
            delay = _BACKOFF_S[min(proc.crashes, len(_BACKOFF_S)) - 1]
            # exit 0 is a stop it was asked for (SIGTERM drained it), not a crash
            (log.info if code == 0 else log.warning)(
                "process_exited", name=proc.name, code=code, restart_in_s=delay)
            await asyncio.sleep(delay)  # backoff before the restart
            if self.stopping or not proc.respawn:
                return
            await self.launch(proc)
            proc.restarts += 1
            if self.on_restart is not None:
                self.on_restart()


async def terminate(procs: list[Proc], timeout: float) -> None:  # noqa: ASYNC109
    """SIGTERM (and SIGCONT, so a paused child can act on it); SIGKILL what outlives timeout."""
    live = [p for p in procs if p.alive]
    for p in live:
        assert p.process is not None
        p.process.send_signal(signal.SIGTERM)
        if p.paused:
            p.process.send_signal(signal.SIGCONT)
            p.paused = False
    if not live:
        return
    waits = [asyncio.ensure_future(p.process.wait()) for p in live if p.process is not None]
    _, pending = await asyncio.wait(waits, timeout=timeout)
    for p in live:
        if p.alive and p.process is not None:
            log.warning("process_killed_after_timeout", name=p.name, pid=p.pid)
            p.process.kill()
    if pending:
        await asyncio.gather(*pending)
