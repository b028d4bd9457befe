"""Two notebooks on one server-owned session, driven through a real Jupyter server: each
waits its turn where it can see whose cell runs, stops only its own cell, hears what the
other did to the session, and never gets the other's output."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .server_process import API, Server, serving_text_output
from .test_server_kernels import ServerKernel

pytestmark = pytest.mark.slow
SESSION = "shared"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving_text_output(tmp_path_factory.mktemp("shared-sessions")) as running:
        yield running


@pytest.fixture
def pair(server: Server, kernel_name: str) -> Iterator[tuple[ServerKernel, ServerKernel]]:
    """Notebook A starts the session, notebook B attaches to it."""
    a = ServerKernel(server, "train.ipynb", kernel_name)
    b = ServerKernel(server, "eval.ipynb", kernel_name)
    try:
        a.ok("%load_ext jupyter_dist")
        b.ok("%load_ext jupyter_dist")
        a.ok(f"%%distributed --procs 2 --session {SESSION}\nimport time, threading")
        b.ok(f"%dist attach {SESSION}")
        yield a, b
    finally:
        _status, _ = server.call("DELETE", f"{API}/sessions/{SESSION}")
        for kernel in (a, b):
            with contextlib.suppress(Exception):
                kernel.close()


def later(kernel: ServerKernel, code: str, timeout: float = 120) -> concurrent.futures.Future[Any]:
    """Run a cell in the background: (output, reply, seconds it took)."""

    def run() -> tuple[str, dict[str, Any], float]:
        began = time.monotonic()
        out, reply = kernel.run(code, timeout)
        return out, reply, time.monotonic() - began

    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


def later_seen(
    kernel: ServerKernel, code: str, timeout: float = 120
) -> tuple[concurrent.futures.Future[Any], list[str]]:
    """`later`, and a list that gets each text the cell shows (its streams, and its
    displays and their updates) as it comes."""
    seen: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            seen.append(content["text"])
        elif kind == "error":
            seen.append("\n".join(content["traceback"]))
        elif kind in ("execute_result", "display_data", "update_display_data"):
            seen.append(content["data"].get("text/plain", "") + "\n")

    def run() -> tuple[str, dict[str, Any], float]:
        began = time.monotonic()
        reply = kernel.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return (
            re.sub(r"\x1b\[[0-9;]*m", "", "".join(seen)),
            reply["content"],
            time.monotonic() - began,
        )

    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future, seen


def session_status(server: Server) -> dict[str, Any]:
    status, found = server.call("GET", f"{API}/sessions/{SESSION}")
    assert status == 200, found
    return dict(found)


def wait_for(predicate: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def waits_for(path: str, indent: str = "") -> str:
    """Cell lines that wait (up to two minutes) until the file ``path`` (a Python
    expression) exists: the test or another cell creates it."""
    lines = (
        "import os as _os, time as _time",
        "_until = _time.monotonic() + 120",
        f"while not _os.path.exists({path}):",
        f"    assert _time.monotonic() < _until, 'nobody created ' + {path}",
        "    _time.sleep(0.05)",
    )
    return "".join(f"{indent}{line}\n" for line in lines)


@contextlib.contextmanager
def released(go: Path) -> Iterator[Path]:
    """``go``, created on leaving, whatever happened: no cell waits on it after the test."""
    try:
        yield go
    finally:
        go.touch()


def running_sender(server: Server) -> str:
    running = session_status(server)["running"]
    return "" if running is None else str(running["path"])


def done_in(out: str) -> float:
    found = re.findall(r"done in ([0-9.]+) ?(ms|s)", out)
    assert found, out
    value, unit = found[-1]
    return float(value) / (1000 if unit == "ms" else 1)


#: B's --timeout in the queue test; A's cell holds B in the queue for longer than that
B_TIMEOUT_S = 5


def test_a_queued_cell_waits_visibly_and_its_time_excludes_the_wait(
    server: Server, pair: tuple[ServerKernel, ServerKernel], tmp_path: Path
) -> None:
    a, b = pair
    # B waits for A's cell, which runs until the test lets it end, longer than B's own
    # limit; that limit counts from B's start (a loaded machine may take seconds to run
    # even a print), not from the wait's
    with released(tmp_path / "go") as go:
        long = later(
            a, f"%%distributed --session {SESSION}\n{waits_for(repr(str(go)))}print('a done')"
        )
        wait_for(lambda: running_sender(server) == "train.ipynb")
        status = session_status(server)
        assert {n["path"] for n in status["notebooks"]} == {"train.ipynb", "eval.ipynb"}
        assert all(r["busy_since"] for r in status["ranks"])
        out = b.ok("%dist status")  # answered while A's cell runs
        assert "train.ipynb" in out and "eval.ipynb" in out, out
        queued = later(b, f"%%distributed --timeout {B_TIMEOUT_S}\nprint('b done')")
        wait_for(lambda: len(session_status(server)["queue"]) == 1)
        time.sleep(B_TIMEOUT_S + 1)  # B's limit would have passed, had it counted the wait
        assert not queued.done()
    out, reply, _took = queued.result()
    assert reply["status"] == "ok", out  # --timeout counts from its own start
    assert "waiting for a cell from train.ipynb (running" in out, out
    assert "[ranks 0-1] b done" in out, out
    out_a, reply_a, _ = long.result()
    assert reply_a["status"] == "ok" and "[ranks 0-1] a done" in out_a, out_a
    assert "b done" not in out_a and "a done" not in out
    assert session_status(server)["cells_run"] >= 3


def test_stopping_a_queued_cell_withdraws_it_and_leaves_the_running_one(
    server: Server, pair: tuple[ServerKernel, ServerKernel], tmp_path: Path
) -> None:
    a, b = pair
    with released(tmp_path / "go") as go:
        long = later(
            a, f"%%distributed --session {SESSION}\n{waits_for(repr(str(go)))}print('a done')"
        )
        wait_for(lambda: running_sender(server) == "train.ipynb")
        queued = later(b, "%%distributed\nprint('never')")
        wait_for(lambda: len(session_status(server)["queue"]) == 1)
        status, _ = server.call("POST", f"/api/kernels/{b.id}/interrupt", {})
        assert status == 204
        out, reply, _ = queued.result()
        assert reply["status"] == "error" and "withdrawn before it started" in out, out
        assert "never" not in out
        assert not long.done()  # A's cell still runs
    out_a, reply_a, _ = long.result()
    assert reply_a["status"] == "ok" and "[ranks 0-1] a done" in out_a, out_a
    assert "interrupt" not in out_a


def test_an_error_in_one_notebook_leaves_the_others_queued_cell(
    server: Server, pair: tuple[ServerKernel, ServerKernel]
) -> None:
    a, b = pair
    failing = later(a, f"%%distributed --session {SESSION}\ntime.sleep(3)\nraise ValueError('a')")
    wait_for(lambda: running_sender(server) == "train.ipynb")
    out, reply, _ = later(b, "%%distributed\nprint('b ran')").result()
    assert reply["status"] == "ok" and "[ranks 0-1] b ran" in out, out
    out_a, reply_a, _ = failing.result()
    assert reply_a["status"] == "error" and "ValueError: a" in out_a, out_a
    assert "ValueError" not in out
    assert session_status(server)["ranks"][0]["last_error"] == ""  # b's cell passed since


def test_an_interrupt_from_one_notebook_tells_the_other_who(
    server: Server, pair: tuple[ServerKernel, ServerKernel]
) -> None:
    a, b = pair
    long = later(a, f"%%distributed --session {SESSION}\ntime.sleep(60)")
    wait_for(lambda: running_sender(server) == "train.ipynb")
    said = b.ok("%dist interrupt")  # the interrupting cell says what it stopped
    assert "interrupted ranks 0-1 of session 'shared', running a cell from train.ipynb" in said, (
        said
    )
    out, reply, took = long.result()
    assert reply["status"] == "error", out
    assert "session 'shared' was interrupted from eval.ipynb" in out, out
    assert took < 50
    said = b.ok("%dist interrupt")  # nothing runs now: said so
    assert "session 'shared': no rank was running code; nothing to interrupt" in said, said


def test_a_restart_from_one_notebook_is_news_in_the_other(
    server: Server, pair: tuple[ServerKernel, ServerKernel]
) -> None:
    a, b = pair
    a.ok(f"%%distributed --session {SESSION}\nkept = 1")
    b.ok(f"%dist restart --session {SESSION}")
    out, _reply = a.run(f"%%distributed --session {SESSION}\nprint('kept' in dir())")
    assert "session 'shared' was restarted from eval.ipynb; its variables are gone" in out, out
    assert "[ranks 0-1] False" in out, out


def test_a_session_shut_down_elsewhere_is_not_quietly_started_again(
    server: Server, pair: tuple[ServerKernel, ServerKernel]
) -> None:
    a, b = pair
    b.ok(f"%dist shutdown --session {SESSION}")
    out, reply = a.run(f"%%distributed --procs 2 --session {SESSION}\nprint('x')")
    assert reply["status"] == "error", out
    assert "session 'shared' was shut down from eval.ipynb" in out, out
    assert "Run the cell again to start a new session 'shared'" in out, out
    out = a.ok(f"%%distributed --procs 2 --session {SESSION}\nprint('fresh')")
    assert "[ranks 0-1] fresh" in out, out


def test_a_killed_notebook_frees_the_ranks_for_the_other(
    server: Server, pair: tuple[ServerKernel, ServerKernel]
) -> None:
    a, b = pair
    a_pid = a.pid()
    a.kc.execute(f"%%distributed --session {SESSION}\ntime.sleep(120)")
    wait_for(lambda: running_sender(server) == "train.ipynb")
    queued = later(b, "%%distributed\nprint('b ran')")
    wait_for(lambda: len(session_status(server)["queue"]) == 1)
    os.kill(a_pid, signal.SIGKILL)
    out, reply, took = queued.result()
    assert reply["status"] == "ok" and "[ranks 0-1] b ran" in out, out
    assert took < 100  # not the 120 s of the killed notebook's cell
    assert a.id not in [n["kernel_id"] for n in session_status(server)["notebooks"]]


def test_a_thread_of_one_notebook_prints_to_that_notebook_only(
    server: Server, pair: tuple[ServerKernel, ServerKernel], tmp_path: Path
) -> None:
    a, b = pair
    # the thread A's cell leaves prints while B's cell runs: B's cell lets it (the file
    # ``go``), and ends once it printed (the file ``said-<rank>``)
    go = repr(str(tmp_path / "go"))
    said = f"{str(tmp_path / 'said-')!r} + _os.environ['RANK']"
    a.ok(
        f"%%distributed --session {SESSION}\n"
        "def chatter():\n"
        f"{waits_for(go, indent='    ')}"
        "    print('from a thread of a', flush=True)\n"
        f"    open({said}, 'w').close()\n"
        "threading.Thread(target=chatter).start()"
    )
    out = b.ok(f"%%distributed\nopen({go}, 'w').close()\n{waits_for(said)}print('b cell')")
    assert "from a thread of a" not in out, out
    out = a.ok(f"%%distributed --session {SESSION}\nprint('a again')")
    assert "printed after its cell ended" in out and "from a thread of a" in out, out


def test_a_stopped_notebook_does_not_stall_the_others_output(
    server: Server, pair: tuple[ServerKernel, ServerKernel]
) -> None:
    a, b = pair
    b_pid = b.pid()
    os.kill(b_pid, signal.SIGSTOP)
    try:
        out, reply, _ = later(
            a,
            f"%%distributed --session {SESSION}\n"
            "for i in range(5000):\n    print('line', i, flush=True)\nprint('flood over')",
            timeout=150,
        ).result()
    finally:
        os.kill(b_pid, signal.SIGCONT)
    assert reply["status"] == "ok", out[-2000:]
    assert "flood over" in out, out[-2000:]
    out = b.ok("%%distributed\nprint('b still works')")
    assert "[ranks 0-1] b still works" in out, out


def test_attaching_while_another_notebooks_cell_runs_answers_at_once(
    server: Server, pair: tuple[ServerKernel, ServerKernel], kernel_name: str, tmp_path: Path
) -> None:
    a, _b = pair
    with released(tmp_path / "go") as go:  # A's cell runs until the attach is done
        long = later(
            a, f"%%distributed --session {SESSION}\n{waits_for(repr(str(go)))}print('a done')"
        )
        wait_for(lambda: running_sender(server) == "train.ipynb")
        third = ServerKernel(server, "third.ipynb", kernel_name)
        try:
            third.ok("%load_ext jupyter_dist")
            out = third.ok(f"%dist attach {SESSION}")
            assert "attached to session 'shared'" in out, out
            assert not long.done()  # it did not wait for the running cell
        finally:
            third.close()
    assert "a done" in long.result()[0]


def test_a_pull_waits_for_the_running_cell_and_says_so(
    server: Server, pair: tuple[ServerKernel, ServerKernel], tmp_path: Path
) -> None:
    a, b = pair
    a.ok(f"%%distributed --session {SESSION}\nvalue = 5")
    with released(tmp_path / "go") as go:  # A's cell ends once B's pull waits behind it
        long = later(a, f"%%distributed --session {SESSION}\n{waits_for(repr(str(go)))}value = 6")
        wait_for(lambda: running_sender(server) == "train.ipynb")
        pull, seen = later_seen(b, "values = %dist pull value\nprint(values)")
        wait_for(lambda: "waiting for a cell from train.ipynb" in "".join(seen))
        assert not pull.done()
    out, reply, _ = pull.result()
    assert reply["status"] == "ok", out
    assert "waiting for a cell from train.ipynb" in out, out
    assert "[6, 6]" in out, out  # after the running cell, not in the middle of it
    assert long.result()[1]["status"] == "ok"
