"""A rank says the moment Python takes an interrupt: the notebook side judges a stopped
rank by that, not by a clock.

ipykernel runs each request with ``signal.default_int_handler`` as the SIGINT handler,
which raises ``KeyboardInterrupt`` where the main thread is. Python runs that handler
between two bytecodes of the main thread: at once in Python code, when a blocking call
returns, or never while the thread sits in C code that does not give up (a collective
waiting for a peer). `install` wraps it: before raising, the handler publishes
`INTERRUPT_ACK_MSG_TYPE` on IOPub for the request being run, with the line the
interrupt landed on. From then on the rank is handling the interrupt (printing the
traceback, running the cell's ``except KeyboardInterrupt:`` and ``finally:``), however
long that takes on a loaded machine; a rank that never says so within the bound, and
whose stack is outside Python, is the stuck one (`control.rank_group`).

The message is sent from the handler itself (the IOPub socket ipykernel gives the main
thread is a queue into its IO thread, made for that thread's use), so it leaves before
the traceback is even built.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType, TracebackType
from typing import Any

from jupyter_dist.common.wire_names import INTERRUPT_ACK_MSG_TYPE


def where(frame: FrameType | None) -> str:
    """The line the interrupt landed on, as ``func (file:line)``."""
    if frame is None:
        return ""
    name = os.path.basename(frame.f_code.co_filename)
    return f"{frame.f_code.co_name} ({name}:{frame.f_lineno})"


def handler_for(kernel: Any) -> Any:
    """A SIGINT handler for ``kernel``'s requests: acknowledge, then raise as Python's
    default handler does."""

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        del signum
        # saying so must never keep the interrupt from happening
        with contextlib.suppress(Exception):
            tell(kernel, where(frame))
        raise KeyboardInterrupt

    return on_sigint


def without_handler(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its last entry when that is this module's handler: a traceback shows
    the user's line the interrupt landed on, as Python's own handler leaves it (and a
    frontend does not try to open this package's file)."""
    if tb is None:
        return None
    entry, before = tb, None
    while entry.tb_next is not None:
        entry, before = entry.tb_next, entry
    if entry.tb_frame.f_code.co_name != "on_sigint" or entry.tb_frame.f_code.co_filename != (
        __file__
    ):
        return tb
    if before is None:
        return None
    before.tb_next = None
    return tb


def tell(kernel: Any, place: str) -> None:
    """Publish the acknowledgement for the request ``kernel`` runs now."""
    session, socket = getattr(kernel, "session", None), getattr(kernel, "iopub_socket", None)
    if session is None or socket is None:
        return
    parent = kernel.get_parent("shell")
    session.send(
        socket,
        INTERRUPT_ACK_MSG_TYPE,
        {"where": place, "pid": os.getpid()},
        parent=parent,
        ident=kernel._topic(INTERRUPT_ACK_MSG_TYPE),
    )


def install(kernel: Any) -> Any:
    """Make the acknowledging handler SIGINT's for the request about to run; returns the
    handler it replaced (ipykernel restores it after the request)."""
    return signal.signal(signal.SIGINT, handler_for(kernel))
