"""A fault costs only what it touched: a dead or stuck rank is replaced by a fresh one of
the same rank number, every other rank keeps its variables, and all join a new group."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from jupyter_dist.errors import RanksFailed
from tests.conftest import CellOutput, session_status, started_session

Run = Callable[[str], CellOutput]
ALL_REDUCE = (
    "import torch, torch.distributed as dist, jupyter_dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('sum', t.item(), 'generation', jupyter_dist.info().generation)"
)


@pytest.fixture
def heal_session(shell: object) -> Iterator[str]:
    yield from started_session(shell, "heal", "--procs 3")


def test_a_rank_killed_mid_cell_is_replaced_and_the_others_keep_their_state(
    run: Run, heal_session: str
) -> None:
    name = heal_session
    assert run(
        f"%%distributed --session {name}\nimport os, signal, time\nkept = 100 + int(os.environ['RANK'])"
    ).ok
    pids = {r["rank"]: r["pid"] for r in session_status(name)["ranks"]}
    out = run(
        f"%%distributed --session {name}\n"
        "if int(os.environ['RANK']) == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(0.5)"
    )
    assert isinstance(out.error, RanksFailed)
    assert session_status(name)["state"] == "degraded"

    began = time.monotonic()
    back = run(
        f"%%distributed --session {name}\n{ALL_REDUCE}\nprint('kept', 'kept' in dir() and kept)"
    )
    assert back.ok, back.stdout + back.stderr
    assert "rank 1 replaced by a fresh rank kernel" in back.stdout + back.stderr
    assert "sum 6.0 generation 1" in back.stdout
    assert "[rank 0] kept 100" in back.stdout.replace("[ranks 0", "[rank 0")
    assert "[rank 2] kept 102" in back.stdout
    assert "[rank 1] kept False" in back.stdout
    status = session_status(name)
    assert status["state"] == "ready"
    new = {r["rank"]: r["pid"] for r in status["ranks"]}
    assert new[0] == pids[0] and new[2] == pids[2] and new[1] != pids[1]
    assert not psutil.pid_exists(pids[1]) or psutil.Process(pids[1]).status() == "zombie"
    print(f"healed in {time.monotonic() - began:.1f} s")
