"""The in-process baselines of ``bench e2e``, measured before and after Baton's own sessions.

Each contender (the plain loop of :mod:`baton.bench.plain_loop`, the LangGraph agent of
:mod:`baton.bench.langgraph_peer`) runs the five-notice sessions of every concurrency level in
this process twice, one pass before Baton's session levels and one after, and its figures are
those of both passes together (the latencies pooled, sessions/s over the time of both, CPU
per timed session over both). A machine whose speed drifts during the run (a virtual
machine's neighbours, a CPU's clock) then moves a baseline and Baton's figures alike, where a
baseline measured once, after Baton, carried the drift into every ratio: in one run the plain
loop's p50 at concurrency 1 was 1.7 ms, in the next 1.2 ms, while Baton's moved by 3%. Each
pass has as many rounds per worker as Baton's level has (a pass of fewer rounds would weigh
the ramp at its start and the tail at its end more, and flatter Baton's ratios).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from baton.bench.common import Row, Run, concurrent, process_cpu_s

__all__ = ["Baseline", "pooled"]

#: (concurrency, sessions, warm-up sessions per worker)
Level = tuple[int, int, int]


def pooled(runs: list[Run]) -> Run:
    """Runs of the same level as one: their latencies together, their times (and probed
    counters, when every run has one) added."""
    probed = [r.probed for r in runs if r.probed is not None]
    return Run([s for r in runs for s in r.samples_ns], sum(r.elapsed_s for r in runs),
               sum(r.cpu_s for r in runs), sum(probed) if len(probed) == len(runs) else None)


@dataclass
class _Level:
    runs: list[Run] = field(default_factory=list)
    sessions: int = 0  # timed
    own_s: float = 0.0
    mail_s: float = 0.0


class Baseline:
    """One contender's sessions, level by level, over one or more passes."""

    def __init__(self, mode: str, operation: str, session: Callable[[], Awaitable[object]],
                 own: str, cpu_s: Callable[[int | None], float] = process_cpu_s) -> None:
        self.mode, self.operation, self.own = mode, operation, own
        self._session = session
        self._cpu_s = cpu_s  # a process's CPU seconds by pid (0 when gone or None)
        self._levels: dict[int, _Level] = {}

    async def run(self, levels: list[Level], mail_pid: int | None) -> None:
        """One pass over ``levels`` (concurrency, sessions, warm-up per worker). The CPU is
        that of the timed sessions: a warm-up opens the HTTP client's connections again (they
        expire while Baton's sessions run), which no timed session pays."""
        async def mail_cpu() -> float:
            return self._cpu_s(mail_pid)

        for conc, total, warmup in levels:
            run = await concurrent([lambda _i: self._session()] * conc,
                                   max(1, total // conc), warmup, probe=mail_cpu)
            level = self._levels.setdefault(conc, _Level())
            level.own_s += run.cpu_s
            level.mail_s += run.probed or 0.0
            level.runs.append(run)
            level.sessions += len(run.samples_ns)

    def rows(self) -> dict[int, Row]:
        """A row per concurrency over every pass."""
        return {conc: Row.from_run(self.mode, self.operation, pooled(level.runs), writers=conc)
                for conc, level in self._levels.items()}

    def figures(self) -> dict[str, dict[str, Any]]:
        """Per concurrency (``c=<n>``): sessions/s, p50 ms and CPU ms per session, for the
        bench's JSON."""
        cpu = self.cpu()
        return {f"c={c}": {"sessions_per_s": r.ops_per_s, "p50_ms": r.p50_us / 1000,
                           "cpu_ms_per_session": cpu[c]} for c, r in self.rows().items()}

    def cpu(self) -> dict[int, dict[str, float]]:
        """CPU ms per session over every pass: this process (``own``) and the mail service."""
        return {conc: {self.own: level.own_s * 1000 / level.sessions,
                       "mailbox": level.mail_s * 1000 / level.sessions}
                for conc, level in self._levels.items()}
