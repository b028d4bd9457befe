"""The suite's own machinery on several pytest-xdist workers, as `make test` runs it: the
timing summary gets each worker's test and fixture times, junit XML still works, a
module's tests run on one worker (its fixture made once), and so do all the tests of a
folder that shares a cluster (tests/xdist_groups.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.timing_report import SLOWEST_SHOWN

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]

CONFTEST = """
import os
import time

import pytest

pytest_plugins = ["tests.timing_report", "tests.xdist_groups"]


@pytest.fixture(scope="module")
def slow_server():
    time.sleep(1.2)
    yield os.environ["PYTEST_XDIST_WORKER"]
    time.sleep(1.1)
"""

MODULE = """
import os

def test_first(slow_server):
    assert slow_server == os.environ["PYTEST_XDIST_WORKER"]

def test_second(slow_server):
    assert slow_server == os.environ["PYTEST_XDIST_WORKER"]
"""


def test_two_workers_report_fixture_times_and_keep_a_modules_tests_together(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    for name in ("test_a", "test_b", "test_c"):
        pytester.makepyfile(**{name: MODULE})
    shared = pytester.mkdir("tests") / "ray"  # no __init__.py: its modules are top-level
    shared.mkdir()
    for name in ("test_x", "test_y"):
        (shared / f"{name}.py").write_text("def test_1(): pass\ndef test_2(): pass\n")
    pytester.syspathinsert(ROOT)  # `tests.timing_report` is this repository's
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadscope", "-v",
        "-p", "no:cacheprovider", "-p", "no:kmock", f"--junitxml={pytester.path / 'j.xml'}",
    )  # fmt: skip
    result.assert_outcomes(passed=10)
    text = result.stdout.str()
    assert "where the time went" in text, text
    # each module's fixture was made once, on one worker: 3 set-ups, 3 teardowns
    line = next(ln for ln in text.splitlines() if "slow_server (module)" in ln)
    made, setup, teardown = re.findall(r"x(\d+)\s+set-up\s+([\d.]+)s.*teardown\s+([\d.]+)s", line)[
        0
    ]
    assert int(made) == 3 and float(setup) >= 3.6 and float(teardown) >= 3.3, line
    slowest = [ln for ln in text.splitlines() if re.match(r"\s+[\d.]+s  test_", ln)]
    assert 0 < len(slowest) <= SLOWEST_SHOWN, text
    assert (pytester.path / "j.xml").read_text().count("<testcase") == 10
    workers = re.findall(r"\[(gw\d)\] .*PASSED (\S+)::", text)
    assert {w for w, path in workers if path.startswith("tests/ray/")} in ({"gw0"}, {"gw1"}), text
    assert {w for w, _ in workers} == {"gw0", "gw1"}, text
