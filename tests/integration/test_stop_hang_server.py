"""Stopping a cell whose rank cannot be interrupted, on a session a real Jupyter server owns.

Rank 0 of notebook A's cell waits in ``dist.barrier()`` for rank 1, which finished. The
notebook's stop button, the sidebar's Interrupt (the REST route) and ``%dist interrupt``
from another notebook all end the cell within a few seconds: rank 0 does not take the
interrupt within ``JUPYTER_DIST_INTERRUPT_ACK_S`` (3 s here) and its stack stays in C
code, so the notebook running the cell has the server free it from the barrier (its process
group's connections shut), says so once, and the next cell runs on a new group with every
rank's variables kept. A cell of another notebook
queued behind it waits on one line that says what it waits for, and then runs on the
new process group.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.settings import INTERRUPT_ACK_VAR

from .server_process import API, Server, serving_text_output
from .test_server_kernels import ServerKernel
from .test_shared_sessions import later, wait_for

pytestmark = pytest.mark.slow
SESSION = "hang"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # the notebook kernels, which judge their cells' ranks, inherit it
    env = {INTERRUPT_ACK_VAR: "3"}
    with serving_text_output(tmp_path_factory.mktemp("stop-hang"), env) as running:
        yield running


@pytest.fixture
def pair(server: Server, kernel_name: str) -> Iterator[tuple[ServerKernel, ServerKernel]]:
    """Notebook A starts the session, notebook B attaches to it."""
    a = ServerKernel(server, "train.ipynb", kernel_name)
    b = ServerKernel(server, "eval.ipynb", kernel_name)
    try:
        a.ok("%load_ext jupyter_dist")
        b.ok("%load_ext jupyter_dist")
        a.ok(f"%%distributed --procs 2 --session {SESSION}\nimport torch.distributed as dist")
        b.ok(f"%dist attach {SESSION}")
        yield a, b
    finally:
        _status, _ = server.call("DELETE", f"{API}/sessions/{SESSION}")
        for kernel in (a, b):
            with contextlib.suppress(Exception):
                kernel.close()


def hang(mark: Path) -> str:
    """Rank 0 waits in a barrier rank 1 never joins; rank 1 finishes, leaving ``mark``."""
    return (
        f"%%distributed --session {SESSION}\n"
        "if dist.get_rank() == 0:\n"
        "    dist.barrier()\n"
        f"open({str(mark)!r}, 'w').close()"
    )


def status_of(server: Server) -> dict[str, Any]:
    code, found = server.call("GET", f"{API}/sessions/{SESSION}")
    assert code == 200, found
    return dict(found)


def running_sender(server: Server) -> str:
    running = status_of(server)["running"]
    return "" if running is None else str(running["path"])


def pids_of(server: Server) -> list[int]:
    return [int(r["pid"]) for r in status_of(server)["ranks"]]


def assert_every_rank_kept(server: Server, old: list[int]) -> None:
    status = status_of(server)
    assert (status["state"], status["generation"]) == ("ready", 1), status
    assert pids_of(server) == old  # the same processes, on a new group


@pytest.mark.parametrize("how", ["stop button", "sidebar", "%dist interrupt"])
def test_every_way_of_stopping_a_hung_cell_frees_the_rank_that_did_not_stop(
    server: Server, pair: tuple[ServerKernel, ServerKernel], tmp_path: Path, how: str
) -> None:
    a, b = pair
    a.ok(f"%%distributed --session {SESSION}\nkept = 10 + dist.get_rank()")
    old = pids_of(server)
    mark = tmp_path / "rank1-finished"
    hung = later(a, hang(mark))
    wait_for(mark.exists)  # rank 1 finished; rank 0 waits in the barrier
    wait_for(lambda: running_sender(server) == "train.ipynb")
    time.sleep(0.5)
    if how == "stop button":
        code, _ = server.call("POST", f"/api/kernels/{a.id}/interrupt", {})
        assert code == 204
    elif how == "sidebar":
        code, _ = server.call("POST", f"{API}/sessions/{SESSION}/interrupt", {})
        assert code == 204
    else:
        b.ok(f"%dist interrupt --session {SESSION}")
    out, reply, _took = hung.result(timeout=180)
    assert reply["status"] == "error" and reply["ename"] == "CellInterrupted", out
    assert "interrupted on rank 0 in session" in out and "rank 1 had finished" in out, out
    assert "rank 0: in barrier" in out, out
    flat = " ".join(out.split())
    assert "Rank 0 was blocked in a collective the other ranks were not in" in flat, out
    assert "freed it" in flat and "Every rank kept its variables" in flat, out
    assert "(generation 1)" in flat and "replaced" not in flat, out
    assert out.count("blocked in a collective") == 1, out  # one message
    assert "variables are lost" not in out
    assert "still running" not in out and "stacks button" not in out and "deaf" not in out
    if how != "stop button":  # who interrupted is said, and not that it "was stopped"
        assert "was interrupted from" in out and "was stopped" not in out, out
    assert_every_rank_kept(server, old)
    after = a.ok(
        f"%%distributed --session {SESSION}\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "print('after', globals().get('kept'), dist.get_rank(), t.item())"
    )
    assert "[rank 0] after 10 0 2.0" in after and "[rank 1] after 11 1 2.0" in after, after


def test_a_cell_queued_behind_a_hung_one_waits_on_one_line_then_runs_on_the_new_group(
    server: Server, pair: tuple[ServerKernel, ServerKernel], tmp_path: Path
) -> None:
    a, b = pair
    mark = tmp_path / "rank1-finished"
    hung = later(a, hang(mark))
    wait_for(mark.exists)
    wait_for(lambda: running_sender(server) == "train.ipynb")
    shown: list[dict[str, Any]] = []

    def queued_cell() -> dict[str, Any]:
        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] in ("stream", "display_data", "update_display_data", "error"):
                shown.append(msg)

        code = (
            "%%distributed\nimport torch, torch.distributed as dist\n"
            "t = torch.ones(1); dist.all_reduce(t); print('b ran', dist.get_rank(), t.item())"
        )
        reply = b.kc.execute_interactive(code, output_hook=hook, timeout=180)
        return dict(reply["content"])

    queued = later_call(queued_cell)
    wait_for(lambda: len(status_of(server)["queue"]) == 1)

    def waiting_texts() -> set[str]:
        return {
            m["content"]["data"].get("text/plain", "")
            for m in list(shown)
            if m["msg_type"] in ("display_data", "update_display_data")
            and "running" in m["content"]["data"].get("text/plain", "")
        }

    wait_for(lambda: len(waiting_texts()) >= 2)  # B's line ticks: its time goes on
    code, _ = server.call("POST", f"/api/kernels/{a.id}/interrupt", {})
    assert code == 204
    _out, reply_a, _ = hung.result(timeout=180)
    assert reply_a["status"] == "error"
    reply = queued.result(timeout=180)
    assert reply["status"] == "ok", "\n".join(str(m["content"]) for m in shown)
    printed = "".join(m["content"]["text"] for m in shown if m["msg_type"] == "stream")
    assert "[rank 0] b ran 0 2.0" in printed and "[rank 1] b ran 1 2.0" in printed, printed
    assert "waiting" not in printed, printed  # the wait is not printed line after line
    lines = [m for m in shown if m["msg_type"] in ("display_data", "update_display_data")]
    waiting = [m for m in lines if "waiting" in m["content"]["data"].get("text/plain", "")]
    ids = {m["content"]["transient"]["display_id"] for m in waiting}
    assert len(ids) == 1, lines  # one line ...
    line = [m for m in lines if m["content"]["transient"].get("display_id") in ids]
    texts = [m["content"]["data"]["text/plain"] for m in line]
    assert line[0]["msg_type"] == "display_data"
    assert all(m["msg_type"] == "update_display_data" for m in line[1:])  # ... that updates
    # it says what it waits for: the other notebook's cell, in which rank 0 is freed
    assert texts[0].startswith("[jupyter_dist] waiting for a cell from train.ipynb (running")
    assert len({t for t in texts if "running" in t}) >= 2, texts  # its time goes on
    assert texts[-1] == "", texts  # taken away when the turn came


def later_call(fn: Any) -> Any:
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future
