"""A fault costs only what it touched: a dead, stuck or lost rank is replaced by a fresh
one of the same rank number, every other rank keeps its variables, and all join a new
process group; an interrupt that is being handled is never taken for a hang; a live
session grows and shrinks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from jupyter_dist.errors import CellInterrupted, RanksFailed
from jupyter_dist.settings import INTERRUPT_ACK_VAR
from tests.conftest import CellOutput, session_status, started_session

Run = Callable[[str], CellOutput]
ALL_REDUCE = (
    "import torch, torch.distributed as dist, jupyter_dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('sum', t.item(), 'world', dist.get_world_size(), 'generation', "
    "jupyter_dist.info().generation)"
)


def rank_pids(name: str) -> dict[int, int]:
    return {r["rank"]: r["pid"] for r in session_status(name)["ranks"]}


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """Two processes that keep both cores busy, as a loaded machine has them."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(2)]
    yield
    for proc in procs:
        proc.kill()
        proc.wait()


def interrupt_later(shell: Any, name: str, after: float) -> threading.Timer:
    """``%dist interrupt`` from another thread ``after`` seconds from now, as the stop
    button does while the cell runs."""
    timer = threading.Timer(after, shell.run_line_magic, ("dist", f"interrupt --session {name}"))
    timer.start()
    return timer


@pytest.fixture
def three(shell: Any) -> Iterator[str]:
    yield from started_session(shell, "heal3", "--procs 3")


def test_a_rank_killed_mid_cell_is_replaced_and_the_others_keep_their_state(
    run: Run, three: str
) -> None:
    name = three
    setup = "import os, signal, time\nkept = 100 + int(os.environ['RANK'])"
    assert run(f"%%distributed --session {name}\n{setup}").ok
    pids = rank_pids(name)
    out = run(
        f"%%distributed --session {name}\n"
        "if int(os.environ['RANK']) == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(0.5)"
    )
    assert isinstance(out.error, RanksFailed)
    status = session_status(name)
    assert status["state"] == "degraded"
    assert status["faults"] == ["rank 1 died (killed by signal SIGKILL (9))"]

    back = run(
        f"%%distributed --session {name}\n{ALL_REDUCE}\nprint('kept', globals().get('kept'))"
    )
    assert back.ok, back.stdout + back.stderr
    said = " ".join((back.stdout + back.stderr).split())
    assert "rank 1 replaced by a fresh rank kernel: rank 1 died (killed by signal SIGKILL" in said
    assert "It starts empty; every other rank kept its variables" in said
    assert "[ranks 0-2] sum 6.0 world 3 generation 1" in back.stdout
    assert "[rank 0] kept 100" in back.stdout and "[rank 2] kept 102" in back.stdout
    assert "[rank 1] kept None" in back.stdout
    status = session_status(name)
    assert (status["state"], status["generation"], status["faults"]) == ("ready", 1, [])
    new = rank_pids(name)
    assert (new[0], new[2]) == (pids[0], pids[2]) and new[1] != pids[1]
    assert gone(pids[1])
    again = run(f"%%distributed --session {name}\n{ALL_REDUCE}")  # said once, not again
    assert "replaced" not in again.stdout + again.stderr


def test_an_idle_rank_killed_and_rank_zero_replaced_get_a_new_store(run: Run, three: str) -> None:
    """Rank 0 hosts the session's store: replacing it moves the store to the new rank 0."""
    name = three
    assert run(f"%%distributed --session {name}\nimport os\nkept = int(os.environ['RANK'])").ok
    pids = rank_pids(name)
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while session_status(name)["state"] != "degraded" and time.monotonic() < deadline:
        time.sleep(0.05)
    back = run(
        f"%%distributed --session {name}\n{ALL_REDUCE}\nprint('kept', globals().get('kept'))"
    )
    assert back.ok, back.stdout + back.stderr
    assert "[ranks 0-2] sum 6.0 world 3 generation 1" in back.stdout
    assert "[rank 1] kept 1" in back.stdout and "[rank 0] kept None" in back.stdout
    new = rank_pids(name)
    assert (new[1], new[2]) == (pids[1], pids[2]) and new[0] != pids[0]


DDP_SETUP = """\
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

def batch(step):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    return torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)

def train(ddp, opt, steps):
    for step in steps:
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
"""


def test_a_ddp_loop_that_lost_rank_1_goes_on_bitwise_as_an_unbroken_run(
    run: Run, shell: Any
) -> None:
    for _ in started_session(shell, "ddp", "--procs 2"):
        assert run(f"%%distributed --session ddp\n{DDP_SETUP}").ok
        unbroken = run(
            "%%distributed --session ddp\n"
            "ref_model = net(); ref_opt = torch.optim.SGD(ref_model.parameters(), 0.05, 0.9)\n"
            "train(DDP(ref_model), ref_opt, range(20))\n"
            "ref = [p.detach().clone() for p in ref_model.parameters()]"
        )
        assert unbroken.ok, unbroken.stdout + unbroken.stderr
        first = run(
            "%%distributed --session ddp\n"
            "model = net(); opt = torch.optim.SGD(model.parameters(), 0.05, 0.9)\n"
            "ddp = DDP(model); train(ddp, opt, range(10))"
        )
        assert first.ok
        kill = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
        run(f"%%distributed --session ddp --ranks 1\n{kill}")
        # the next cell replaces rank 1; it defines the functions again (rank 1 is empty)
        healed = run(f"%%distributed --session ddp\n{DDP_SETUP}")
        assert healed.ok, healed.stdout + healed.stderr
        said = " ".join((healed.stdout + healed.stderr).split())
        assert "Built on the old group, rebuild on every rank: ddp (a DDP model)" in said
        shell.run_line_magic("dist", "sync model,opt --from 0 --session ddp")
        after = run(
            "%%distributed --session ddp\n"
            "ddp = DDP(model); train(ddp, opt, range(10, 20))\n"
            "ref = globals().get('ref', [])\n"
            "same = bool(ref) and all(torch.equal(a, b) for a, b in zip(model.parameters(), ref))\n"
            "print('bitwise', same)"
        )
        assert after.ok, after.stdout + after.stderr
        # rank 1 was replaced, so only rank 0 kept the unbroken run's weights to compare
        assert "[rank 0] bitwise True" in after.stdout, after.stdout
        check = run(
            "%%distributed --session ddp\n"
            "w = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
            "ws = [torch.zeros_like(w) for _ in range(2)]; dist.all_gather(ws, w)\n"
            "print('ranks agree', torch.equal(ws[0], ws[1]))"
        )
        assert "[ranks 0-1] ranks agree True" in check.stdout, check.stdout


def test_an_interrupt_being_handled_keeps_the_session_beside_two_busy_processes(
    run: Run, shell: Any, busy_machine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell whose ``except KeyboardInterrupt:`` cleans up for 6 s ends with the cleanup
    done and every variable kept, however much longer than the ack bound it takes; and a
    training loop stopped from another thread keeps its ranks each time."""
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "2")
    for name in started_session(shell, "stop", "--procs 2"):
        loop = (
            "import time, torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "data = DataLoader(TensorDataset(torch.randn(4096, 16)), batch_size=32)\n"
            "model = torch.nn.Linear(16, 1)\nkept = 'yes'"
        )
        assert run(f"%%distributed --session {name}\n{loop}").ok
        pids = rank_pids(name)
        timer = interrupt_later(shell, name, 3.0)
        out = run(
            f"%%distributed --session {name}\n"
            "try:\n    while True:\n        time.sleep(0.01)\n"
            "except KeyboardInterrupt:\n    time.sleep(6)\n    cleaned = True\n    raise"
        )
        timer.join()
        assert isinstance(out.error, CellInterrupted | RanksFailed), out.stdout + out.stderr
        assert "replaced" not in out.stdout + out.stderr + str(out.error)
        assert rank_pids(name) == pids
        check = run(f"%%distributed --session {name}\nprint(cleaned, kept)")
        assert "[ranks 0-1] True yes" in check.stdout, check.stdout
        for attempt in range(3):  # ten times in ten: the minGPT notebook's (test_stop_hang)
            timer = interrupt_later(shell, name, 1.0)
            stopped = run(
                f"%%distributed --session {name}\n"
                "for epoch in range(10**6):\n"
                "    for (x,) in data:\n        model(x).sum().backward()"
            )
            timer.join()
            assert stopped.error is not None, f"attempt {attempt}: the loop was not stopped"
            assert rank_pids(name) == pids, f"attempt {attempt}: {stopped.stdout}{stopped.stderr}"
        assert run(f"%%distributed --session {name}\n{ALL_REDUCE}").ok


def test_resize_two_three_two_ranks_keeps_every_survivor(run: Run, shell: Any) -> None:
    for name in started_session(shell, "grow", "--procs 2"):
        setup = "import os\nkept = 50 + int(os.environ['RANK'])"
        assert run(f"%%distributed --session {name}\n{setup}").ok
        pids = rank_pids(name)
        shell.run_line_magic("dist", f"resize --procs 3 --session {name}")
        show = "print('kept', globals().get('kept'), os.environ['WORLD_SIZE'])"
        grown = run(f"%%distributed --session {name}\nimport os\n{ALL_REDUCE}\n{show}")
        assert "[ranks 0-2] sum 6.0 world 3 generation 1" in grown.stdout, grown.stdout
        assert "[rank 0] kept 50 3" in grown.stdout and "[rank 1] kept 51 3" in grown.stdout
        assert "[rank 2] kept None 3" in grown.stdout
        assert {r: p for r, p in rank_pids(name).items() if r < 2} == pids
        shell.run_line_magic("dist", f"resize --procs 2 --session {name}")
        shrunk = run(f"%%distributed --session {name}\n{ALL_REDUCE}\n{show}")
        assert "[ranks 0-1] sum 3.0 world 2 generation 2" in shrunk.stdout, shrunk.stdout
        assert "[rank 0] kept 50 2" in shrunk.stdout and "[rank 1] kept 51 2" in shrunk.stdout
        assert rank_pids(name) == pids


def test_sync_names_what_is_missing_and_refuses_sharded_state(run: Run, shell: Any) -> None:
    for name in started_session(shell, "syncing", "--procs 2"):
        assert run(f"%%distributed --session {name}\nimport torch\nw = torch.arange(4.0)").ok
        with pytest.raises(Exception, match="'nothing' is not defined on rank 0"):
            shell.run_line_magic("dist", f"sync nothing --from 0 --session {name}")
        shell.run_line_magic("dist", f"sync w --from 0 --to 1 --session {name}")
        assert shell.run_line_magic("dist", f"pull w --session {name}")[1].tolist() == [0, 1, 2, 3]
        fake = "class DTensor:\n    pass\nshard = DTensor()"
        assert run(f"%%distributed --session {name} --ranks 0\n{fake}").ok
        with pytest.raises(Exception, match="shard is sharded across ranks"):
            shell.run_line_magic("dist", f"sync shard --from 0 --session {name}")
