"""The notebook side's queue of ranks' input requests: which prompt opens when, and what
it says (the prompts themselves go through a real kernel: tests/integration)."""

from __future__ import annotations

from jupyter_dist.common.events import CellEvent, InputAsked, InputEnded, RankFinished
from jupyter_dist.notebook import input_desk
from jupyter_dist.notebook.input_desk import InputDesk, prompt_text


def test_prompts_say_the_rank_and_how_many_wait() -> None:
    assert prompt_text(1, "val?", 0) == "[rank 1] val?"
    assert prompt_text(0, "(Pdb) ", 2) == "[rank 0; 2 more waiting] (Pdb) "


def test_first_requests_wait_for_the_other_running_ranks_then_go_in_rank_order() -> None:
    shown: list[CellEvent] = []
    desk = InputDesk(None, [0, 1, 2], lambda rank, value: None, shown.append)
    desk.note(InputAsked(2, "val?"))
    assert not desk.ready()  # ranks 0 and 1 may be about to ask too
    desk.note(InputAsked(0, "val?"))
    assert not desk.ready()
    desk.note(RankFinished(1, "ok", 0.1))  # rank 1 will not ask: every running rank asked
    assert desk.ready()
    assert min(desk.pending) == 0


def test_a_lone_first_request_opens_after_the_gather_time() -> None:
    desk = InputDesk(None, [0, 1], lambda rank, value: None, lambda event: None)
    desk.note(InputAsked(1, "val?"))
    assert not desk.ready()
    desk._first_since = (desk._first_since or 0.0) - input_desk.GATHER_S
    assert desk.ready()


def test_a_request_of_a_rank_that_ended_is_withdrawn() -> None:
    shown: list[CellEvent] = []
    desk = InputDesk(None, [0, 1], lambda rank, value: None, shown.append)
    desk.note(InputAsked(1, "ipdb> "))
    desk.note(RankFinished(1, "died", 0.1))
    assert not desk.pending and not desk.ready()
    assert shown == [InputEnded(1, ())]
