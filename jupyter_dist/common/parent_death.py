"""A helper process that must not outlive the process that started it.

`die_with_parent` asks Linux to SIGKILL this process when its parent ends, whichever way
it ends (killed with SIGKILL too), and ends it at once when the parent is gone already.
The signal comes from the kernel, so it lands even while this process is blocked in
native code that holds the GIL (a Ray driver inside ``ray.init``, connecting). Linux
sends it when the thread that started this process ends: a session's owner starts its
helpers from its event loop's thread, which lives as long as its sessions.

Where Linux's ``prctl`` is missing, a daemon thread looks at the parent's pid every
`POLL_S` seconds instead (an orphan is another process's child: init's, or a subreaper's).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

#: prctl's option naming the signal a process gets when its parent ends (Linux)
_PR_SET_PDEATHSIG = 1
#: seconds between looks at the parent's pid where prctl is missing
POLL_S = 0.5
#: the exit status of a process whose parent was gone already
ORPHANED_EXIT = 3


def parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent ends; False where it
    cannot (not Linux, no prctl)."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        done: int = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        return done == 0
    return False


def die_with_parent(parent: int) -> None:
    """End this process when process ``parent``, the one that started it, ends: SIGKILL
    from the kernel, or a watching thread where there is no such thing; at once if
    ``parent`` is not this process's parent any more (it ended before it was asked)."""
    kernel = parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(ORPHANED_EXIT)
    if not kernel:
        threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(ORPHANED_EXIT)


__all__ = ["ORPHANED_EXIT", "POLL_S", "die_with_parent", "parent_death_signal"]
