"""``torch.multiprocessing.spawn`` inside a rank: its children make a group of their own.

A rank has torchrun's environment, ``TORCHELASTIC_USE_AGENT_STORE=True`` included: the
session's store is hosted already (by rank 0, as torchrun's agent hosts it), so an
``env://`` group connects to it as a client on every rank. A process the rank spawns
inherits that, and when it creates its own group, as ``mp.spawn`` code does (its own
``MASTER_PORT``, ``rank=i``), its rank 0 does not host the store either: every child
waits for a store nobody serves, for the group's timeout (30 minutes).

A child of a torchrun worker would inherit the same and hang the same way; torch itself,
starting a process that makes its own group (``torch.distributed.checkpoint``'s async
executor), sets the variable to ``False`` for it. `install` does the same for processes
started through ``torch.multiprocessing.start_processes`` (what ``mp.spawn`` calls): they
see ``TORCHELASTIC_USE_AGENT_STORE=False`` and the rest of the rank's environment; the
rank's own environment is unchanged once they are started.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

#: torchrun's variable: the store is hosted by someone else (its agent, here rank 0)
AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"
_WRAPPED = "_jupyter_dist_wrapped"


@contextlib.contextmanager
def children_host_their_store() -> Iterator[None]:
    """While in the block, processes started see ``TORCHELASTIC_USE_AGENT_STORE=False``."""
    before = os.environ.get(AGENT_STORE_VAR)
    os.environ[AGENT_STORE_VAR] = "False"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AGENT_STORE_VAR, None)
        else:
            os.environ[AGENT_STORE_VAR] = before


def install() -> None:
    """Wrap ``torch.multiprocessing``'s ``start_processes`` (in the package and in its
    ``spawn`` module, where ``spawn`` finds it); idempotent."""
    tmp: Any = importlib.import_module("torch.multiprocessing")
    # the module: the package's attribute of that name is the function ``spawn``
    tmp_spawn: Any = importlib.import_module("torch.multiprocessing.spawn")

    original: Callable[..., Any] = tmp_spawn.start_processes
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def start_processes(
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        with children_host_their_store():
            context = original(fn, args, nprocs, False, daemon, start_method)
        if not join:
            return context
        while not context.join():  # as torch's own, after starting them
            pass
        return None

    setattr(start_processes, _WRAPPED, True)
    tmp_spawn.start_processes = start_processes
    tmp.start_processes = start_processes
