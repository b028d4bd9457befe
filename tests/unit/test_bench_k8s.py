"""bench/k8s_cold_start.py's own reading of the progress lines: which start-up step each
marks, and each step's time (the benchmark itself is run by hand, not here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "k8s_cold_start.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_k8s_cold_start", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_progress_line_marks_its_step(bench: ModuleType) -> None:
    assert bench.phase_of("Kubernetes http://127.0.0.1:1, namespace default: connecting") == (
        "API reached"
    )
    assert bench.phase_of("job default/jd-b-1: 2 pod(s) of image x; they dial back to h:1") == (
        "Secret and Job made"
    )
    assert bench.phase_of("pods: 2 Running") == "pods Running"
    assert bench.phase_of("pods: 1 Pending, 1 Running") is None
    assert bench.phase_of("node jd-b-1-0-abcde: agent ready in 3.1 s") == "agent ready"
    assert bench.phase_of("node jd-b-1-0-abcde: connecting") is None


def test_a_step_is_its_first_line_and_agents_ready_the_last(bench: ModuleType) -> None:
    progress = [
        (0.2, "Kubernetes u, namespace default: connecting"),
        (0.5, "job default/j: 2 pod(s) of image x"),
        (2.0, "pods: 2 Running"),
        (2.1, "pods: 2 Running (node 0: late)"),
        (5.0, "node a: agent ready in 3.0 s"),
        (6.5, "node b: agent ready in 4.4 s"),
    ]
    assert bench.phases(progress) == {
        "API reached": 0.2,
        "Secret and Job made": 0.5,
        "pods Running": 2.0,
        "agent ready": 6.5,
    }
