"""bench/ray_cluster.py's own arithmetic: ratios, verdicts against the targets, where the
cold start went, and the report's table (the benchmark itself is run by hand, not here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ray_cluster.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ray_cluster", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_ratio_needs_both_sides_and_a_positive_reference(bench: ModuleType) -> None:
    assert bench.ratio(3.0, 12.0) == pytest.approx(0.25)
    assert bench.ratio(None, 12.0) is None
    assert bench.ratio(3.0, None) is None
    assert bench.ratio(3.0, 0.0) is None
    assert bench.ratio(float("nan"), 1.0) is None


def test_verdict_is_against_an_upper_bound(bench: ModuleType) -> None:
    assert bench.verdict(0.31, 0.5) == "PASS (0.31x)"
    assert bench.verdict(0.5, 0.5) == "PASS (0.5x)"
    assert bench.verdict(0.38 / 75.56, 0.05) == "PASS (0.005x)"
    assert bench.verdict(0.62, 0.5) == "FAIL (0.62x)"
    assert bench.verdict(None, 0.5) == "-"


def test_phases_time_each_progress_line_until_the_next(bench: ModuleType) -> None:
    lines = [(0.5, "connecting"), (2.0, "placed"), (6.0, "ranks ready")]
    assert bench.phases(lines, 7.5) == [
        ("(before the first line)", 0.5),
        ("connecting", 1.5),
        ("placed", 4.0),
        ("ranks ready", 1.5),
    ]
    assert bench.phases(lines, None)[-1] == ("placed", 4.0)  # no end: the last is unknown
    assert bench.phases([], 3.0) == []
    # a line after the result (the cell's summary) is not part of the start
    assert bench.phases([*lines, (8.0, "done on ranks 0-3")], 7.5)[-1] == ("ranks ready", 1.5)


def test_report_has_both_targets_with_verdicts_and_the_breakdown(bench: ModuleType) -> None:
    m = bench.Measured(
        jd_cold=6.0,
        ray_cold_to_allreduce=20.0,
        ray_cold_fit=24.0,
        jd_rerun=0.5,
        ray_rerun_fit=12.5,
        progress=[(0.2, "Ray cluster 10.0.0.1:6379: connecting"), (3.0, "a | b")],
        load_ext=1.0,
    )
    report = bench.render(m)
    rows = [line for line in report.splitlines() if line.startswith("| cold start")]
    assert rows == [
        "| cold start, 2 nodes x 2 CPU ranks, to the first all_reduce | 6.00 s | 20.00 s "
        "(fit() to the all_reduce; whole fit() 24.00 s) | <= 0.5x Ray Train | PASS (0.3x) |"
    ]
    assert "| <= 0.05x Ray Train | PASS (0.04x) |" in report
    assert "| 1.00 | `%load_ext jupyter_dist` (its cell) |" in report
    assert "| 2.80 | Ray cluster 10.0.0.1:6379: connecting |" in report
    assert "| 2.00 | a \\| b |" in report  # until the all_reduce, 5 s after the cell was sent


def test_report_says_which_side_failed(bench: ModuleType) -> None:
    m = bench.Measured(jd_cold=6.0, errors={"Ray Train": "RuntimeError: no fit"})
    report = bench.render(m)
    assert "| <= 0.5x Ray Train | - |" in report
    assert "Ray Train: error: RuntimeError: no fit" in report
