"""Distributed state that frameworks cache beside torch's process group, left consistent
with the group made again after a cell destroyed it (`rank.group_renewal`), and as a fresh
launch has it where a new run asks for something else.

accelerate keeps process-wide singletons: ``PartialState`` (the distributed environment:
backend, world size, rank, device), ``AcceleratorState`` (one run's choices: mixed
precision, plugins, over ``PartialState``'s) and ``GradientState``. Its
``end_training()`` (and transformers' ``Trainer.end()``, which calls it) destroys the
group and leaves them set. The group made again is the same world, so what they say stays
true, and objects made before (an ``Accelerator``, a ``Trainer`` and its
``TrainingArguments``, all reading the shared state) go on working. What a fresh launch
would do differently is take a new run's other arguments: ``Accelerator(mixed_precision=
"bf16")`` after a run without would be refused ("AcceleratorState has already been
initialized and cannot be changed"). So `reset`:

* keeps ``PartialState`` while it describes this rank of the session (else clears
  accelerate's state whole, as a fresh launch has none);
* wraps ``AcceleratorState.__init__`` (once) so that, after a renewal, a new state whose
  arguments the old one refuses is built afresh instead: ``AcceleratorState`` and
  ``GradientState`` are cleared with accelerate's ``_reset_state``, and the refused
  construction runs again, as in a new process; it says so in the cell's output.

accelerate offers no public reset; ``_reset_state`` is what its own tests and
transformers' ``TrainingArguments`` call. Where it is missing nothing is wrapped, and
the renewal says that a changed ``Accelerator(...)`` needs ``%dist restart``.
Nothing is imported: a framework the cells never imported has nothing cached.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

#: a renewal happened since accelerate's state last had to start afresh
_fresh_pending = False
_WRAPPED = "_jupyter_dist_fresh"
#: accelerate's words when a state asked for other arguments than the one there
REFUSED = "already been initialized"


def _describes_this_rank(shared: Any) -> bool:
    """Does accelerate's ``PartialState`` describe this rank of the session's world?"""
    try:
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    except (KeyError, ValueError):
        return False
    found = (shared.get("num_processes"), shared.get("process_index")) if shared else None
    return found == (world, rank)


def _start_afresh(state: Any) -> None:
    state.AcceleratorState._reset_state(False)
    state.GradientState._reset_state()


def _wrap(state: Any) -> None:
    """``AcceleratorState.__init__`` as `reset` says; idempotent."""
    cls = state.AcceleratorState
    original = cls.__init__
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _fresh_pending
        try:
            original(self, *args, **kwargs)
        except ValueError as err:
            if not _fresh_pending or REFUSED not in str(err):
                raise
            _fresh_pending = False
            _start_afresh(state)
            original(self, *args, **kwargs)
            print(
                "jupyter_dist: accelerate's state of the run before the process group was "
                "made again is set aside for this one's arguments, as in a fresh launch",
                file=sys.stderr,
                flush=True,
            )

    setattr(__init__, _WRAPPED, True)
    cls.__init__ = __init__


def reset() -> list[str]:
    """Do what the module says before the group is made again; a line to say for each
    framework whose state could not be kept consistent."""
    global _fresh_pending
    state = sys.modules.get("accelerate.state")
    if state is None:
        return []
    holders = [getattr(state, name, None) for name in ("AcceleratorState", "GradientState")]
    partial = getattr(state, "PartialState", None)
    if not all(callable(getattr(h, "_reset_state", None)) for h in (*holders, partial)):
        return [
            "accelerate's state cannot be reset (no _reset_state in this accelerate): "
            "restart the session (%dist restart) if Accelerator() refuses this run's "
            "arguments"
        ]
    if not _describes_this_rank(getattr(partial, "_shared_state", None)):
        _start_afresh(state)
        partial._reset_state()  # type: ignore[union-attr]
        return []
    _wrap(state)
    _fresh_pending = True
    return []
