"""The floors bench e2e sets beside its targets: what the design's own hops and commits cost
in the run (baton.bench.floors)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from baton.bench.common import Row
from baton.bench.floors import FURTHER_COMMITS, RELAY_HOPS_HELD, floors


def _row(p50_us: float, client_cpu_us: float | None = None,
         server_cpu_us: float | None = None, ops_per_s: float = 100.0) -> Row:
    return Row("m", "op", 1, 10, p50_us, p50_us, ops_per_s, client_cpu_us=client_cpu_us,
               server_cpu_us=server_cpu_us)


def test_the_c1_floor_counts_the_relay_hops_the_tool_and_the_commits_in_a_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_BRAIN_HOLD_MS", "100")  # held: two relay hops
    out = io.StringIO()
    got = floors(chain=_row(1000), flows=_row(20_000, 500, 300), commit=_row(200, 150, 100),
                 tool_p50_us=1500, c1=_row(20_000), p1=_row(2000), p32=_row(0, ops_per_s=500),
                 plain32={"mailbox": 1.5, "loop": 2.0},
                 console=Console(file=out, width=400),
                 c1_target=2.5, c32_target=0.4)
    c1 = got["c1_floor"]
    assert RELAY_HOPS_HELD == 2 and FURTHER_COMMITS == 3
    assert c1["floor_ms"] == pytest.approx(2 * 1.0 + 1.5)
    assert c1["design_floor_ms"] == pytest.approx(3.5 + 3 * 0.2)
    assert c1["design_floor_x_plain"] == pytest.approx(4.1 / 2.0)
    # the target (2.5x of 2 ms = 5 ms) leaves 0.9 ms for Baton's own work
    assert c1["left_for_baton_ms"] == pytest.approx(0.9)
    text = out.getvalue()
    assert "4.1 ms = 2.05x" in text and "0.90 ms left for two model turns" in text
    assert text.splitlines()[0].endswith("and the client's read-back)")
    # concurrency 32: six relayed messages at the chain's CPU, four shared commits off
    c32 = got["c32_ceiling"]
    assert c32["hops_cpu_ms_per_session"] == pytest.approx((6 * 800 - 4 * 250) / 1000)


def test_a_floor_above_the_target_says_nothing_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_BRAIN_HOLD_MS", "100")
    out = io.StringIO()
    got = floors(chain=_row(2000), flows=_row(1), commit=_row(300), tool_p50_us=1500,
                 c1=_row(20_000), p1=_row(2000), p32=None, plain32=None,
                 console=Console(file=out, width=400), c1_target=2.5, c32_target=0.4)
    assert got["c1_floor"]["left_for_baton_ms"] == pytest.approx(5.0 - 6.4)
    assert "already 1.40 ms past it before two model turns" in out.getvalue()
    assert "c32_ceiling" not in got
