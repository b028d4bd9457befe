"""Distributed state that frameworks cache beside torch's process group, put back to what a
fresh launch has when the group it described is gone.

accelerate keeps process-wide singletons: ``PartialState`` (the distributed environment:
backend, world size, rank, device), ``AcceleratorState`` (one run's choices: mixed
precision, plugins, on top of ``PartialState``) and ``GradientState``. Its
``end_training()`` (and transformers' ``Trainer.end()``, which calls it) destroys the
process group and leaves them set, so the next run's ``Accelerator(...)`` meets a state
that says MULTI_CPU with no group under it, and cannot take other arguments
("AcceleratorState has already been initialized and cannot be changed"). A fresh launch
has none of it. `reset`, run by `rank.group_renewal` before the group is made again:

* clears ``AcceleratorState`` and ``GradientState``, so the next run's ``Accelerator`` is
  built from its own arguments. accelerate offers no public way to do this; its private
  ``_reset_state`` is what accelerate's own tests and transformers' ``TrainingArguments``
  call, so it is called when it is there, and a notice says so when it is not;
* keeps ``PartialState`` when it describes the group about to be made (the same world
  size and rank: what a fresh ``PartialState()`` would find), so that objects holding it
  (transformers' ``TrainingArguments.distributed_state``) still work; else it is cleared.

Nothing is imported: a framework the cells never imported has nothing cached.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _reset(holder: Any, name: str, *args: Any) -> str | None:
    """Call ``holder._reset_state(*args)``; what went wrong, or None."""
    reset = getattr(holder, "_reset_state", None)
    if not callable(reset):
        return f"accelerate's {name} has no _reset_state"
    try:
        reset(*args)
    except Exception as err:
        return f"accelerate's {name}._reset_state failed ({type(err).__name__}: {err})"
    return None


def _describes_this_rank(shared: Any) -> bool:
    """Does accelerate's ``PartialState`` describe this rank of the session's world?"""
    try:
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    except (KeyError, ValueError):
        return False
    return bool(shared) and (shared.get("num_processes"), shared.get("process_index")) == (
        world,
        rank,
    )


def reset() -> list[str]:
    """Reset what the module says; one line for each framework whose state was reset, or
    could not be."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return []
    accelerator_state = getattr(state, "AcceleratorState", None)
    partial_state = getattr(state, "PartialState", None)
    gradient_state = getattr(state, "GradientState", None)
    shared = getattr(partial_state, "_shared_state", None)
    had_run = bool(getattr(accelerator_state, "_shared_state", None))
    problems = [
        why
        for why in (
            _reset(accelerator_state, "AcceleratorState", False),
            _reset(gradient_state, "GradientState"),
            None if _describes_this_rank(shared) else _reset(partial_state, "PartialState"),
        )
        if why
    ]
    if problems:
        return [
            "could not reset accelerate's state ("
            + "; ".join(problems)
            + "): restart the session (%dist restart) if Accelerator() refuses this run's "
            "arguments"
        ]
    return ["accelerate's AcceleratorState starts afresh"] if had_run else []
