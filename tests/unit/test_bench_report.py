"""Bench reporting as pure logic: the benchmark tables of docs/benchmarks.md and the README,
the ratio regression check, and the canonical lines that count routine messages instead of
logging each."""

from __future__ import annotations

from typing import Any

import pytest

from baton.bench.check import regressions
from baton.bench.readme import (
    BEGIN,
    DURABLE,
    END,
    HEADLINE,
    render,
    render_headline,
    replace_block,
)
from baton.bench.summary import cold_targets
from baton.observability.canonical import CanonicalLines


def _summary(share: float, c1: float) -> dict[str, Any]:
    return {"env": {"cpus": 2, "platform": "Linux", "python": "3.11", "time": "t",
                    "loadavg_1m": 3.0},
            "targets": [
                {"figure": "takeover median", "measured": "0.4s", "target": "<= 0.5s",
                 "met": True},
                {"figure": "c=32 / plain", "measured": f"{share:.0%}", "target": ">= 40%",
                 "ratio_value": share, "met": share >= 0.4},
                {"figure": "c=1 / plain", "measured": f"{c1:.2f}x", "target": "<= 2.5x",
                 "ratio_value": c1, "met": c1 <= 2.5}]}


def test_readme_block_lists_ratios_first_with_command_and_machine() -> None:
    block = render(_summary(0.5, 3.0), "make bench")
    lines = block.splitlines()
    assert "`make bench`" in lines[0] and "2 CPUs" in lines[0] and "loaded" in lines[0]
    quiet = {**_summary(0.5, 3.0), "env": {**_summary(0.5, 3.0)["env"], "loadavg_1m": 0.2}}
    assert "loaded" not in render(quiet, "make bench").splitlines()[0]
    rows = [line for line in lines if line.startswith("| ") and "figure" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| c=32 / plain", "| c=1 / plain",
                                                  "| takeover median"]
    text = f"intro\n{BEGIN}\nold table\n{END}\nrest\n"
    out = replace_block(text, block)
    assert out.startswith(f"intro\n{BEGIN}\n") and out.endswith(f"{END}\nrest\n")
    assert "old table" not in out and replace_block(out, block) == out


def test_the_durable_rows_get_a_table_of_their_own_without_the_prefix() -> None:
    summary = _summary(0.5, 3.0)
    summary["targets"].append({"figure": DURABLE + "c=1 / plain", "measured": "6.00x",
                               "target": "<= 2.5x", "ratio_value": 6.0, "met": False})
    lines = render(summary, "make bench").splitlines()
    figures = [line.split(" | ")[0] for line in lines
               if line.startswith("| ") and "figure" not in line]
    assert figures == ["| c=32 / plain", "| c=1 / plain", "| takeover median", "| c=1 / plain"]
    second = lines.index(next(line for line in lines if line.startswith("The same sessions")))
    assert "| 6.00x |" in "\n".join(lines[second:]) and DURABLE not in "\n".join(lines)


def test_the_readme_gets_the_headline_rows_and_a_link_to_the_full_table() -> None:
    named = [{"figure": f"{name} (detail)", "measured": f"{n}.00x", "target": "",
              "ratio_value": float(n), "met": True} for n, name in enumerate(HEADLINE)]
    other = {"figure": "import baton (CPU)", "measured": "2 ms", "target": "< 300 ms",
             "met": True}
    durable = {**named[0], "figure": DURABLE + named[0]["figure"]}
    summary = {**_summary(0.5, 3.0), "targets": [other, durable, *reversed(named)]}
    block = render_headline(summary, "make bench")
    lines = block.splitlines()
    assert "`make bench`" in lines[0] and "(docs/benchmarks.md)" in lines[0]
    rows = [line for line in lines if line.startswith("| ") and "figure" not in line]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == [
        f"{name} (detail)" for name in HEADLINE]  # HEADLINE's order; no durable, no other row
    assert all(r.endswith(" |  |") for r in rows)  # no target: nothing to meet
    assert "Not in this run" not in block
    fewer = render_headline({**summary, "targets": named[1:]}, "make bench")
    assert fewer.rstrip().splitlines()[-1] == f"Not in this run: {HEADLINE[0]}."


def test_the_committed_tables_are_the_generator_s_output() -> None:
    """README.md and docs/benchmarks.md hold the blocks `make bench` writes: same markers,
    the same first line, and every headline row of the README is a row of the full table."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text().split(BEGIN)[1].split(END)[0]
    full = (root / "docs" / "benchmarks.md").read_text().split(BEGIN)[1].split(END)[0]
    assert readme.startswith("\nMeasured by `make bench` on ")
    assert full.startswith("\nMeasured by `make bench` on ")
    rows = [line for line in readme.splitlines()
            if line.startswith("| ") and not line.startswith("| figure ")]
    assert len(rows) == len(HEADLINE)
    for row in rows:
        assert row in full.splitlines(), row


def test_regression_check_compares_ratios_in_their_direction() -> None:
    base = _summary(0.5, 2.0)
    assert regressions(base, _summary(0.45, 2.2), tolerance=0.25) == []
    worse = regressions(base, _summary(0.3, 2.6), tolerance=0.25)
    assert len(worse) == 2 and worse[0].startswith("c=32 / plain")
    assert regressions(base, _summary(0.9, 1.0), tolerance=0.25) == []  # better is fine


def _cold(**extra: Any) -> dict[str, Any]:
    return {"targets": {"import_s": 0.3, "ready_s": 1.0, "idle_ms_per_s": 5.0},
            "import_cpu_s": {"baton": 0.002, "baton.brain.worker": 0.3},
            "worker_ready_s": 0.5, "worker_ready_cpu_s": 0.4,
            "idle_cpu_total_ms_per_s": 9.0, **extra}


def test_idle_figure_is_a_ratio_to_its_floor_measured_in_the_same_seconds() -> None:
    idle = cold_targets(_cold(idle_floor_total_ms_per_s=3.0,
                              idle_wakes_per_s={"relay-1": 2.0, "nats": 40.0}))[-1]
    assert idle["ratio_value"] == pytest.approx(3.0) and not idle["met"]
    assert idle["measured"].startswith("9.0 ms/s = 3.00x its floor (3.0 ms/s")
    assert idle["measured"].endswith("42 wakes/s")
    # A stack that idles more against the same floor is a regression; a machine whose every
    # wake costs more moves the floor and the stack alike.
    worse = cold_targets(_cold(idle_cpu_total_ms_per_s=12.0, idle_floor_total_ms_per_s=3.0))
    slower = cold_targets(_cold(idle_cpu_total_ms_per_s=27.0, idle_floor_total_ms_per_s=9.0))
    base = {"targets": cold_targets(_cold(idle_floor_total_ms_per_s=3.0))}
    assert regressions(base, {"targets": worse}, tolerance=0.25)
    assert regressions(base, {"targets": slower}, tolerance=0.25) == []
    # A cold.json from before the floor was measured: the figure, no ratio.
    assert "ratio_value" not in cold_targets(_cold())[-1]


class _Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event, kw))

    def debug(self, event: str, **kw: Any) -> None:
        self.lines.append(("debug", event, kw))


def test_canonical_lines_count_routine_and_log_unusual_in_full() -> None:
    rec = _Recorder()
    lines = CanonicalLines(rec, "tool_message_handled", every_s=3600)  # type: ignore[arg-type]
    for ms in (1.0, 3.0):
        lines.line(True, outcome="ok", ms=ms)
    lines.line(False, outcome="duplicate", ms=2.0)
    assert [(lvl, e) for lvl, e, _ in rec.lines] == [
        ("debug", "tool_message_handled"), ("debug", "tool_message_handled"),
        ("info", "tool_message_handled")]
    lines.flush()
    level, event, summary = rec.lines[-1]
    assert (level, event) == ("info", "tool_message_handled_summary")
    assert summary["routine"] == 2 and summary["ms_mean"] == 2.0 and summary["ms_max"] == 3.0
    assert summary["outcomes"] == {"ok": 2}
    lines.flush()  # nothing counted since: no line
    assert len(rec.lines) == 4
    each = CanonicalLines(rec, "wake_handled", each=True)  # type: ignore[arg-type]
    each.line(True, outcome="done", ms=1.0)
    assert rec.lines[-1][:2] == ("info", "wake_handled")


def test_obs_costs_are_medians_of_pairs_with_a_distribution_free_interval() -> None:
    from baton.bench.obs_bench import describe, spread

    pairs = [i / 100 for i in range(30)]  # 0%..29%, median 14.5%
    stats = spread(pairs)
    assert stats["median"] == pytest.approx(0.145) and stats["pairs"] == 30
    # The sign test's interval for n=30: the 10th and 21st smallest.
    assert (stats["ci_low"], stats["ci_high"]) == (0.09, 0.20)
    wild = spread([*pairs[:-1], 50.0])  # one wild pair moves neither
    assert (wild["median"], wild["ci_low"], wild["ci_high"]) == (
        stats["median"], stats["ci_low"], stats["ci_high"])
    assert describe(stats).startswith("+14.5% (95% CI +9.0%..+20.0%; IQR ")
    assert spread([0.03])["ci_low"] == spread([0.03])["ci_high"] == 0.03


def test_redis_time_names_scripts_by_sha_and_keeps_scripted_commands_apart() -> None:
    from baton.bench.redis_time_bench import script_names, summarize, tally

    names = script_names()
    commit = next(sha for sha, name in names.items() if name == "commit")
    entries = [
        {"command": f"EVALSHA {commit} 1 k a", "duration": 150, "client_address": "1.2.3.4:5"},
        {"command": b"EVALSHA " + commit.encode() + b" 1 k b", "duration": 170,
         "client_address": b"1.2.3.4:5"},
        {"command": "HSET k f v", "duration": 2, "client_address": "?:0"},  # run by the script
        {"command": "EVALSHA 0123456789abcdef0123 0", "duration": 9, "client_address": "x:1"},
        {"command": "xreadgroup GROUP relay r STREAMS s >", "duration": 40,
         "client_address": "1.2.3.4:6"},
        {"command": "CONFIG SET slowlog-log-slower-than -1", "duration": 3,
         "client_address": "1.2.3.4:7"},  # the benchmark's own
    ]
    tallied = tally(entries, names)
    assert tallied["scripts"] == {"commit": [150, 170], "sha 0123456789ab": [9]}
    assert tallied["scripted"] == {"HSET": [2]}
    assert tallied["direct"] == {"XREADGROUP": [40]}

    summary = summarize(tallied, sessions_n=2)
    assert list(summary["scripts"]) == ["commit", "sha 0123456789ab"]  # most time first
    assert summary["scripts"]["commit"] == {"calls_per_session": 1.0, "us_per_session": 160.0,
                                            "p50_us": 160.0, "p99_us": pytest.approx(169.8)}


def _row(p50_ms: float, per_s: float) -> Any:
    from baton.bench.common import Row
    return Row(mode="m", operation="o", writers=1, n=10, p50_us=p50_ms * 1000, p99_us=0.0,
               ops_per_s=per_s)


def test_peer_rows_divide_by_the_langgraph_run_of_the_same_bench() -> None:
    from baton.bench.langgraph_peer import figures
    from baton.bench.sessions import STEPS
    assert figures(1.0, _row(10, 90), _row(150, 200), {}, {}, steps=STEPS) == []  # not installed
    rows = figures(1.0, _row(10, 90), _row(150, 200),
                   {1: _row(8, 110), 32: _row(300, 100)},
                   {1: {"process": 12.0}, 32: {"process": 2.0 * STEPS, "mailbox": 1.25}},
                   steps=STEPS, mail_ms=1.0)
    cpu, rate, p50 = rows
    assert cpu["target"] == "< 1x" and cpu["ratio_value"] == 0.5 and cpu["met"]
    assert "client" in cpu["figure"] and "mail service 1.0 vs 1.2 ms/session" in cpu["measured"]
    assert rate["ratio_value"] == 2.0 and rate["higher_is_better"] and rate["target"] == ""
    assert p50["ratio_value"] == 1.25 and "higher_is_better" not in p50
    dearer = figures(3.0, _row(10, 90), _row(150, 200),
                     {1: _row(8, 110), 32: _row(300, 100)},
                     {1: {"process": 12.0}, 32: {"process": 2.0 * STEPS}}, steps=STEPS)[0]
    assert dearer["ratio_value"] == 1.5 and not dearer["met"]


def test_a_figure_without_target_regresses_in_the_direction_it_names() -> None:
    def summary(rate: float, p50: float) -> dict[str, Any]:
        return {"targets": [
            {"figure": "rate / peer", "measured": "", "target": "", "ratio_value": rate,
             "met": True, "higher_is_better": True},
            {"figure": "p50 / peer", "measured": "", "target": "", "ratio_value": p50,
             "met": True}]}
    assert regressions(summary(2.0, 1.0), summary(3.0, 0.5), tolerance=0.25) == []
    worse = regressions(summary(2.0, 1.0), summary(1.0, 2.0), tolerance=0.25)
    assert [w.split(":")[0] for w in worse] == ["rate / peer", "p50 / peer"]


def test_a_figure_missing_from_the_current_run_is_reported() -> None:
    base = _summary(0.5, 2.0)
    current = {**base, "targets": [t for t in base["targets"] if t["figure"] != "c=1 / plain"]}
    assert regressions(base, current, tolerance=0.25) == ["c=1 / plain: 2 -> not measured"]


def test_a_skipped_peer_is_said_in_the_summary_and_the_readme_block() -> None:
    from baton.bench.summary import skipped
    assert skipped({"langgraph": {"c=1": {}}}) == [] and skipped(None) == []
    said = skipped({"langgraph": {"skipped": "pip install '.[peers]'"}})
    assert said == ["the in-process LangGraph peer was not measured: pip install '.[peers]'"]
    block = render({**_summary(0.5, 2.0), "skipped": said}, "make bench")
    assert block.rstrip().splitlines()[-1] == f"Not in this run: {said[0]}."
    assert "Not in this run" not in render(_summary(0.5, 2.0), "make bench")


def test_the_picture_keeps_legends_off_the_bars_and_long_figures_in_its_width() -> None:
    import re

    from baton.bench.summary import _Panel, render_svg
    panel = _Panel(0, 0, "title", 10.0, "ms", series=5)
    panel.bars(["c=1", "c=32"], {f"s{i}": [10.0, 5.0] for i in range(5)})
    legend_baselines = [float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)" '
                                                     r'font-size="10">s\d', panel.svg())]
    assert len(legend_baselines) == 5 and max(legend_baselines) < panel._y(panel.top)
    row = {"figure": "f" * 120, "measured": "m" * 120, "target": "< 1x", "met": True}
    svg = render_svg(None, None, None, [row])
    lines = re.findall(r'fill="#2e7d32">([^<]*)</text>', svg)
    assert len(lines) == 2 and all(len(line) <= 150 for line in lines)


def test_a_table_row_leaves_a_figure_it_did_not_measure_blank() -> None:
    import io

    from rich.console import Console

    from baton.bench.common import Row, print_rows

    out = io.StringIO()
    print_rows("t (ratio = p50 / something)", [
        Row("m", "op", 1, 3, 10.0, 20.0, float("nan"), ratio=1.5)],
        Console(file=out, width=200))
    text = out.getvalue()
    assert "nan" not in text and "ratio to PING" not in text and "1.50x" in text


def test_io_calls_count_this_process_reads_and_writes(tmp_path: Any) -> None:
    import os

    from baton.bench.common import io_calls

    reads, writes = io_calls(os.getpid())
    path = tmp_path / "f"
    with open(path, "wb", buffering=0) as f:
        for _ in range(5):
            f.write(b"x")
    with open(path, "rb", buffering=0) as f:
        while f.read(1):
            pass
    after_reads, after_writes = io_calls(os.getpid())
    assert after_writes - writes >= 5 and after_reads - reads >= 5
    assert io_calls(None) == (0, 0)


def test_the_io_table_shows_reads_and_writes_per_session_by_process() -> None:
    import io

    from rich.console import Console

    from baton.bench.e2e_bench import print_io

    out = io.StringIO()
    levels = {"c=1": {"io_calls_per_session": {"brain-1": [8.0, 8.5], "hands-1": [11, 14.6]}},
              "c=32": {"io_calls_per_session": {"brain-1": [2.1, 1.8], "hands-1": [6.4, 6.9]}}}
    print_io(levels, Console(file=out, width=200))
    text = out.getvalue()
    assert "8.0 / 8.5" in text and "6.4 / 6.9" in text and "hands-1" in text
    empty = io.StringIO()
    print_io({"c=1": {}}, Console(file=empty, width=200))  # a run from before: no table
    assert empty.getvalue() == ""


def test_io_calls_are_read_only_where_they_count_socket_io() -> None:
    import os
    from types import SimpleNamespace

    from baton.bench.e2e_bench import CpuMeter

    # A stack's process list as DevStack.processes gives it (pids of this process stand in).
    stack = SimpleNamespace(processes=[{"name": n, "pid": os.getpid()}
                                       for n in ("redis", "brain-1", "mailbox")])
    assert set(CpuMeter(stack).read_io()) == {"redis", "brain-1"}  # type: ignore[arg-type]


def _result(when: str, *targets: tuple[str, float]) -> dict[str, Any]:
    return {"env": {"cpus": 2, "platform": "Linux", "python": "3.11", "time": when,
                    "loadavg_1m": 0.1},
            "targets": [{"figure": f, "measured": f"{v:.2f}x", "target": "<= 2.5x",
                         "ratio_value": v, "met": v <= 2.5} for f, v in targets]}


def test_summary_names_the_durable_figures_and_dates_an_earlier_runs(tmp_path: Any) -> None:
    import io
    import json

    from rich.console import Console

    from baton.bench.summary import DURABLE_PREFIX, summarize

    (tmp_path / "e2e.json").write_text(json.dumps(_result("10:00", ("c=1 / plain", 8.0))))
    (tmp_path / "durable.json").write_text(json.dumps(_result("10:01", ("c=1 / plain", 6.0))))
    (tmp_path / "takeover.json").write_text(json.dumps({
        "env": {"time": "09:00"}, "target_median_s": 0.5, "variants": [
            {"variant": "defaults", "ack_wait_s": 0.3, "attempt_ttl_ms": 1200,
             "median_s": 0.31, "p90_s": 0.31, "trials": [{"done_s": 0.31}] * 50,
             "duplicates": 0,
             "resends": 0}]}))
    quiet = Console(file=io.StringIO(), width=200)
    summary = summarize(quiet, tmp_path, ran={"e2e", "durable"})
    rows = {r["figure"]: r for r in summary["targets"]}
    assert rows["c=1 / plain"]["ratio_value"] == 8.0
    durable = rows[DURABLE_PREFIX + "c=1 / plain"]
    assert durable["ratio_value"] == 6.0 and "earlier" not in durable["measured"]
    # The takeover file is not this command's: its figure says when it was measured.
    [takeover] = [r for f, r in rows.items() if f.startswith("takeover median")]
    assert takeover["measured"].endswith("[an earlier run: 09:00]")
    assert summary["ratios"][DURABLE_PREFIX + "c=1 / plain"] == 6.0
    # Every file fresh (no command named): nothing is dated.
    fresh = summarize(quiet, tmp_path)
    assert not any("earlier" in r["measured"] for r in fresh["targets"])
