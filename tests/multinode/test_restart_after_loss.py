"""A restart that failed while a node was out of reach is not the end of the session:
once the node answers again, the next ``%dist restart`` starts its agent afresh. The
failed restart, and the cells refused after it, say what must happen first."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jupyter_dist.errors import AgentError, SessionError
from jupyter_dist.settings import NODE_DEADLINE_VAR
from tests.conftest import CellOutput, session_status

from .test_link_faults import set_link
from .test_ssh_sessions import flags

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]
NAME = "again"


@pytest.fixture
def restarting(run: Run, cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # a node silent for 10 s is lost (20 s by default): the same path, sooner
    monkeypatch.setenv(NODE_DEADLINE_VAR, "10")
    yield NAME
    set_link(cluster, 1, "up")
    run(f"%dist shutdown --session {NAME}")


def words(text: object) -> str:
    return " ".join(str(text).split())


def test_a_restart_after_one_failed_in_a_link_loss_starts_the_node_afresh(
    run: Run, cluster: Any, restarting: str
) -> None:
    start = f"%%distributed --session {NAME} {flags(cluster)} --procs 1\nkept = 1"
    assert run(start).ok
    set_link(cluster, 1, "down")
    try:
        deadline = time.monotonic() + 60
        while session_status(NAME)["state"] != "degraded":
            assert time.monotonic() < deadline, session_status(NAME)
            time.sleep(0.1)
        # node 1 is lost: the restart starts its agent afresh, and cannot reach it
        failed = run(f"%dist restart --session {NAME}")
        assert isinstance(failed.error, AgentError), failed.stdout + failed.stderr
        said = words(failed.error)
        assert said.startswith("node 'node1': no SSH answer within"), said
        advice = "A restart cannot work until node 'node1' (no SSH answer within "
        assert advice in said, said
        then = (
            f"can be started again: then `%dist restart --session {NAME}` starts the "
            f"session's agents afresh, and every rank; `%dist shutdown --session {NAME}` "
            "ends the session."
        )
        assert said.endswith(then), said
        # every rank was stopped: a cell is told to restart, not to heal
        refused = run(f"%%distributed --session {NAME}\nprint(1)")
        assert isinstance(refused.error, SessionError), refused.stdout
        told = words(refused.error)
        assert "every rank was stopped" in told and advice in told and then in told, told
        assert "%dist heal" not in told, told
    finally:
        set_link(cluster, 1, "up")
    # the node answers again: the restart starts its agent afresh, and the ranks work
    again = run(f"%dist restart --session {NAME}")
    assert again.ok, f"{again.error}\n{again.stdout}{again.stderr}"
    out = run(
        f"%%distributed --session {NAME}\nimport torch, torch.distributed as dist\n"
        "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
        "print('sum', t.item(), 'kept', 'kept' in globals())"
    )
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] sum 3.0 kept False" in out.stdout or (
        "[rank 0] sum 3.0 kept False" in out.stdout and "[rank 1] sum 3.0 kept False" in out.stdout
    ), out.stdout
    status = session_status(NAME)
    assert status["state"] == "ready" and not any(n["lost"] for n in status["nodes"]), status
