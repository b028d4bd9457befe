"""Processes a rank started, with real ranks: ``torch.multiprocessing.spawn`` works in a
rank (its children make a group of their own), and what a cell started is ended when the
cell times out, and when the session restarts or shuts down, even a program that left
the rank's process group."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import started_session

pytestmark = pytest.mark.slow

#: ``fn`` for mp.spawn: a group of two children, an all_reduce, the sum written to a
#: file; then, with ``hang``, they wait deaf to SIGINT, as a worker blocked in C does (and
#: say so first: a ``deaf-`` file beside the sum's, written once SIGINT is ignored)
WORKERS = """
import os, signal, time
import torch, torch.distributed as dist

def work(i, port, out, hang):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hang:
        folder, name = os.path.split(out)
        open(os.path.join(folder, f"deaf-{name}.{i}"), "w").close()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=i, world_size=2)
    t = torch.tensor([i + 1.0])
    dist.all_reduce(t)
    with open(f"{out}.{i}", "w") as f:
        f.write(str(t.item()))
    while hang:
        time.sleep(1)
    dist.destroy_process_group()
"""

#: the rank's live child processes, multiprocessing's resource tracker left out; waits
#: up to a minute for them to go
COUNT = """
import time, psutil
def live_children():
    kids = psutil.Process().children(recursive=True)
    return [p for p in kids if p.status() != psutil.STATUS_ZOMBIE
            and 'resource_tracker' not in ' '.join(p.cmdline())]
deadline = time.monotonic() + 60
while live_children() and time.monotonic() < deadline:
    time.sleep(0.2)
print('children', len(live_children()))
"""


@pytest.fixture
def workers(tmp_path: Path) -> Path:
    (tmp_path / "spawn_workers.py").write_text(WORKERS)
    return tmp_path


@pytest.fixture
def session(shell: Any) -> Iterator[str]:
    yield from started_session(shell, "children")


def spawn_cell(folder: Path, hang: bool) -> str:
    return (
        f"import os, socket, sys\nsys.path.insert(0, {str(folder)!r})\n"
        "import torch.multiprocessing as mp, spawn_workers\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        f"out = os.path.join({str(folder)!r}, 'sum-' + os.environ['RANK'])\n"
        f"mp.spawn(spawn_workers.work, args=(port, out, {hang}), nprocs=2)\n"
        "print('spawned')\n"
    )


def sums(folder: Path) -> list[str]:
    found = sorted(folder.glob("sum-*"))
    texts = [p.read_text() for p in found]
    for p in found:
        p.unlink()
    return texts


def test_mp_spawn_works_in_a_rank_twice(run: Any, session: str, workers: Path) -> None:
    for _ in range(2):
        out = run(f"%%distributed --session {session} --timeout 120\n{spawn_cell(workers, False)}")
        assert out.ok, out.stdout + out.stderr
        assert out.stdout.count("spawned") in (1, 2), out.stdout  # said together or apart
        assert sums(workers) == ["3.0"] * 4  # two children a rank, 1 + 2 each


#: the hanging cell's --timeout: long enough for both ranks' children to start (a spawned
#: child imports torch) and ignore SIGINT, which each says in a file (3.5 s on 2 cores
#: beside two CPU-bound processes; more than 10 s in a full run's busiest minutes)
HANG_TIMEOUT_S = 20


def test_mp_spawn_children_end_when_the_cell_times_out(
    run: Any, session: str, workers: Path
) -> None:
    kept = run(f"%%distributed --session {session}\nmarker = 'kept'")
    assert kept.ok, kept.stdout + kept.stderr
    for _ in range(2):  # the same cell again, in the same ranks
        # the children are started at once and ignore the interrupt's SIGINT; whether they
        # made their group before the timeout or not (a loaded machine) does not matter
        out = run(
            f"%%distributed --session {session} --timeout {HANG_TIMEOUT_S}\n"
            f"{spawn_cell(workers, True)}"
        )
        assert not out.ok, out.stdout
        assert "timed out" in out.stdout + out.stderr + str(out.error), out.stdout
        deaf = sorted(p.name for p in workers.glob("deaf-*"))
        assert deaf == [f"deaf-sum-{r}.{i}" for r in (0, 1) for i in (0, 1)], (
            f"not every child was up and deaf to SIGINT {HANG_TIMEOUT_S} s into the cell: {deaf}"
        )
        for p in workers.glob("deaf-*"):
            p.unlink()
        count = run(f"%%distributed --session {session} --timeout 120\n{COUNT}")
        assert count.ok, count.stdout + count.stderr
        assert "[ranks 0-1] children 0" in count.stdout, count.stdout
        alive = run(f"%%distributed --session {session}\nprint(marker)")
        assert "[ranks 0-1] kept" in alive.stdout, alive.stdout  # the ranks lived on


POPEN = (
    "import subprocess\n"
    "p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "print('pid', p.pid)\n"
)


def started_pids(out: Any) -> list[int]:
    assert out.ok, out.stdout + out.stderr
    pids = [int(pid) for pid in re.findall(r"pid (\d+)", out.stdout)]
    assert len(pids) == 2, out.stdout
    return pids


def wait_gone(pids: list[int], timeout_s: float = 60) -> list[int]:
    """Those of ``pids`` still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pid in pids if alive(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_subprocess_of_a_cell_goes_on_restart_and_on_shutdown(shell: Any, run: Any) -> None:
    name = "children-restart"
    try:
        pids = started_pids(run(f"%%distributed --session {name} --procs 2\n{POPEN}"))
        shell.run_line_magic("dist", f"restart --session {name}")
        assert wait_gone(pids) == [], "left running after a restart"
        pids = started_pids(run(f"%%distributed --session {name}\n{POPEN}"))
    finally:
        shell.run_line_magic("dist", f"shutdown --session {name}")
    assert wait_gone(pids) == [], "left running after a shutdown"
