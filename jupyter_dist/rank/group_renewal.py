"""Every notebook cell starts with the process group a fresh launch would give.

The session's bootstrap makes the default process group, as torchrun's environment lets a
script make it. A script that ends with ``destroy_process_group()`` (torchrun scripts,
accelerate's ``end_training()``, transformers' ``Trainer.end()``) leaves its rank without
one, and the next cell, or the same script run again, would meet torch's bare "Default
process group has not been initialized" while frameworks still describe the old group.
So before each notebook cell that all the session's ranks run (`CELL_RANKS_KEY`), a rank
whose group is gone:

* keeps the distributed state frameworks cached consistent with the group made again,
  and lets a new run's other arguments start it afresh (`rank.framework_state`);
* makes the group again as the bootstrap did, through `rank.process_group`'s wrapper (a
  key prefix of its own in the session's store), and says so in the cell's output.

A cell sent to some ranks only (``--ranks``) cannot make a group of all of them: it runs
without, and its ranks say that the next cell on all ranks makes it again. A console's
input (no `CREDIT_KEY`) and silent cells are left alone. A session started without a
group (``--no-init``, ``--framework jax`` or ``none``) gets none. `describe` is what a rank
reports after each cell (`GROUP_KEY`), so that the session's status tells the truth.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

from jupyter_dist.common.wire_names import CELL_RANKS_KEY, CREDIT_KEY

#: the backend and timeout the session's group was made with; None: it has no group
_kept: tuple[str, timedelta] | None = None
PREFIX = "jupyter_dist: "


def keep(backend: str, timeout: timedelta) -> None:
    """The session's group was made with these: make it again with them before a cell
    that finds it gone. Called by the bootstrap; idempotent."""
    global _kept
    _kept = (backend, timeout)
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None and _pre_run_cell not in shell.events.callbacks["pre_run_cell"]:
        shell.events.register("pre_run_cell", _pre_run_cell)


def describe() -> str:
    """This rank's default process group: its backend, or ``""`` when it has none."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return ""
    try:
        return str(dist.get_backend())
    except Exception:  # a group torch half made or half destroyed
        return ""


def _pre_run_cell(info: Any = None) -> None:
    del info
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return
    metadata = (kernel.get_parent("shell") or {}).get("metadata") or {}
    if metadata.get(CREDIT_KEY):  # a notebook cell, not a console's input
        renew(metadata.get(CELL_RANKS_KEY))


def _say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


def renew(cell_ranks: Any) -> bool:
    """Make the session's group again if a cell destroyed it and ``cell_ranks`` (how many
    ranks this cell runs on) is all of them; True when it was made."""
    if _kept is None or describe():
        return False
    backend, timeout = _kept
    world = int(os.environ.get("WORLD_SIZE", "0"))
    rank = os.environ.get("RANK", "?")
    if cell_ranks != world:
        _say(
            f"rank {rank} has no process group (an earlier cell destroyed it), and this "
            f"cell runs on {cell_ranks} of the {world} ranks: the next cell run on all "
            "of them makes it again"
        )
        return False
    from jupyter_dist.rank import framework_state

    notes = framework_state.reset()
    import torch.distributed as dist

    try:
        dist.init_process_group(backend=backend, timeout=timeout)
    except (Exception, KeyboardInterrupt) as err:
        _say(
            f"could not make the process group an earlier cell destroyed again "
            f"({type(err).__name__}: {err}); restart the session (%dist restart)"
        )
        return False
    _say(
        f"the process group an earlier cell destroyed is made again ({backend}, "
        f"world size {world}), as a fresh launch has it" + "".join(f"; {note}" for note in notes)
    )
    return True
