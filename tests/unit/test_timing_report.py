"""The timing summary every run ends with (tests/timing_report.py) and the xdist groups
(tests/xdist_groups.py), run on a small suite of their own in this process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import timing_report
from tests.timing_report import FOLDER_BUDGETS_S, TimingReport, folder_of
from tests.xdist_groups import group_of, longest_first

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
#: the inner runs: no cache folder, and no kmock plugin (as pyproject.toml says for the suite)
QUIET = ("-p", "no:cacheprovider", "-p", "no:kmock")

SMALL_SUITE = """
import time
import pytest

@pytest.fixture(scope="module")
def slow_server():
    time.sleep(0.3)
    yield "up"
    time.sleep(0.25)

def test_uses_server(slow_server):
    assert slow_server == "up"

def test_slow_call():
    time.sleep(0.1)

def test_fast():
    pass
"""


def test_summary_names_slow_tests_folders_and_fixture_times(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timing_report, "FIXTURE_SHOWN_S", 0.2)
    pytester.makepyfile(test_small=SMALL_SUITE)
    result = pytester.runpytest_inprocess("-p", "tests.timing_report", *QUIET)
    result.assert_outcomes(passed=3)
    text = result.stdout.str()
    summary = text[text.index("where the time went") :]
    slowest = dict(re.findall(r"^\s+[\d.]+s  test_small\.py::(\w+)  \((.*)\)$", summary, re.M))
    assert list(slowest) == ["test_uses_server", "test_fast", "test_slow_call"], summary
    # the fixture's set-up is the first test's, its teardown the last test's in the module
    assert "setup 0.3" in slowest["test_uses_server"], summary
    assert "teardown 0.2" in slowest["test_fast"] or "teardown 0.3" in slowest["test_fast"]
    line = next(ln for ln in summary.splitlines() if "slow_server (module)" in ln)
    setup, teardown = map(float, re.findall(r"(?:set-up|teardown)\s+([\d.]+)s", line))
    assert setup >= 0.3 and teardown >= 0.2, line  # shown to 0.1 s
    assert re.search(r"\(top\)\s+3 tests", summary), summary


def test_a_folder_over_budget_is_named() -> None:
    report = TimingReport()
    for i, seconds in enumerate((FOLDER_BUDGETS_S["slurm"] / 2 + 1,) * 2):
        report.add(
            pytest.TestReport(
                f"tests/slurm/test_x.py::t{i}",
                ("x", 0, "t"),
                {},
                "passed",
                None,
                "call",
                [],
                duration=seconds,
                start=100.0 + i,
                stop=101.0 + i,
            )
        )
    lines = report.lines()
    assert any(ln.startswith("  OVER BUDGET: tests/slurm") for ln in lines), lines
    assert any(re.match(r"\s+slurm\s+2 tests .* span\s+2\.0s", ln) for ln in lines), lines


@pytest.mark.parametrize(
    ("nodeid", "folder"),
    [("tests/ray/test_a.py::t", "ray"), ("tests/test_b.py::t", "(top)"), ("x.py::t", "(top)")],
)
def test_folder_of(nodeid: str, folder: str) -> None:
    assert folder_of(nodeid) == folder


def test_readme_budget_table_is_the_reports() -> None:
    """tests/README.md shows the budgets the summary checks, one row a folder."""
    text = (ROOT / "tests" / "README.md").read_text()
    text = text[text.index("## Folders and budgets") :]
    text = text[: text.index("\n## ", 1)]  # that section alone
    rows = dict(re.findall(r"^\| `tests/(\w+)` \|[^|]*\|[^|]*\| (\d+) s \|", text, re.M))
    assert {k: float(v) for k, v in rows.items()} == FOLDER_BUDGETS_S


@pytest.mark.parametrize(
    ("nodeid", "group"),
    [
        ("tests/ray/test_ray_sessions.py::test_x", "ray-cluster"),
        ("tests/multinode/test_cluster.py::test_y[a-b]", "ssh-nodes"),
        ("tests/browser/test_lab_smoke.py::test_z", "jupyterlab"),
        ("tests/integration/test_magic.py::test_w", "tests/integration/test_magic.py"),
        ("tests/integration/test_x.py::TestC::test_v", "tests/integration/test_x.py"),
        ("tests/unit/ray/test_a.py::t", "tests/unit/ray/test_a.py"),
    ],
)
def test_a_shared_clusters_folder_is_one_group_else_a_module(nodeid: str, group: str) -> None:
    assert group_of(nodeid) == group


def test_groups_are_handed_out_longest_first_each_in_its_own_order() -> None:
    groups = ["a.py", "a.py", "ray-cluster", "b.py", "ray-cluster", "b.py", "b.py"]
    order = longest_first(groups, {"ray-cluster": 300.0})
    assert [groups[i] for i in order] == [
        "ray-cluster",
        "ray-cluster",
        "b.py",
        "b.py",
        "b.py",
        "a.py",
        "a.py",
    ]
    assert order[:2] == [2, 4] and order[2:5] == [3, 5, 6]
