"""One rank fails while the others wait for it: the cell ends, and says what became of them.

The classic distributed-notebook hang: rank 1 raises before a collective, ranks 0 and 2
enter `all_reduce` and wait for it forever (gloo's default timeout is 30 minutes). The
others get `JUPYTER_DIST_ABORT_AFTER_S` seconds and are interrupted; ranks that do not take
the interrupt within `JUPYTER_DIST_INTERRUPT_ACK_S` (deaf: the wait is in C++) are replaced
by fresh ones, with a note saying which; the rank that failed keeps its variables. Ranks
that are in Python code take the interrupt and the session keeps its state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from jupyter_dist.errors import RanksFailed, SpecError
from jupyter_dist.settings import ABORT_AFTER_VAR, INTERRUPT_ACK_VAR, seconds_from_env
from tests.conftest import CellOutput, session_status

Run = Callable[[str], CellOutput]
pytestmark = pytest.mark.slow


@pytest.fixture
def three_ranks(run: Run, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv(ABORT_AFTER_VAR, "1")
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "3")  # read when the session starts (10 s by default)
    out = run(
        "%%distributed --session wind --procs 3\n"
        "import time, torch, torch.distributed as dist\nkept = 'still here'"
    )
    assert out.ok, out.stdout + out.stderr
    yield "wind"
    run("%dist shutdown --session wind")


def test_ranks_blocked_on_a_failed_rank_are_given_up_and_replaced_alone(
    run: Run, three_ranks: str
) -> None:
    assert run(f"%%distributed --session {three_ranks}\nkept = 10 + dist.get_rank()").ok
    old_pids = [r["pid"] for r in session_status(three_ranks)["ranks"]]
    began = time.monotonic()
    out = run(
        f"%%distributed --session {three_ranks}\n"
        "if dist.get_rank() == 1:\n"
        "    raise ValueError('bad batch on rank 1')\n"
        "dist.all_reduce(torch.ones(1))  # ranks 0 and 2 wait for rank 1 forever\n"
    )
    took = time.monotonic() - began
    assert isinstance(out.error, RanksFailed), out.stdout + out.stderr
    err = out.error
    # the root cause comes first; the blocked ranks are named with where they were
    assert err.groups[0].first.rank == 1
    assert "ValueError: bad batch on rank 1" in str(err)
    stuck = [f for f in err.failures if f.kind == "stuck"]
    assert sorted(f.rank for f in stuck) == [0, 2]
    assert all("did not take the interrupt within 3 s" in f.evalue for f in stuck), stuck
    assert any("all_reduce" in f.evalue for f in stuck), stuck[0].evalue
    text = out.stdout + out.stderr
    assert "interrupting ranks 0,2, still running 1 s later" in text
    # the note says which ranks were replaced and that only they start empty
    note = " ".join(err.note.split())
    assert note.startswith("ranks 0,2 could not be stopped (blocked in C code"), note
    assert "ranks 0,2 replaced by fresh rank kernels" in note, note
    assert "They start empty; every other rank kept its variables" in note, note
    assert "(generation 1)" in note, note
    # far below gloo's own 30-minute timeout; generous for a loaded machine
    assert took < 120, took

    status = session_status(three_ranks)
    assert (status["state"], status["generation"]) == ("ready", 1)
    new_pids = [r["pid"] for r in status["ranks"]]
    assert new_pids[1] == old_pids[1]  # the rank that raised is the same process
    assert {new_pids[0], new_pids[2]}.isdisjoint(old_pids)
    _gone, alive = psutil.wait_procs(
        [psutil.Process(p) for p in (old_pids[0], old_pids[2]) if psutil.pid_exists(p)], 10
    )
    assert not alive
    after = run(
        f"%%distributed --session {three_ranks}\nimport torch, torch.distributed as dist\n"
        "print(globals().get('kept'))\nt = torch.ones(1); dist.all_reduce(t); print(t.item())"
    )
    assert after.ok, after.stdout + after.stderr
    assert "[ranks 0,2] None" in after.stdout, after.stdout  # fresh
    assert "[rank 1] 11" in after.stdout, after.stdout
    assert "[ranks 0-2] 3.0" in after.stdout


def test_ranks_in_python_code_are_interrupted_and_the_session_keeps_its_state(
    run: Run, three_ranks: str
) -> None:
    pids = [r["pid"] for r in session_status(three_ranks)["ranks"]]
    out = run(
        f"%%distributed --session {three_ranks}\n"
        "if dist.get_rank() == 1:\n"
        "    raise KeyError('missing on rank 1')\n"
        "time.sleep(600)\n"
    )
    assert isinstance(out.error, RanksFailed)
    assert err_kinds(out.error) == {0: "interrupted", 1: "error", 2: "interrupted"}
    assert "root cause on rank 1" in str(out.error)
    assert out.error.note == ""
    assert [r["pid"] for r in session_status(three_ranks)["ranks"]] == pids
    again = run(f"%%distributed --session {three_ranks}\nprint(kept)")
    assert "[ranks 0-2] still here" in again.stdout


def err_kinds(err: RanksFailed) -> dict[int, str]:
    return {f.rank: f.kind for f in err.failures}


def test_the_grace_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ABORT_AFTER_VAR, "2.5")
    assert seconds_from_env(ABORT_AFTER_VAR, 3.0) == 2.5
    monkeypatch.delenv(ABORT_AFTER_VAR)
    assert seconds_from_env(ABORT_AFTER_VAR, 3.0) == 3.0
    for bad in ("soon", "0", "-4"):
        monkeypatch.setenv(ABORT_AFTER_VAR, bad)
        with pytest.raises(SpecError, match=f"{ABORT_AFTER_VAR}='{bad}': expected a positive"):
            seconds_from_env(ABORT_AFTER_VAR, 3.0)
