"""How `CellTracker` follows one cell's messages from each rank, and what it says of a rank
that never finished."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_dist.control.cell_tracker import CellTracker


def status(state: str) -> dict[str, Any]:
    return {"msg_type": "status", "content": {"execution_state": state}}


def reply(state: str = "ok") -> dict[str, Any]:
    return {"msg_type": "execute_reply", "content": {"status": state}}


def run_of(*ranks: int) -> CellTracker:
    return CellTracker({r: ("h", r) for r in ranks}, None)


def test_a_rank_is_done_on_its_reply_and_its_idle_status_in_either_order() -> None:
    run = run_of(0, 1)
    run.on_message(0, "iopub", status("busy"))
    run.on_message(0, "shell", reply())
    assert run.busy_ranks == [0, 1]
    run.on_message(0, "iopub", status("idle"))
    run.on_message(1, "iopub", status("busy"))
    run.on_message(1, "iopub", status("idle"))
    assert run.busy_ranks == [1]
    run.on_message(1, "shell", reply())
    assert run.busy_ranks == [] and run.done.is_set()
    assert run.result().failures == ()


@pytest.mark.parametrize(
    ("messages", "stage"),
    [
        ([], "its kernel never reported starting the cell"),
        ([("iopub", status("busy"))], ""),
        (
            [("iopub", status("busy")), ("shell", reply())],
            "its reply came back but not its idle status",
        ),
        ([("iopub", status("idle"))], "its idle status came back but not its reply"),
    ],
)
def test_the_stage_of_an_unfinished_rank(
    messages: list[tuple[str, dict[str, Any]]], stage: str
) -> None:
    run = run_of(0)
    for channel, msg in messages:
        run.on_message(0, channel, msg)
    assert run.stage(0) == stage


def test_giving_up_adds_each_ranks_own_detail() -> None:
    run = run_of(0, 1, 2)
    run.on_message(2, "iopub", status("busy"))
    run.on_message(2, "shell", reply())
    run.on_message(2, "iopub", status("idle"))
    given_up = run.give_up("timeout", "still running", details={0: "it was idle", 1: ""})
    assert given_up == [0, 1]
    evalues = {f.rank: f.evalue for f in run.result().failures}
    assert evalues == {0: "still running; it was idle", 1: "still running"}
    assert run.done.is_set()


def test_a_rank_whose_idle_status_was_lost_is_taken_as_done_once_its_reply_is_old() -> None:
    run = run_of(0, 1, 2)
    run.on_message(0, "iopub", status("busy"))
    run.on_message(0, "shell", reply())  # its idle status never comes
    run.on_message(1, "iopub", status("busy"))  # still running: no reply yet
    run.on_message(2, "shell", reply("error"))
    assert run.idle_lost(60.0) == []  # too recent
    assert run.idle_lost(0.0) == [0, 2]
    assert run.busy_ranks == [1]
    [failure] = run.result().failures
    assert failure.rank == 2  # its reply still decides how it ended
    assert run.idle_lost(0.0) == []
