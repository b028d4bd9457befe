"""Faults of the link to a node and of a whole node, across two real sshd nodes: a link
that goes down without a reset (no RST, as after a power loss or a preemption) and a node
whose jupyter_dist processes all die at once."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from jupyter_dist.errors import RanksFailed
from jupyter_dist.settings import NODE_DEADLINE_VAR
from tests.conftest import CellOutput, session_status

from .test_ssh_faults import ours_on
from .test_ssh_sessions import flags, netns_pids

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]
#: a cell that says it runs, on each rank (a file ``<mark>-<rank>``), then sleeps
RUNNING = (
    "%%distributed --session {name}\nimport os, time\n"
    "open({mark!r} + '-' + os.environ['RANK'], 'w').close()\ntime.sleep({sleep})"
)


class WhenRunning:
    """Within its ``with``: calls ``fault`` from a thread as soon as the `RUNNING` cell
    with ``mark`` runs on each of ``ranks`` ranks, and keeps when in ``at`` (None: not
    yet, or a minute went by first)."""

    def __init__(self, mark: Path, ranks: int, fault: Callable[[], None]) -> None:
        self.marks = [Path(f"{mark}-{r}") for r in range(ranks)]
        self.fault = fault
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self._stop.is_set():
            if all(m.exists() for m in self.marks):
                self.at = time.monotonic()
                self.fault()
                return
            time.sleep(0.05)

    def __enter__(self) -> WhenRunning:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def since(self) -> float:
        """Seconds since the fault; fails the test if it never came."""
        assert self.at is not None, (
            f"the cell did not run on every rank within a minute: {self.marks}"
        )
        return time.monotonic() - self.at


def set_link(cluster: Any, node: int, state: str) -> None:
    """Node ``node``'s cable, as the bridge sees it: ``down`` drops every packet both ways
    with nothing sent back."""
    subprocess.run(
        ["ip", "link", "set", "dev", f"{cluster.prefix}-h{node}", state],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def shut_down(run: Run) -> Iterator[list[str]]:
    """Sessions named here are shut down after the test, whatever became of it: one left
    running would be counted by the next test on the same nodes."""
    names: list[str] = []
    yield names
    for name in names:
        run(f"%dist shutdown --session {name}")


def test_a_link_lost_without_a_reset_fails_the_cell_naming_the_node_and_its_ranks_go(
    run: Run, cluster: Any, shut_down: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a node silent for 10 s is lost (20 s by default), and its agent stops its ranks once
    # the notebook side was silent for 20 s: the same path as the defaults, sooner
    monkeypatch.setenv(NODE_DEADLINE_VAR, "10")
    shut_down.append("cut")
    out = run(f"%%distributed --session cut {flags(cluster)} --procs 1\nimport os, time")
    assert out.ok, out.stdout + out.stderr
    node1 = {r["pid"] for r in session_status("cut")["ranks"] if r["node_rank"] == 1}
    assert node1 and node1 <= netns_pids(cluster, 1)
    try:
        with WhenRunning(tmp_path / "running", 2, lambda: set_link(cluster, 1, "down")) as cut:
            out = run(RUNNING.format(name="cut", mark=str(tmp_path / "running"), sleep=300))
        took = cut.since()
        assert isinstance(out.error, RanksFailed), out.stdout + out.stderr
        assert took <= 30, f"the cell failed {took:.0f} s after the link went down"
        text = f"{out.error}\n{out.stdout}"
        assert re.search(r"node 'node1' unreachable since \d\d:\d\d:\d\d", text), text
        assert {f.rank: f.ename for f in out.error.failures}[1] == "NodeLost"
        status = session_status("cut")
        assert [n["lost"] for n in status["nodes"]] == [False, True]
        assert status["state"] == "degraded"
        assert [f.split(" (")[0] for f in status["faults"]] == ["rank 1 was lost"], status
        # the node's agent stops its ranks once the notebook side has gone quiet
        deadline = time.monotonic() + 60
        while node1 & netns_pids(cluster, 1) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not node1 & netns_pids(cluster, 1), "ranks left running on node1: " + "\n".join(
            subprocess.run(
                ["ps", "-o", "pid,ppid,stat,wchan:20,etime,args", "-p", str(p)],
                check=False,
                capture_output=True,
                text=True,
            ).stdout
            for p in netns_pids(cluster, 1)
        )
    finally:
        set_link(cluster, 1, "up")
    # the link is back: a heal starts node 1 again; rank 0 keeps its variables
    again = run("%dist heal --session cut")
    assert again.ok, again.stdout + again.stderr
    said = " ".join(again.stdout.split())
    assert "rank 1 replaced by a fresh rank kernel (node 1 started again)" in said, said
    after = run(
        "%%distributed --session cut\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); print(t.item())\n"
        "print('kept', 'time' in globals())"
    )
    assert "[rank 0] kept True" in after.stdout and "[rank 1] kept False" in after.stdout, (
        after.stdout
    )
    # each rank printed the sum (a C-level warning of the restarted rank's process group
    # may come in between, or late, and keep the two lines apart)
    printed = after.stdout
    assert after.ok, printed + after.stderr
    assert "[ranks 0-1] 2.0" in printed or (
        "[rank 0] 2.0" in printed and "[rank 1] 2.0" in printed
    ), printed


def test_a_node_whose_processes_all_die_is_told_as_lost_not_as_a_relay_restart(
    run: Run, cluster: Any, shut_down: list[str], tmp_path: Path
) -> None:
    shut_down.append("crash")
    out = run(f"%%distributed --session crash {flags(cluster)} --procs 1\nimport os, time")
    assert out.ok, out.stdout + out.stderr
    procs = ours_on(cluster, 1)  # its agent, its relay and its rank
    assert len(procs) == 3, procs

    def kill_all() -> None:
        """All at once, as a node's power loss: each is stopped first, so that the agent
        cannot report the rank it outlives by a few milliseconds on a busy machine."""
        for proc in procs:
            proc.suspend()
        for proc in procs:
            proc.kill()

    with WhenRunning(tmp_path / "running", 2, kill_all) as killer:
        out = run(RUNNING.format(name="crash", mark=str(tmp_path / "running"), sleep=120))
    killer.since()
    assert isinstance(out.error, RanksFailed), out.stdout + out.stderr
    text = f"{out.error}\n{out.stdout}"
    assert "node 'node1': the agent was killed by signal SIGKILL" in text, text
    assert "keeps its state" not in text and "relay" not in text, text
    assert run("%dist shutdown --session crash").ok
