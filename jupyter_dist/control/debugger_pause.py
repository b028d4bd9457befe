"""A rank paused by JupyterLab's visual debugger, as the notebook side sees it.

A console on a rank (`server.rank_consoles`) can turn JupyterLab's debugger on: ipykernel
starts debugpy inside the rank and carries the Debug Adapter Protocol in ``debug_request``
and ``debug_reply`` messages on the kernel's control channel, and its events in
``debug_event`` messages on IOPub. IOPub goes to every subscriber, the notebook side's
rank clients too, so they see the rank stop (at a breakpoint, after a step: a ``stopped``
event) and go on (``continued``; ``terminated`` or ``exited`` when the debugger is turned
off). A breakpoint may be in a file a notebook's cell calls into, so the paused rank may
be running that cell: the session then says the rank is paused in the debugger rather
than calling it a straggler, and a cell that waits behind a console's paused code says so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from jupyter_dist.text import ranks_label

#: DAP events after which the kernel runs again (or its debugger has gone)
_RESUMED = frozenset({"continued", "terminated", "exited"})


def paused_after(since: float | None, event: Mapping[str, Any]) -> float | None:
    """Since when the rank is paused once ``event`` (a ``debug_event``'s content) came:
    ``since`` kept while it stays paused, now when it stops, None when it goes on."""
    name = event.get("event")
    if name == "stopped":
        return since if since is not None else time.monotonic()
    if name in _RESUMED:
        return None
    return since


def paused_words(ranks: list[int], seconds: float) -> str:
    """What the cell's console line says of ``ranks`` paused in the debugger."""
    verb = "is" if len(ranks) == 1 else "are"
    return (
        f"{ranks_label(ranks)} {verb} paused in JupyterLab's debugger (for {seconds:.0f} s), "
        "not hung: Continue in the debugger lets it go on (the other ranks wait for it in "
        "the cell's collectives)"
    )


__all__ = ["paused_after", "paused_words"]
