"""What ``%dist interrupt`` says in its own cell, from the session's status before it."""

from __future__ import annotations

from typing import Any

from jupyter_dist.notebook.magics import interrupt_words


def status(states: list[str], running: dict[str, Any] | None = None) -> Any:
    ranks = [{"rank": r, "state": s} for r, s in enumerate(states)]
    return {"name": "s", "ranks": ranks, "running": running}


CELL = {"kind": "cell", "ranks": [], "path": "train.ipynb", "kernel_id": "k"}


def test_busy_ranks_and_whose_cell_they_ran() -> None:
    said = interrupt_words("s", status(["busy", "busy", "idle"], CELL), None)
    assert said.startswith("interrupted ranks 0-1 of session 's', running a cell from train.ipynb")


def test_only_the_chosen_ranks_are_named() -> None:
    assert interrupt_words("s", status(["busy", "busy"]), [1]).startswith("interrupted rank 1 ")


def test_a_turn_granted_but_not_yet_on_the_ranks_is_interrupted_too() -> None:
    said = interrupt_words("s", status(["idle", "idle"], CELL), None)
    assert said.startswith("interrupted ranks 0-1 of session 's', running a cell from train")


def test_nothing_running_is_said() -> None:
    said = interrupt_words("s", status(["idle", "idle"]), None)
    assert said == "session 's': no rank was running code; nothing to interrupt"
    assert interrupt_words("s", None, None).endswith("nothing to interrupt")
