"""A rank's ``input()``, ``getpass()`` and debugger prompts, answered in the notebook.

ipykernel forwards ``input()`` and ``getpass()`` to the frontend that sent the running
request, as an ``input_request`` on the kernel's stdin socket addressed to the identity
the request came from; before it, the rank says so on IOPub behind its output
(`announce`). A notebook side's cell reaches a rank through its node's relay
(`node.relay`), so the request's identities are the relay's own, then the notebook's
socket's: the stdin request goes to the last one (`reply_to`), which is the identity the
notebook side's stdin socket has (`control.rank_client`). A request sent straight to the
kernel (a console on the rank) has one identity, which the same rule keeps.

Debuggers: the rank's ``breakpoint()`` is Python's own hook again (`use_python_hook`):
ipykernel's import of debugpy made it debugpy's, which does nothing while no debugger is
attached, so ``breakpoint()`` was skipped without a word. Python's hook reads
``PYTHONBREAKPOINT`` at each call (``0`` turns it off, a dotted name picks another
debugger) and starts pdb otherwise, whose prompt is an ``input()`` like any other.

An interrupt while a debugger waits for its next command would only print
``--KeyboardInterrupt--`` and ask again (pdb's command loop takes it), so the rank
would stay in the debugger: `quit_debugger` ends the debugging session instead, as its
``q`` does, and the cell ends as an interrupted one (``BdbQuit``, which the notebook side
counts as an interrupt). The rank's variables stay.
"""

from __future__ import annotations

import bdb
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from jupyter_dist.common.wire_names import INPUT_MSG_TYPE


def reply_to(idents: Any) -> Any:
    """The identity an ``input_request`` goes to: the last of the request's (the
    notebook side's socket, behind its node's relay), or ``idents`` as they are."""
    if isinstance(idents, Sequence) and not isinstance(idents, bytes | str) and idents:
        return list(idents)[-1:]
    return idents


def announce(kernel: Any, prompt: str, password: bool) -> None:
    """Say on IOPub, behind everything the request printed so far, that the rank asks
    for input now (`INPUT_MSG_TYPE`): the stdin socket's request may overtake the
    output, whose way goes through the node's relay."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    session, socket = getattr(kernel, "session", None), getattr(kernel, "iopub_socket", None)
    if session is None or socket is None:
        return
    session.send(
        socket,
        INPUT_MSG_TYPE,
        {"prompt": prompt, "password": password},
        parent=kernel.get_parent("shell"),
        ident=kernel._topic(INPUT_MSG_TYPE),
    )


def use_python_hook() -> None:
    """``breakpoint()`` starts Python's debugger (or the one ``PYTHONBREAKPOINT`` names,
    none for ``0``), not debugpy's hook, which waits for a client that never comes."""
    sys.breakpointhook = sys.__breakpointhook__


def active_debugger(frame: FrameType | None = None) -> bdb.Bdb | None:
    """The debugger (pdb, ipdb, IPython's) whose command loop called into the current
    frame, found by its ``self`` in a frame above, or None when none waits for input."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, bdb.Bdb):
            return owner
        frame = frame.f_back
    return None


def quit_debugger(frame: FrameType | None = None) -> bool:
    """If a debugger waits for input above ``frame``: end its session (as its ``q``) and
    raise `bdb.BdbQuit`; False when there is none (the interrupt is the caller's)."""
    debugger = active_debugger(frame if frame is not None else sys._getframe(1))
    if debugger is None:
        return False
    debugger.set_quit()
    raise bdb.BdbQuit("the cell was interrupted while the rank was in the debugger")


__all__ = ["active_debugger", "announce", "quit_debugger", "reply_to", "use_python_hook"]
