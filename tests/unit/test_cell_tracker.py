"""How `CellTracker` follows one cell's messages from each rank, and what it says of a rank
that never finished."""

from __future__ import annotations

import queue
from typing import Any

import pytest

from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE
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


def test_a_reply_on_iopub_ends_the_rank_behind_its_output() -> None:
    """The notebook side's cells are answered on IOPub, behind their output
    (`rank.iopub_reply`): that one message ends the rank, with or without a busy status
    before it, and an error in it is the rank's failure."""
    from jupyter_dist.common.events import StreamOut

    sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
    run = CellTracker({0: ("h", 0), 1: ("h", 1)}, sink)
    run.on_message(0, "iopub", {"msg_type": "stream", "content": {"text": "hi"}})
    run.on_message(0, "iopub", {"msg_type": EXECUTE_REPLY_MSG_TYPE, "content": {"status": "ok"}})
    assert run.busy_ranks == [1]
    run.on_message(1, "iopub", status("busy"))
    error = {"status": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["tb"]}
    run.on_message(1, "iopub", {"msg_type": EXECUTE_REPLY_MSG_TYPE, "content": error})
    assert run.done.is_set()
    (failure,) = run.result().failures
    assert (failure.rank, failure.ename, failure.evalue) == (1, "ValueError", "bad")
    events = []
    while not sink.empty():
        events.append(sink.get())
    assert isinstance(events[0], StreamOut) and events[0].text == "hi"


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


def test_ranks_whose_answers_were_lost_end_as_their_reply_says_or_are_given_up() -> None:
    run = run_of(0, 1, 2, 3)
    run.on_message(0, "iopub", status("busy"))
    run.on_message(0, "shell", reply())  # its idle status was lost
    run.on_message(1, "iopub", status("busy"))  # still running: its reply is lost
    run.on_message(2, "shell", reply("error"))
    run.on_message(3, "shell", reply())
    run.on_message(3, "iopub", status("idle"))  # done before
    assert run.answers_lost([0, 1, 2, 3], "the relay stopped") == [1]
    assert run.busy_ranks == [] and run.done.is_set()
    failures = {f.rank: f for f in run.result().failures}
    assert set(failures) == {1, 2}
    assert failures[1].kind == "stuck" and failures[1].ename == "AnswerLost"
    assert failures[1].evalue == "the relay stopped"
    assert failures[2].kind == "error"  # its reply still decides how it ended


def test_a_rank_given_up_with_its_relay_that_then_dies_starts_the_others_wind_down() -> None:
    """A node that dies often loses its relay first (the rank is given up on, as
    ``AnswerLost``) and is declared lost a moment later: the death must then count, or
    the ranks on other nodes would wait in their collective for good."""
    run = run_of(0, 1)
    run.on_message(0, "iopub", status("busy"))
    run.on_message(1, "iopub", status("busy"))
    assert run.answers_lost([0], "the relay stopped") == [0]
    assert run.root_failure() is None and not run.first_failure_at  # nothing died yet
    run.rank_died(0, None, 42, "", lost="node 'n0' unreachable since 12:00:00")
    root = run.root_failure()
    assert root is not None and (root.rank, root.ename) == (0, "NodeLost")
    assert run.first_failure_at  # rank 1 gets its seconds, then is interrupted
    assert not run.done.is_set()
    # a rank that finished on its own is not made a death afterwards
    run.on_message(1, "shell", reply())
    run.on_message(1, "iopub", status("idle"))
    run.rank_died(1, -9, 43, "")
    assert {f.rank for f in run.result().failures} == {0}
