"""Which notebook kernels a request may speak for: a sender's kernel id is not taken on trust.

A notebook kernel names itself in every request (``?kernel_id=...``, a turn's ``sender``):
the session lists it as attached, its turns carry its name, and while it holds an event
stream it counts as alive, its turns with it. So a kernel id must be one of a kernel this
server started and still runs (`is_notebook_kernel`; not a rank kernel it adopted for a
console, `server.rank_consoles`); any other is refused (`check_sender`). What a kernel
that went away left is dropped (`prune`): its entries in the sessions' notebook lists and
its turns, and a notebook listed without an event stream for `STREAM_GRACE_S`.
"""

from __future__ import annotations

from typing import Any

from jupyter_dist.control.cell_queue import Sender
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.errors import SpecError

#: seconds a notebook stays listed as attached without an event stream open (it opens one
#: as it attaches; a kernel that asked without ever opening one is no notebook's)
STREAM_GRACE_S = 60.0


def is_notebook_kernel(kernel_manager: Any, kernel_id: str) -> bool:
    """Whether ``kernel_id`` names a kernel the server started and still runs."""
    try:
        if kernel_id not in kernel_manager:
            return False
        kernel = kernel_manager.get_kernel(kernel_id)
    except Exception:  # KeyError, or a kernel manager that cannot say
        return False
    return bool(getattr(kernel, "owns_kernel", True))  # False: an adopted rank console


def check_sender(kernel_manager: Any, sender: Sender, where: str) -> Sender:
    """``sender``, when its kernel id (if it names one) is a kernel of this server; else
    SpecError naming it."""
    if sender.kernel_id and not is_notebook_kernel(kernel_manager, sender.kernel_id):
        raise SpecError(
            f"{where}kernel_id {sender.kernel_id[:80]!r} is not a kernel of this Jupyter "
            "server; expected the id of a running notebook kernel the server started "
            "(or no kernel_id)"
        )
    return sender


async def prune(manager: SessionManager, kernel_manager: Any) -> None:
    """Drop what kernels that are no longer the server's left in ``manager``."""
    await manager.prune_senders(
        lambda kernel_id: is_notebook_kernel(kernel_manager, kernel_id), STREAM_GRACE_S
    )


__all__ = ["STREAM_GRACE_S", "check_sender", "is_notebook_kernel", "prune"]
