"""An interrupted cell's child processes end with it; the rank itself lives on.

An interrupt reaches a rank's whole process group as SIGINT (ipykernel's
``interrupt_request``, also what ``--timeout`` sends): the cell's code gets its
KeyboardInterrupt, and so do the processes it started that stayed in the group. But a
child blocked in C code (a ``torch.multiprocessing.spawn`` worker waiting in a gloo
collective, a store's connect) or one that ignores SIGINT (DataLoader workers) lives on,
and one in a session of its own (``Popen(start_new_session=True)``) never hears it.

`after_interrupt` takes the rank's descendants at the moment of the interrupt and, on a
thread of its own, gives them `SIGINT_GRACE_S` to stop, then SIGTERM, then SIGKILL after
`TERM_GRACE_S` (`common.process_tree.end`). Processes started after the interrupt are not
touched, nor the helpers the rank keeps for its whole life, with what is below them:
multiprocessing's resource tracker and forkserver, ``torch.compile``'s pool of compile
workers (`kept`). Children are not reaped here: whoever started them
does (``Popen.wait``, ``Process.join``); until then they are zombies, which count as gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import psutil

from jupyter_dist.common import process_tree

log = logging.getLogger(__name__)

#: seconds the descendants get to stop on the interrupt's own SIGINT
SIGINT_GRACE_S = 1.0
#: seconds between SIGTERM and SIGKILL
TERM_GRACE_S = 2.0


def helper_pids() -> set[int]:
    """multiprocessing's long-lived helpers of this process (started on first use)."""
    found: set[int] = set()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    if tracker is not None:
        found.add(getattr(getattr(tracker, "_resource_tracker", None), "_pid", None) or 0)
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:
        server: Any = getattr(forkserver, "_forkserver", None)
        found.add(getattr(server, "_forkserver_pid", None) or 0)
    found.discard(0)
    return found


#: what the command line of a ``torch.compile`` worker pool's process says
COMPILE_WORKER = "torch._inductor.compile_worker"


def kept(procs: list[psutil.Process]) -> set[int]:
    """The pids among ``procs`` (this process's descendants) that an interrupt leaves be:
    the long-lived helpers and what is below them."""
    helpers = helper_pids()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if any(COMPILE_WORKER in part for part in proc.cmdline()):
                helpers.add(proc.pid)
    found = set(helpers)
    for pid in helpers:
        found.update(p.pid for p in process_tree.descendants(pid))
    return found


def after_interrupt() -> threading.Thread | None:
    """End what this rank started before now (see the module docstring); the thread
    doing it, or None when there is nothing to end."""
    procs = process_tree.descendants(os.getpid())
    skip = kept(procs)
    procs = [p for p in procs if p.pid not in skip]
    if not procs:
        return None
    thread = threading.Thread(
        target=_end, args=(procs,), name="jupyter-dist-child-reaper", daemon=True
    )
    thread.start()
    return thread


def _end(procs: list[psutil.Process]) -> None:
    own_group = os.getpgid(0)
    outside = []
    for proc in procs:
        try:
            if os.getpgid(proc.pid) != own_group:
                outside.append(proc)
        except OSError:
            continue
    process_tree.send(outside, signal.SIGINT)  # what the group's SIGINT did not reach
    left = process_tree.wait_gone(procs, SIGINT_GRACE_S)
    if left:
        log.info("ending %d child process(es) still running after the interrupt", len(left))
        stuck = process_tree.end(left, TERM_GRACE_S)
        if stuck:
            log.warning("child processes %s outlived SIGKILL", [p.pid for p in stuck])
