"""A rank process that dies mid-cell is reported and never hangs; the next cell replaces
that rank alone (the others keep their variables), and a lost node waits for a heal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.errors import RanksFailed, SessionError
from tests.conftest import CellOutput, session_status

Run = Callable[[str], CellOutput]


@pytest.fixture
def crash_session(run: Run) -> Any:
    out = run("%%distributed --session crash --procs 2\nimport os, signal, time\nimport torch")
    assert out.ok, out.stdout
    yield "crash"
    run("%dist shutdown --session crash")


@pytest.mark.parametrize(
    ("kill", "expected"),
    [
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by signal SIGKILL (9)"),
        ("os._exit(3)", "exit code 3"),
        ("import ctypes; ctypes.string_at(0)", "killed by signal SIGSEGV (11)"),
    ],
)
def test_a_dead_rank_is_reported_and_the_next_cell_replaces_it_alone(
    run: Run, crash_session: str, kill: str, expected: str
) -> None:
    assert run(f"%%distributed --session {crash_session}\nkept = 100 + int(os.environ['RANK'])").ok
    pids = [r["pid"] for r in session_status(crash_session)["ranks"]]
    began = time.monotonic()
    out = run(
        f"%%distributed --session {crash_session}\n"
        f"if int(os.environ['RANK']) == 1:\n    {kill}\n"
        "time.sleep(1)\nprint('rank 0 carried on')"
    )
    assert time.monotonic() - began < 30
    assert isinstance(out.error, RanksFailed)
    root = out.error.groups[0].first
    assert (root.rank, root.kind) == (1, "died")
    assert expected in str(out.error)
    assert "[rank 0] rank 0 carried on" in out.stdout
    assert not psutil.pid_exists(pids[1]) or psutil.Process(pids[1]).status() == "zombie"
    status = session_status(crash_session)
    assert status["state"] == "degraded", status["state"]
    assert status["faults"] == [f"rank 1 died ({expected})"], status["faults"]

    # the next cell replaces rank 1 alone, says so, and runs on a new process group
    back = run(
        f"%%distributed --session {crash_session}\nimport torch, torch.distributed as dist\n"
        "import jupyter_dist\nt = torch.ones(1); dist.all_reduce(t)\n"
        "print(globals().get('kept'), t.item(), jupyter_dist.info().generation)"
    )
    assert back.ok, back.stdout + back.stderr
    said = " ".join((back.stdout + back.stderr).split())
    assert f"rank 1 replaced by a fresh rank kernel: rank 1 died ({expected})" in said, said
    assert "It starts empty; every other rank kept its variables" in said, said
    assert "All ranks joined a new process group (generation 1)" in said, said
    assert "[rank 0] 100 2.0 1" in back.stdout, back.stdout  # rank 0 kept its variable
    assert "[rank 1] None 2.0 1" in back.stdout, back.stdout  # rank 1 is fresh
    status = session_status(crash_session)
    assert (status["state"], status["generation"], status["faults"]) == ("ready", 1, [])
    new_pids = [r["pid"] for r in status["ranks"]]
    assert new_pids[0] == pids[0] and new_pids[1] not in pids


def test_segfault_shows_the_faulthandler_dump(run: Run, crash_session: str) -> None:
    out = run(
        f"%%distributed --session {crash_session} --ranks 0\n"
        "def deep_frame():\n    import ctypes\n    ctypes.string_at(0)\ndeep_frame()"
    )
    assert isinstance(out.error, RanksFailed)
    # the dump is shown once, with the rank's output; the cell's error names the death
    assert "Fatal Python error: Segmentation fault" in out.stderr
    assert "deep_frame" in out.stderr
    assert "Fatal Python error" not in out.stdout


def test_lost_agent_fails_the_cell_instead_of_hanging(run: Run, crash_session: str) -> None:
    status = session_status(crash_session)
    agent = status["nodes"][0]["agent_pid"]
    ranks = [r["pid"] for r in status["ranks"]]
    began = time.monotonic()
    out = run(
        f"%%distributed --session {crash_session}\n"
        f"if int(os.environ['RANK']) == 0:\n    os.kill({agent}, signal.SIGKILL)\n"
        "time.sleep(60)"
    )
    assert time.monotonic() - began < 30
    assert isinstance(out.error, RanksFailed)
    assert sorted(out.error.failed_ranks) == [0, 1]
    assert "the agent exited (killed by signal SIGKILL (9))" in out.stdout  # its agent, named
    deadline = time.monotonic() + 60  # an exit a busy machine may take seconds over
    while any(psutil.pid_exists(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in ranks)
    status = session_status(crash_session)
    assert status["state"] == "degraded" and status["nodes"][0]["lost"], status
    # a lost node is not started again behind the user's back: the next cell says how
    again = run(f"%%distributed --session {crash_session}\nprint('hi')")
    assert isinstance(again.error, SessionError), again.stdout + again.stderr
    text = str(again.error)
    assert f"session {crash_session!r} is degraded: rank 0 was lost (" in text, text
    assert f"`%dist heal --session {crash_session}` starts the node again" in text, text
    healed = run(f"%dist heal --session {crash_session}")
    assert healed.ok, healed.stdout + healed.stderr
    said = " ".join((healed.stdout + healed.stderr).split())
    assert "ranks 0-1 replaced by fresh rank kernels (node 0 started again)" in said, said
    back = run(
        f"%%distributed --session {crash_session}\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); print('back', t.item())"
    )
    assert back.ok and "[ranks 0-1] back 2.0" in back.stdout, back.stdout + back.stderr
    status = session_status(crash_session)
    assert (status["state"], status["generation"]) == ("ready", 1)
    assert status["nodes"][0]["agent_pid"] != agent


def test_a_rank_that_never_answers_shows_where_it_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank wedged while starting (here: in an IPython start-up file) fails the start
    with its stack and log, instead of a bare timeout."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-wedge.py").write_text(
        "import time\n\ndef wedged_start_up():\n    time.sleep(600)\n\nwedged_start_up()\n"
    )
    spec = resolve_shape("wedged", ShapeRequest(procs=1), 0, "localhost")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # the agent's, and so the rank's
    session = Session(spec, SessionTimeouts(start=8))

    async def start() -> None:
        try:
            await session.start()
        finally:
            await session.shutdown()

    with pytest.raises(SessionError) as caught:
        asyncio.run(start())
    text = str(caught.value)
    assert "rank 0: kernel did not answer within 8 s" in text
    assert "its stack:" in text and "in wedged_start_up" in text, text
