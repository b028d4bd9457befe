"""Faults of a node's agent with real agents and rank kernels on this machine: an agent
stopped (SIGSTOP) during a restart or while a cell runs, and nodes whose Python writes what
is not the agent protocol to stdout (a login banner, a 50 MB line, a ``ready`` with wrong
types, a banner in place of every line after ``ready``).

The nodes' Python is chosen with ``--python``, which local sessions honour as SSH ones do:
a wrapper script writes the noise, then runs the real interpreter."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from jupyter_dist.errors import AgentError, SessionError
from jupyter_dist.settings import NODE_DEADLINE_VAR
from tests.conftest import CellOutput, session_status

Run = Callable[[str], CellOutput]


def wrapper(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.slow
def test_a_restart_while_the_agent_is_stopped_ends_with_a_reason_then_works(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP the agent, restart: the restart ends (no "restarting" for ever) with the
    node named, within the heartbeat's deadline; after SIGCONT the session restarts."""
    monkeypatch.setenv(NODE_DEADLINE_VAR, "5")  # the heartbeat's deadline (20 s by default)
    assert run("%%distributed --procs 2 --session wedged\nkept = 1").ok
    before = session_status("wedged")
    agent = before["nodes"][0]["agent_pid"]
    ranks = [r["pid"] for r in before["ranks"]]
    os.kill(agent, signal.SIGSTOP)
    try:
        began = time.monotonic()
        out = run("%dist restart --session wedged")
        took = time.monotonic() - began
    finally:
        os.kill(agent, signal.SIGCONT)
    assert isinstance(out.error, AgentError | SessionError), out.stdout + out.stderr
    text = str(out.error)
    assert "unreachable since" in text and "its agent did not answer" in text, text
    assert took < 60, f"the restart took {took:.0f} s"
    status = session_status("wedged")
    assert status["state"] == "broken" and "unreachable since" in status["broken_reason"]
    assert run("%dist restart --session wedged").ok
    after = run("%%distributed --session wedged\nimport os; print('fresh', 'kept' in globals())")
    assert after.ok, after.stdout + after.stderr
    assert "[ranks 0-1] fresh False" in after.stdout
    assert not psutil.pid_exists(agent) or psutil.Process(agent).status() == "zombie"
    assert not any(psutil.pid_exists(pid) for pid in ranks), "the old ranks still run"
    assert run("%dist shutdown --session wedged").ok


@pytest.mark.slow
def test_a_banner_and_a_50_mb_line_before_the_agent_do_not_stop_the_session(
    run: Run, tmp_path: Path
) -> None:
    python = wrapper(
        tmp_path,
        "noisy-python",
        "#!/bin/sh\n"
        "echo 'Welcome to node0! Last login: yesterday'\n"
        "head -c 52428800 /dev/zero | tr '\\0' x; echo\n"
        f'exec {sys.executable} "$@"\n',
    )
    out = run(f"%%distributed --procs 1 --session noisy --python {python}\nprint('ran')")
    try:
        assert out.ok, out.stdout + out.stderr
        assert "ran" in out.stdout
    finally:
        run("%dist shutdown --session noisy")


@pytest.mark.slow
def test_a_ready_with_wrong_types_is_quoted_not_taken_for_an_exit(run: Run, tmp_path: Path) -> None:
    ready = {"event": "ready", "protocol": 6, "host": "node0", "pid": "not a pid"}
    python = wrapper(
        tmp_path,
        "broken-python",
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"print(json.dumps({json.dumps(ready)}), flush=True)\n"
        "sys.stdin.read()\n",
    )
    out = run(f"%%distributed --procs 1 --session broken --python {python}\nprint('ran')")
    assert isinstance(out.error, AgentError), out.stdout + out.stderr
    text = str(out.error)
    assert "sent a malformed 'ready' event (ValueError" in text, text
    assert '"pid": "not a pid"' in text and "exited" not in text, text
    assert "broken" not in run("%dist status").stdout  # nothing of it was kept


#: a node's Python whose agent, once ready, is answered for by something else: each line
#: the real agent writes after ``ready`` reaches the notebook side as a banner instead. The
#: agent keeps its pid (its parent is the notebook process, as the launcher checks); a
#: forked filter sits on its stdout.
GARBLED = """
import os, sys
read_fd, write_fd = os.pipe()
if os.fork() == 0:
    os.close(write_fd)
    os.close(0)
    lines = os.fdopen(read_fd, "rb")
    out = os.fdopen(1, "wb", buffering=0)
    out.write(lines.readline())  # the agent's ready
    for _ in lines:
        out.write(b"\\x1b[1mWelcome to node0!\\x1b[0m \\xff\\xfe\\n")
    os._exit(0)
os.close(read_fd)
os.dup2(write_fd, 1)
os.close(write_fd)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


@pytest.mark.slow
def test_a_node_that_answers_with_a_banner_after_ready_is_refused_naming_it(
    run: Run, tmp_path: Path
) -> None:
    python = wrapper(
        tmp_path, "garbled-python", f"#!{sys.executable}\n" + GARBLED.format(python=sys.executable)
    )
    began = time.monotonic()
    out = run(f"%%distributed --procs 1 --session garbled --python {python}\nprint('ran')")
    took = time.monotonic() - began
    assert isinstance(out.error, AgentError), out.stdout + out.stderr
    text = str(out.error)
    assert "after its agent was ready, it sent a line that is not a JSON message" in text, text
    assert "Welcome to node0!" in text and "exited" not in text, text
    assert took < 30, f"the refusal took {took:.0f} s"
    assert "garbled" not in run("%dist status").stdout  # nothing of it was kept


@pytest.mark.slow
def test_an_agent_stopped_mid_cell_fails_it_naming_the_node_and_the_advice_works(
    run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGSTOP the agent while a cell runs, past the heartbeat's deadline: the cell fails
    naming the node (it does not wait for the ranks, which run on); after SIGCONT the next
    cell says what to run, and that works."""
    monkeypatch.setenv(NODE_DEADLINE_VAR, "5")  # the heartbeat's deadline (20 s by default)
    assert run("%%distributed --procs 2 --session frozen\nimport os, time").ok
    agent = session_status("frozen")["nodes"][0]["agent_pid"]
    mark = tmp_path / "running"

    def stop_when_running() -> None:
        deadline = time.monotonic() + 120
        while not all(Path(f"{mark}-{r}").exists() for r in (0, 1)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        os.kill(agent, signal.SIGSTOP)

    stopper = threading.Thread(target=stop_when_running, daemon=True)
    stopper.start()
    try:
        out = run(
            "%%distributed --session frozen\n"
            f"open({str(mark)!r} + '-' + os.environ['RANK'], 'w').close()\n"
            "time.sleep(600)"
        )
    finally:
        stopper.join()
        os.kill(agent, signal.SIGCONT)
    text = out.stdout + out.stderr + str(out.error)
    assert not out.ok and "unreachable since" in text, text
    assert "its agent did not answer" in text, text
    after = run("%%distributed --session frozen\nprint('after')")
    assert not after.ok, after.stdout
    advice = str(after.error)
    assert "No rank is left. `%dist heal --session frozen` starts the node again" in advice
    assert "`%dist restart --session frozen` starts every rank afresh" in advice, advice
    healed = run("%dist heal --session frozen")
    assert healed.ok, healed.stdout + healed.stderr
    fresh = run("%%distributed --session frozen\nprint('fresh', 'time' in globals())")
    assert fresh.ok and "[ranks 0-1] fresh False" in fresh.stdout, fresh.stdout + fresh.stderr
    assert not psutil.pid_exists(agent) or psutil.Process(agent).status() == "zombie"
    assert run("%dist shutdown --session frozen").ok
