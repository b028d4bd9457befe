"""The processes a process started, found and ended: what a rank started goes with it.

A rank kernel is the leader of its own process group, and the agent signals that group;
but a program a cell starts can leave it (``subprocess.Popen(start_new_session=True)``, a
daemon's double fork), and a child blocked in C code (a gloo collective, a store's
connect) lives through the SIGINT of an interrupt. So what a rank started is found by
parentage, not by group: `descendants` walks the tree below a process (psutil, which
reads ``/proc``), `end` signals such a snapshot and kills what is left after a grace.

Orphans are not lost either: the agent is a child subreaper (`become_subreaper`,
``PR_SET_CHILD_SUBREAPER``), so a process whose parent died inside a rank's tree is
reparented to the agent, not to init, and `adopted` lists them; each still carries the
environment it inherited from its rank (`rank_of`).

Processes are ``psutil.Process`` values: they remember their start time, so a pid reused
by an unrelated process meanwhile is never signalled. Nothing here waits on (reaps) a
child: that stays with whoever started it (``Popen.wait``, multiprocessing's ``join``).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import time
from collections.abc import Collection, Iterable

import psutil

#: prctl's option making the caller the reaper of its descendants' orphans (Linux)
_PR_SET_CHILD_SUBREAPER = 36
#: how often `end` looks whether the processes are gone
_POLL_S = 0.05


def become_subreaper() -> bool:
    """Make orphans below this process its children rather than init's; False where the
    system has no such thing (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        done: int = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return done == 0
    except (OSError, AttributeError):
        return False


def unblock_signals() -> None:
    """Deliver every signal to this process again, as a fresh program expects.

    A blocked-signal mask is inherited across fork and exec: a process started by a
    thread that blocks SIGINT (a Ray actor's task thread does) would pass the mask to the
    agent and every rank, and an interrupt would never reach a cell."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_SETMASK, set())


def descendants(pid: int, skip: Collection[int] = ()) -> list[psutil.Process]:
    """Every live process below ``pid`` (children, their children...), those in ``skip``
    left out (their own descendants are not); empty when ``pid`` is gone."""
    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in found if p.pid not in skip and running(p)]


def adopted(parent: int, known: Collection[int]) -> list[psutil.Process]:
    """The live children of ``parent`` that are not in ``known``: orphans it adopted as a
    subreaper, with their own descendants."""
    try:
        children = psutil.Process(parent).children()
    except psutil.Error:
        return []
    found: list[psutil.Process] = []
    for child in children:
        if child.pid not in known and running(child):
            found.append(child)
            found.extend(descendants(child.pid))
    return found


def rank_of(process: psutil.Process) -> int | None:
    """The rank whose environment ``process`` inherited (its ``RANK``), if it can be read."""
    try:
        value = process.environ().get("RANK")
    except psutil.Error:
        return None
    return int(value) if value is not None and value.isdigit() else None


def running(process: psutil.Process) -> bool:
    """``process`` is alive: running and not a zombie waiting to be reaped."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def send(processes: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each of ``processes`` still running (the very same processes, not
    whatever reuses their pids)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def wait_gone(processes: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``processes`` to end (zombies count as ended); returns
    those still running."""
    left = [p for p in processes if running(p)]
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = [p for p in left if running(p)]
    return left


def end(processes: Iterable[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """SIGTERM ``processes``, SIGKILL those still running ``grace_s`` later; returns those
    that outlived even that (a process in uninterruptible sleep), after one more second."""
    left = [p for p in processes if running(p)]
    send(left, signal.SIGTERM)
    left = wait_gone(left, grace_s)
    send(left, signal.SIGKILL)
    return wait_gone(left, 1.0)
