"""Stopping a cell whose rank cannot be interrupted, in a real notebook kernel.

The most common hang: rank 0 waits in ``dist.barrier()`` for a rank that already finished
the cell. The interrupt cannot reach it (the wait is in C++). The stop button ends the
cell all the same: the rank that did not take the interrupt, its stack outside Python, is
freed by shutting its process group's connections, so the barrier fails and the interrupt
is raised; one message says so, every rank joins a new group, and the next cell runs with
every rank's variables kept. Stopping the minGPT notebook's DDP trainer, where a rank may
wait in the backward pass's all-reduce for one that took the interrupt in its forward
pass, keeps every rank ten times in ten. A failed rank's wind-down is announced as soon
as it starts, on one line that updates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_dist.text import strip_ansi

from .test_notebook_kernel import NotebookKernel, nbk
from .test_recovery import busy_machine

__all__ = ["busy_machine", "nbk"]  # the fixtures, used by name
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
pytestmark = pytest.mark.slow

#: rank 0 waits in a barrier rank 1 never joins; rank 1 says it is done and ends the cell
HANG = "%%distributed\nif dist.get_rank() == 0:\n    dist.barrier()\nprint('finished', flush=True)"


def follow(
    nbk: NotebookKernel, msg_id: str, until: str, timeout: float = 90
) -> list[dict[str, Any]]:
    """The cell's IOPub messages up to the first stream message holding ``until``."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = nbk.kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "stream" and until in msg["content"]["text"]:
            return seen
    raise AssertionError(f"{until!r} never came: {seen}")


def until_idle(nbk: NotebookKernel, msg_id: str, timeout: float = 120) -> list[dict[str, Any]]:
    """The cell's IOPub messages up to its idle status."""
    seen: list[dict[str, Any]] = []
    while True:
        msg = nbk.kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen


def test_the_stop_button_frees_the_rank_blocked_in_a_barrier_and_every_rank_keeps_its_state(
    nbk: NotebookKernel,
) -> None:
    nbk.execute("import os\nos.environ['JUPYTER_DIST_INTERRUPT_ACK_S'] = '3'")
    setup = (
        "%%distributed --procs 2\nimport torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "kept = 10 + dist.get_rank()\ntorch.manual_seed(0)\nddp = DDP(torch.nn.Linear(2, 1))\n"
        "opt = torch.optim.SGD(ddp.parameters(), lr=0.1)"
    )
    assert nbk.execute(setup)["status"] == "ok"
    pids = nbk.our_pids()
    msg_id = nbk.kc.execute(HANG)
    follow(nbk, msg_id, "finished")  # rank 1 is done; rank 0 waits in the barrier
    time.sleep(0.5)
    nbk.km.interrupt_kernel()
    reply = nbk.kc.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "CellInterrupted"
    shown = strip_ansi("\n".join(reply["content"]["traceback"]))
    first = shown.splitlines()[0]
    # the ranks are named for what is true of them: rank 1 had finished
    assert first == (
        "CellInterrupted: interrupted on rank 0 in session 'default'; rank 1 had finished"
    ), shown
    assert "rank 0: in barrier" in shown, shown
    # one message: rank 0 was freed from the barrier, no rank replaced, a new group
    flat = " ".join(shown.split())
    assert "Rank 0 was blocked in a collective the other ranks were not in" in flat, shown
    assert "shutting the process group's connections freed it" in flat, shown
    assert "Every rank kept its variables" in flat and "generation 1" in flat, shown
    assert "Rebuilt on the new group in place: ddp (a DDP model)." in flat, shown
    assert "replaced" not in flat and "could not be stopped" not in flat, shown
    messages = until_idle(nbk, msg_id)
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "blocked in a collective" not in printed  # said once, in the error

    assert nbk.our_pids() == pids  # the agent and both ranks are the same processes

    nbk.text.clear()
    time.sleep(0.5)  # ipykernel aborts a request that comes before the error is handled
    after = nbk.execute(
        "%%distributed\nimport torch, torch.distributed as dist, jupyter_dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "print(globals().get('kept'), dist.get_rank(), t.item(), jupyter_dist.info().generation)\n"
        "x = torch.full((4, 2), float(dist.get_rank() + 1))\n"  # different data, same grads
        "opt.zero_grad(); ddp(x).sum().backward(); opt.step()\n"
        "print('grad', ddp.module.weight.grad.tolist())",
        timeout=120,
    )
    assert after["status"] == "ok", strip_ansi("".join(nbk.text))
    out = "".join(nbk.text)
    assert "[rank 0] 10 0 2.0 1" in out and "[rank 1] 11 1 2.0 1" in out, out
    assert "[ranks 0-1] grad [[6.0, 6.0]]" in out, out  # averaged over the new group


def test_a_failed_ranks_wind_down_is_announced_at_once_on_one_line(nbk: NotebookKernel) -> None:
    nbk.execute("import os\nos.environ['JUPYTER_DIST_ABORT_AFTER_S'] = '4'")
    setup = "%%distributed --procs 2\nimport torch, torch.distributed as dist"
    assert nbk.execute(setup)["status"] == "ok"
    msg_id = nbk.kc.execute(
        "%%distributed\nif dist.get_rank() == 1:\n    raise ValueError('bad batch')\ndist.barrier()"
    )
    messages = until_idle(nbk, msg_id)
    shown = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data")]
    ids = {
        m["content"]["transient"]["display_id"]
        for m in shown
        if "interrupting" in m["content"]["data"].get("text/plain", "")
    }
    assert len(ids) == 1, shown  # one line
    lines = [m for m in shown if m["content"]["transient"].get("display_id") in ids]
    texts = [m["content"]["data"]["text/plain"] for m in lines]
    assert texts[-1] == ""  # emptied when the cell ended: its error says it again
    texts = texts[:-1]
    # said when rank 1 failed, before the interrupt: what waits, and for how long
    assert texts[0] == (
        "[jupyter_dist] rank 1 failed (ValueError: bad batch); rank 0 still running: "
        "interrupting it in 4 s unless it finishes"
    ), texts
    assert "interrupting rank 0, still running 4 s later" in texts[-1], texts
    # the first display, then updates of that display
    assert lines[0]["msg_type"] == "display_data"
    assert all(m["msg_type"] == "update_display_data" for m in lines[1:]), texts
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "interrupting" not in printed, printed


def test_the_stop_button_on_the_mingpt_notebook_keeps_its_ranks_ten_times_in_ten(
    nbk: NotebookKernel, busy_machine: None
) -> None:
    """The minGPT DDP notebook's trainer stopped at ten moments of its loop, beside two busy
    processes, with the settings a new user has: every stop ends the cell, no rank is
    replaced, and the trained model is still there afterwards."""
    cells = nbformat.read(NOTEBOOKS / "mingpt_ddp.ipynb", as_version=4).cells
    setup = [c.source for c in cells if c.source.startswith("%%writefile mingpt_setup.py")]
    assert nbk.execute(setup[0])["status"] == "ok"
    start = "%%distributed --procs 2 --session gpt\n%run -i mingpt_setup.py"
    assert nbk.execute(start, timeout=240)["status"] == "ok", strip_ansi("".join(nbk.text))
    pids = nbk.our_pids()
    freed = 0  # stops that found a rank waiting in an all-reduce the other had left
    for attempt in range(10):
        nbk.text.clear()
        msg_id = nbk.kc.execute("%%distributed --session gpt\ntrain(10**6)")
        time.sleep(2.0 + 0.37 * (attempt % 4))  # at different places of a step
        nbk.km.interrupt_kernel()
        reply = nbk.kc.get_shell_msg(timeout=180)
        assert reply["parent_header"]["msg_id"] == msg_id
        shown = strip_ansi("\n".join(reply["content"].get("traceback", [])))
        assert reply["content"]["ename"] == "CellInterrupted", f"attempt {attempt}: {shown}"
        assert "replaced" not in shown, f"attempt {attempt}: {shown}"
        freed += "freed it" in " ".join(shown.split())
        until_idle(nbk, msg_id)
        assert nbk.our_pids() == pids, f"attempt {attempt}: {shown}"
        time.sleep(0.3)  # ipykernel aborts a request that comes before the error is handled
    nbk.text.clear()
    after = nbk.execute(
        "%%distributed --session gpt\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "print('model' in globals(), t.item())\n"
        "steps_per_epoch = 2\ntrain(epochs_run + 1)\nprint('trained on', epochs_run)",
        timeout=240,
    )
    assert after["status"] == "ok", strip_ansi("".join(nbk.text))
    out = "".join(nbk.text)
    for rank in (0, 1):
        assert f"[rank {rank}] True 2.0" in out or "[ranks 0-1] True 2.0" in out, (freed, out)
        assert f"[rank {rank}] trained on" in out or "[ranks 0-1] trained on" in out, out
