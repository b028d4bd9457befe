"""Stopping a cell whose rank cannot be interrupted, in a real notebook kernel.

The most common hang: rank 0 waits in ``dist.barrier()`` for a rank that already finished
the cell. The interrupt cannot reach it (the wait is in C++). The stop button ends the
cell all the same: the rank that did not take the interrupt, its stack outside Python, is
replaced by a fresh one, one message says which rank was replaced, why, and that only it
starts empty, and the next cell runs with the other rank's variables kept. A failed
rank's wind-down is announced as soon as it starts, on one line that updates.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from jupyter_dist.text import strip_ansi

from .test_notebook_kernel import NotebookKernel, nbk, wait_gone

__all__ = ["nbk"]  # the fixture, used by name
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


def test_the_stop_button_replaces_only_the_rank_blocked_in_a_barrier(
    nbk: NotebookKernel,
) -> None:
    nbk.execute("import os\nos.environ['JUPYTER_DIST_INTERRUPT_ACK_S'] = '3'")
    setup = (
        "%%distributed --procs 2\nimport torch, torch.distributed as dist\n"
        "kept = 10 + dist.get_rank()"
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
        "CellInterrupted: interrupted in session 'default': rank 0 did not stop; "
        "rank 1 had finished"
    ), shown
    assert "rank 0: in barrier" in shown, shown
    # one message: which rank was replaced, why, and that only it starts empty
    flat = " ".join(shown.split())
    assert "rank 0 could not be stopped (blocked in C code, most likely a collective" in flat
    assert "rank 0 replaced by a fresh rank kernel" in flat, shown
    assert "It starts empty; every other rank kept its variables" in flat, shown
    assert "generation 1" in flat
    assert "still running" not in shown and "stacks button" not in shown
    messages = until_idle(nbk, msg_id)
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "could not be stopped" not in printed  # said once, in the error
    agent, rank0, rank1 = pids
    assert wait_gone([rank0], 20) == []  # the stuck rank is gone: it runs no lost cell
    assert nbk.our_pids()[0::2] == [agent, rank1]  # the agent and rank 1 are the same

    nbk.text.clear()
    time.sleep(0.5)  # ipykernel aborts a request that comes before the error is handled
    after = nbk.execute(
        "%%distributed\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "print(globals().get('kept'), dist.get_rank(), t.item())",
        timeout=120,
    )
    assert after["status"] == "ok", strip_ansi("".join(nbk.text))
    out = "".join(nbk.text)
    assert "[rank 0] None 0 2.0" in out and "[rank 1] 11 1 2.0" in out, out


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
