"""A Ray session's record keeps the cluster and the owner prefix, and a later server's sweep
runs the Ray driver's ``--sweep`` for exactly that, bounded in time and logged.

The sweep on a real Ray cluster, under real servers: tests/ray/test_ray_server.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.control.launchers.ray import DRIVER_MODULE
from jupyter_dist.server.cluster_sweep import clusters_of, owner_prefix, sweep_clusters
from jupyter_dist.server.process_records import (
    ClusterRecord,
    Machine,
    ServerRecord,
    SessionRecord,
    SessionRecorder,
    read_record,
)

log = logging.getLogger("test_cluster_sweep")
OWNER = "alice@box/4242"
HOLD = {"kind": "ray", "address": "10.0.0.1:6379", "owner": OWNER}


def ray_status(name: str, **extra: Any) -> dict[str, Any]:
    """What `Session.status()` says of a session on Ray, as far as records care: its nodes
    are other machines (their agents' pids are theirs) and it holds things on the cluster."""
    return {
        "name": name,
        "state": "ready",
        "spec": {"name": name, "hosts": [], "launcher": "ray"},
        "nodes": [
            {"node_rank": 0, "host": "10.0.0.2", "agent_pid": 501},
            {"node_rank": 1, "host": "10.0.0.3", "agent_pid": 502},
        ],
        "ranks": [
            {"rank": 0, "node_rank": 0, "host": "10.0.0.2", "pid": 601, "state": "idle"},
            {"rank": 1, "node_rank": 1, "host": "10.0.0.3", "pid": 602, "state": "idle"},
        ],
        "cluster": HOLD,
        **extra,
    }


def test_a_ray_session_is_recorded_as_remote_with_its_cluster_and_owner(tmp_path: Path) -> None:
    recorder = SessionRecorder(tmp_path, log, pid=os.getpid())
    # pid 501 may well be a process of this machine: a Ray node's pid is never checked here
    recorder.observe({"type": "session", "session": ray_status("r", cluster=None)})
    [session] = read_record(recorder.path).sessions
    assert session.local == () and session.cluster is None
    assert [(p.pid, p.host, p.create_time) for p in session.remote] == [
        (501, "10.0.0.2", None),
        (502, "10.0.0.3", None),
        (601, "10.0.0.2", None),
        (602, "10.0.0.3", None),
    ]
    # once placed, the session says what it holds: the record is rewritten with it
    recorder.observe({"type": "session", "session": ray_status("r")})
    [session] = read_record(recorder.path).sessions
    assert session.cluster == ClusterRecord("ray", "10.0.0.1:6379", OWNER)
    raw = json.loads(recorder.path.read_text())
    assert raw["sessions"][0]["cluster"] == HOLD


@pytest.mark.parametrize(
    "cluster",
    [
        "ray",
        {"kind": "ray", "address": "10.0.0.1:6379"},
        {"kind": "ray", "address": "", "owner": OWNER},
        {"kind": 1, "address": "10.0.0.1:6379", "owner": OWNER},
    ],
)
def test_a_bad_cluster_entry_makes_the_record_unreadable(cluster: Any) -> None:
    with pytest.raises(ValueError, match="cluster"):
        SessionRecord.from_json({"name": "r", "cluster": cluster})


class FakeRun:
    """Stands in for the sweep's child process: records each command, answers ``reply``."""

    def __init__(self, reply: subprocess.CompletedProcess[str] | BaseException) -> None:
        self.reply = reply
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append((list(argv), timeout))
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


def done(code: int, stdout: str = "", stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], code, stdout, stderr)


def dead_server(*clusters: ClusterRecord | None) -> ServerRecord:
    sessions = tuple(SessionRecord(f"s{i}", cluster=c) for i, c in enumerate(clusters))
    return ServerRecord(4242, 1700000000.0, sessions, Machine.here())


def test_the_sweep_runs_the_drivers_sweep_once_per_cluster_and_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    here = ClusterRecord("ray", "10.0.0.1:6379", OWNER)
    there = ClusterRecord("ray", "10.9.0.1:6379", OWNER)
    record = dead_server(here, None, here, there)
    assert clusters_of(record) == [here, there]
    swept = json.dumps({"event": "swept", "removed": [f"jupyter_dist/{OWNER}/s0/0"]})
    run = FakeRun(done(0, "a line Ray printed\n" + swept + "\n"))
    with caplog.at_level(logging.INFO, logger=log.name):
        sweep_clusters(record, log, timeout=7.0, run=run)
    assert run.calls == [
        ([sys.executable, "-m", DRIVER_MODULE, "--sweep", f"jupyter_dist/{OWNER}/",
          "--address", address], 7.0)
        for address in ("10.0.0.1:6379", "10.9.0.1:6379")
    ]  # fmt: skip
    assert owner_prefix(OWNER) == "jupyter_dist/alice@box/4242/"
    said = caplog.text
    assert f"removed what dead server pid 4242 left on the Ray cluster at 10.0.0.1:6379: " \
        f"jupyter_dist/{OWNER}/s0/0" in said  # fmt: skip
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_sweep_that_hangs_or_fails_is_logged_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = dead_server(ClusterRecord("ray", "10.0.0.1:6379", OWNER))
    with caplog.at_level(logging.INFO, logger=log.name):
        sweep_clusters(record, log, 3.0, FakeRun(subprocess.TimeoutExpired(["x"], 3.0)))
        sweep_clusters(record, log, 3.0, FakeRun(done(1, "", "ConnectionError: no GCS at ...")))
        sweep_clusters(record, log, 3.0, FakeRun(done(0, "not JSON\n")))
        sweep_clusters(record, log, 3.0, FakeRun(OSError("no such interpreter")))
        sweep_clusters(record, log, 3.0, FakeRun(done(0, '{"event": "swept", "removed": []}')))
    lines = [r.getMessage() for r in caplog.records]
    assert "no answer within 3 s" in lines[0]
    assert "failed (exit status 1): ConnectionError: no GCS at ..." in lines[1]
    assert "failed (exit status 0): not JSON" in lines[2]
    assert "cannot run the Ray sweep of jupyter_dist/alice@box/4242/" in lines[3]
    assert "left nothing under jupyter_dist/alice@box/4242/" in lines[4]


def test_the_sweep_command_refuses_a_prefix_that_is_not_an_owners() -> None:
    """The driver's own guard: a prefix that would cover other owners is refused before it
    connects to anything."""
    for prefix in ("jupyter_dist/", "jupyter_dist/alice@box/", "other/alice@box/1/"):
        result = subprocess.run(
            [sys.executable, "-m", DRIVER_MODULE, "--sweep", prefix, "--address", "10.0.0.1:1"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        assert result.returncode == 2, result.stderr
        assert f"--sweep {prefix!r}: expected jupyter_dist/USER@HOST/PID/" in result.stderr


def test_a_kubernetes_record_runs_the_label_sweep_in_its_namespace_and_context(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from jupyter_dist.server.cluster_sweep import K8S_SWEEP_MODULE

    kube = ClusterRecord("k8s", "https://10.0.0.1:6443", OWNER, "team", "prod")
    assert ClusterRecord.from_json(kube.to_json()) == kube
    swept = json.dumps({"event": "swept", "removed": ["job/jd-s0-a1b2c", "secret/jd-s0-a1b2c"]})
    run = FakeRun(done(0, swept + "\n"))
    with caplog.at_level(logging.INFO, logger=log.name):
        sweep_clusters(dead_server(kube), log, timeout=5.0, run=run)
    assert run.calls == [
        ([sys.executable, "-m", K8S_SWEEP_MODULE, "--owner", OWNER, "--namespace", "team",
          "--context", "prod"], 5.0)
    ]  # fmt: skip
    assert (
        "removed what dead server pid 4242 left on the Kubernetes cluster at "
        "https://10.0.0.1:6443: job/jd-s0-a1b2c, secret/jd-s0-a1b2c"
    ) in caplog.text


def test_the_kubernetes_sweep_refuses_an_owner_that_is_not_one() -> None:
    from jupyter_dist.control.launchers.k8s_sweep import owner_selector

    assert owner_selector("alice@box.example/4242") == {
        "app.kubernetes.io/managed-by": "jupyter-dist",
        "jupyter-dist.io/owner-host": "box.example",
        "jupyter-dist.io/owner-pid": "4242",
    }
    for bad in ("alice@box", "alice@box/", "/12", "alice@box/x"):
        with pytest.raises(ValueError, match="expected USER@HOST/PID"):
            owner_selector(bad)
