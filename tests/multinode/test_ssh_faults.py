"""Faults across two real sshd nodes: interrupts, a rank failing while the others wait in a
collective, and a Jupyter server that stops, or a notebook kernel that is killed, while
its sessions run on both nodes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client import KernelManager

from jupyter_dist.errors import CellTimeout, RanksFailed
from jupyter_dist.settings import ABORT_AFTER_VAR, INTERRUPT_ACK_VAR, OUTPUT_VAR
from tests.conftest import CellOutput, kernel_process, ready_client, session_status
from tests.integration.server_process import API, start_server, stop_server

from .test_ssh_sessions import flags, netns_pids

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]


@pytest.fixture
def faults(run: Run, cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv(ABORT_AFTER_VAR, "1")
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "3")  # read when the session starts (10 s by default)
    out = run(
        f"%%distributed --session faults {flags(cluster)} --procs 1\n"
        "import os, time, torch, torch.distributed as dist\nkept = os.environ['NODE_RANK']"
    )
    assert out.ok, out.stdout + out.stderr
    yield "faults"
    run("%dist shutdown --session faults")


def test_an_interrupt_reaches_every_rank_on_every_node(run: Run, faults: str) -> None:
    """`--timeout` interrupts through the same path as the notebook's stop button."""
    out = run(f"%%distributed --session {faults} --timeout 2\nwhile True:\n    time.sleep(0.01)")
    assert isinstance(out.error, CellTimeout)
    assert {f.rank: f.ename for f in out.error.failures} == {
        0: "KeyboardInterrupt",
        1: "KeyboardInterrupt",
    }
    assert out.error.note == ""  # both answered: nothing was restarted
    after = run(f"%%distributed --session {faults}\nprint(kept)")
    assert "[rank 0] 0" in after.stdout and "[rank 1] 1" in after.stdout


def test_a_rank_blocked_on_a_failed_rank_of_the_other_node_is_freed_across_nodes(
    run: Run, faults: str, cluster: Any
) -> None:
    before = session_status(faults)
    node0_old = {r["pid"] for r in before["ranks"] if r["node_rank"] == 0}
    node1_old = {r["pid"] for r in before["ranks"] if r["node_rank"] == 1}
    out = run(
        f"%%distributed --session {faults}\n"
        "if dist.get_rank() == 1:\n    raise RuntimeError('node1 lost its data')\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    assert isinstance(out.error, RanksFailed)
    assert out.error.groups[0].first.rank == 1
    assert "RuntimeError: node1 lost its data" in str(out.error)
    kinds = {f.rank: f.kind for f in out.error.failures}
    assert kinds[1] == "error" and kinds[0] != "stuck", kinds
    note = " ".join(out.error.note.split())
    assert note.startswith("Rank 0 was blocked in a collective the other ranks were not in"), note
    assert "Every rank kept its variables" in note and "replaced" not in note, note
    # the new group's store is rank 0's again, reached from the other node
    after = run(
        f"%%distributed --session {faults}\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); print(t.item(), globals().get('kept'))"
    )
    assert after.ok, after.stdout + after.stderr
    assert "[rank 0] 2.0 0" in after.stdout and "[rank 1] 2.0 1" in after.stdout, after.stdout
    status = session_status(faults)
    assert (status["state"], status["generation"]) == ("ready", 1)
    assert {r["pid"] for r in status["ranks"] if r["node_rank"] == 1} == node1_old
    assert {r["pid"] for r in status["ranks"] if r["node_rank"] == 0} == node0_old
    assert node1_old <= netns_pids(cluster, 1), "rank 1 is the same process"


def ours_on(cluster: Any, node: int) -> list[psutil.Process]:
    found = []
    for pid in netns_pids(cluster, node):
        try:
            proc = psutil.Process(pid)
            if "jupyter_dist" in " ".join(proc.cmdline()) and proc.status() != "zombie":
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_stopping_the_server_leaves_nothing_on_any_node(cluster: Any, tmp_path: Path) -> None:
    server = start_server(
        tmp_path,
        tmp_path / "config",
        args=(
            f"--DistServerApp.default_hosts={','.join(cluster.hosts)}",
            f"--DistServerApp.ssh_config={cluster.config_path}",
        ),
    )
    try:
        status, created = server.call("POST", f"{API}/sessions", {"name": "far", "procs": 2})
        assert status == 201, created
        assert [n["host"] for n in created["nodes"]] == list(cluster.hosts)
        before = {n: ours_on(cluster, n) for n in (0, 1)}
        # the agent, its relay and two ranks
        assert all(len(procs) == 4 for procs in before.values()), before
    finally:
        stop_server(server)
    deadline = time.monotonic() + 15
    while any(ours_on(cluster, n) for n in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ours_on(cluster, 0) and not ours_on(cluster, 1)


def test_a_killed_notebook_kernel_leaves_nothing_on_any_node(
    cluster: Any, kernel_name: str, tmp_path: Path
) -> None:
    """The notebook kernel that owns a session is killed (SIGKILL, no cleanup of its own)
    while a cell runs on both nodes: its SSH connections drop, and each node's agent stops
    its relay and ranks and exits."""
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(cwd=str(tmp_path), env={**os.environ, OUTPUT_VAR: "text"})
    try:
        kc = ready_client(km)
        texts: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] in ("stream", "error"):
                texts.append(str(msg["content"].get("text", msg["content"].get("evalue"))))

        for cell in (
            "%load_ext jupyter_dist",
            f"%%distributed --session doomed {flags(cluster)} --procs 1\nimport os, time",
        ):
            reply = kc.execute_interactive(cell, output_hook=hook, timeout=180)
            assert reply["content"]["status"] == "ok", "".join(texts)
        assert all(len(ours_on(cluster, n)) == 3 for n in (0, 1))  # agent, relay, rank
        mark = tmp_path / "running"
        kc.execute(
            "%%distributed --session doomed\n"
            f"open({str(mark)!r} + os.environ['RANK'], 'w').close()\ntime.sleep(600)"
        )
        deadline = time.monotonic() + 120
        while not all(Path(f"{mark}{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the cell did not start on both nodes"
            time.sleep(0.05)
        kc.stop_channels()
    finally:
        kernel_process(km).kill()
        km.cleanup_resources()
    deadline = time.monotonic() + 60
    while any(ours_on(cluster, n) for n in (0, 1)):
        left = {n: [p.pid for p in ours_on(cluster, n)] for n in (0, 1)}
        assert time.monotonic() < deadline, f"left on the nodes after 60 s: {left}"
        time.sleep(0.2)
