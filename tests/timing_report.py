"""Where the suite's time goes, printed at the end of every run (and with ``-p xdist``, by
the controller, from what each worker reports).

* the slowest tests, each with its setup, call and teardown;
* each test folder: tests, summed test time, the span from its first test's start to its
  last test's end, and its budget (``FOLDER_BUDGETS_S``, the table of ``tests/README.md``);
  a folder over budget gets a line saying so;
* each expensive fixture (set-up or teardown over ``FIXTURE_SHOWN_S``: cluster and server
  start-ups): how often it was made, and its set-up and teardown times.

A fixture's times travel to the controller with the report of the phase they were spent in,
in its ``fixture_times`` attribute (xdist sends a report's attributes along), as
``["setup"|"teardown", "name (scope)", seconds]``.

Budgets are not limits a test enforces (timing must not fail a test on a loaded machine);
they are the line growth is seen against. ``--timing-json PATH`` also writes every test's
times and every fixture's to PATH.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: Each folder's budget: seconds of summed test time (setup + call + teardown, so cluster
#: start-ups included) as `make test` runs it (three workers on a quiet 2-core machine,
#: where tests slow each other down), about a quarter above what such a run measured.
#: tests/README.md shows the same table.
FOLDER_BUDGETS_S: dict[str, float] = {
    "unit": 90,
    "integration": 1500,
    "multinode": 440,
    "ray": 670,
    "k8s": 330,
    "slurm": 60,
    "browser": 380,
    "gpu": 120,
}
SLOWEST_SHOWN = 25
#: a fixture whose set-up or teardown took this long somewhere is listed
FIXTURE_SHOWN_S = 1.0
SETUP, TEARDOWN = "setup", "teardown"


@dataclass
class TestTimes:
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    start: float = 0.0
    stop: float = 0.0

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


@dataclass
class FixtureTimes:
    setups: list[float] = field(default_factory=list)
    teardowns: list[float] = field(default_factory=list)


def folder_of(nodeid: str) -> str:
    """``tests/ray/test_x.py::t`` -> ``ray``; a test outside a folder -> ``(top)``."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "(top)"


class TimingReport:
    """Collects the reports of a run; `lines` renders the summary."""

    def __init__(self) -> None:
        self.tests: dict[str, TestTimes] = defaultdict(TestTimes)
        self.fixtures: dict[str, FixtureTimes] = defaultdict(FixtureTimes)

    def add(self, report: pytest.TestReport) -> None:
        times = self.tests[report.nodeid.split("@", 1)[0]]  # xdist adds @group
        setattr(times, report.when, getattr(times, report.when) + report.duration)
        start, stop = getattr(report, "start", 0.0), getattr(report, "stop", 0.0)
        times.start = min(times.start or start, start)
        times.stop = max(times.stop, stop)
        for kind, name, seconds in getattr(report, "fixture_times", ()):
            if kind in (SETUP, TEARDOWN):
                fixture = self.fixtures[str(name)]
                (fixture.setups if kind == SETUP else fixture.teardowns).append(float(seconds))

    def lines(self) -> list[str]:
        if not self.tests:
            return []
        out = [f"slowest {SLOWEST_SHOWN} tests (setup + call + teardown):"]
        slowest = sorted(self.tests.items(), key=lambda kv: -kv[1].total)[:SLOWEST_SHOWN]
        for nodeid, t in slowest:
            out.append(
                f"  {t.total:7.1f}s  {nodeid}  "
                f"(setup {t.setup:.1f}, call {t.call:.1f}, teardown {t.teardown:.1f})"
            )
        out.append("test folders: tests, summed test time, first start to last end, budget:")
        by_folder: dict[str, list[TestTimes]] = defaultdict(list)
        for nodeid, t in self.tests.items():
            by_folder[folder_of(nodeid)].append(t)
        over: list[str] = []
        for folder, times in sorted(by_folder.items(), key=lambda kv: -sum(t.total for t in kv[1])):
            summed = sum(t.total for t in times)
            starts = [t.start for t in times if t.start]
            span = max(t.stop for t in times) - min(starts) if starts else 0.0
            budget = FOLDER_BUDGETS_S.get(folder)
            shown = f"{budget:.0f}s" if budget is not None else "none"
            out.append(
                f"  {folder:<12} {len(times):5d} tests  {summed:7.1f}s  "
                f"span {span:7.1f}s  budget {shown}"
            )
            if budget is not None and summed > budget:
                over.append(f"  OVER BUDGET: tests/{folder} took {summed:.0f}s of {budget:.0f}s")
        out += over
        shown_fixtures = [
            (name, f)
            for name, f in self.fixtures.items()
            if max([*f.setups, *f.teardowns], default=0.0) >= FIXTURE_SHOWN_S
        ]
        if shown_fixtures:
            out.append("expensive fixtures: made, set-up total (max), teardown total (max):")
            for name, f in sorted(shown_fixtures, key=lambda kv: -sum(kv[1].setups)):
                out.append(
                    f"  {name:<40} x{len(f.setups):<3} set-up {sum(f.setups):6.1f}s "
                    f"({max(f.setups, default=0):.1f})  teardown {sum(f.teardowns):6.1f}s "
                    f"({max(f.teardowns, default=0):.1f})"
                )
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "tests": {
                nodeid: {"setup": t.setup, "call": t.call, "teardown": t.teardown}
                for nodeid, t in sorted(self.tests.items())
            },
            "fixtures": {
                name: {"setups": f.setups, "teardowns": f.teardowns}
                for name, f in sorted(self.fixtures.items())
            },
        }


_REPORT = pytest.StashKey[TimingReport]()
#: fixture times measured in this process, not yet sent with a report
_pending: list[list[str | float]] = []
#: the report of this process's run (a list: a pytest run inside a test has its own)
_collectors: list[TimingReport] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--timing-json",
        metavar="PATH",
        default=None,
        help="also write every test's and every fixture's times to PATH (JSON)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_REPORT] = TimingReport()
    _collectors.append(config.stash[_REPORT])


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    name = f"{fixturedef.argname} ({fixturedef.scope})"
    ended: list[float] = []
    # finalizers run last-in first-out: this one runs after the fixture's own teardown...
    fixturedef.addfinalizer(lambda: _spent(TEARDOWN, name, time.perf_counter() - ended[0]))
    began = time.perf_counter()
    try:
        return (yield)
    finally:
        _spent(SETUP, name, time.perf_counter() - began)
        # ...and this one before it
        fixturedef.addfinalizer(lambda: ended.append(time.perf_counter()))


def _spent(kind: str, name: str, seconds: float) -> None:
    if seconds >= 0.05:
        _pending.append([kind, name, round(seconds, 3)])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if _pending:
        report.fixture_times = list(_pending)  # type: ignore[attr-defined]
        _pending.clear()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _collectors:
        _collectors[-1].add(report)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _REPORT in config.stash and config.stash[_REPORT] in _collectors:
        _collectors.remove(config.stash[_REPORT])


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash[_REPORT]
    lines = report.lines()
    if lines:
        terminalreporter.section("where the time went")
        for line in lines:
            terminalreporter.write_line(line)
    path = config.getoption("--timing-json")
    if path:
        Path(path).write_text(json.dumps(report.as_json(), indent=1) + "\n")
