"""One rank fails while the others wait for it: the cell ends, and says what became of them.

The classic distributed-notebook hang: rank 1 raises before a collective, ranks 0 and 2
enter `all_reduce` and wait for it forever (gloo's default timeout is 30 minutes). The
others get `JUPYTER_DIST_ABORT_AFTER_S` seconds and are interrupted; ranks that do not take
the interrupt within `JUPYTER_DIST_INTERRUPT_ACK_S` (deaf: the wait is in C++) are freed by
shutting their process group's connections, with a note saying so, and every rank joins a
new group keeping its variables. Ranks that are in Python code take the interrupt and the
session keeps its state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

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


def test_ranks_blocked_on_a_failed_rank_are_freed_and_every_rank_keeps_its_state(
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
    # the root cause comes first; the blocked ranks are named too
    assert err.groups[0].first.rank == 1
    assert "ValueError: bad batch on rank 1" in str(err)
    others = sorted(f.rank for f in err.failures if f.rank != 1)
    assert others == [0, 2], err.failures
    assert not [f for f in err.failures if f.kind == "stuck"], err.failures
    text = out.stdout + out.stderr
    assert "interrupting ranks 0,2, still running 1 s later" in text
    # the note: the blocked ranks were freed from the all_reduce, none was replaced
    note = " ".join(err.note.split())
    assert note.startswith("Ranks 0,2 were blocked in a collective the other ranks were not in"), (
        note
    )
    assert "freed them" in note and "Every rank kept its variables" in note, note
    assert "(generation 1)" in note and "replaced" not in note, note
    # far below gloo's own 30-minute timeout; generous for a loaded machine
    assert took < 120, took

    status = session_status(three_ranks)
    assert (status["state"], status["generation"]) == ("ready", 1)
    assert [r["pid"] for r in status["ranks"]] == old_pids  # the same processes
    after = run(
        f"%%distributed --session {three_ranks}\nimport torch, torch.distributed as dist\n"
        "print('kept', globals().get('kept'))\n"
        "t = torch.ones(1); dist.all_reduce(t); print(t.item())"
    )
    assert after.ok, after.stdout + after.stderr
    for rank in range(3):
        assert f"[rank {rank}] kept {10 + rank}" in after.stdout, after.stdout
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
