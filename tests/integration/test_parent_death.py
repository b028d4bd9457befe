"""A helper process that asked to die with its parent (``common.parent_death``, as a
session's Ray driver does) ends when its parent is killed, even while it is blocked in
native code that holds the GIL (a Ray driver inside ``ray.init``), where no thread of
Python could act; and one whose parent is gone already ends at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil

from jupyter_dist.common.parent_death import ORPHANED_EXIT
from tests.integration.server_process import wait_for

#: the helper: dies with its parent, says its pid, then blocks in C with the GIL held
HELPER = textwrap.dedent(
    """
    import ctypes, os, sys
    from jupyter_dist.common.parent_death import die_with_parent
    die_with_parent(int(sys.argv[1]))
    print(os.getpid(), flush=True)
    ctypes.PyDLL(None).pause()  # PyDLL: the GIL is held while it waits
    """
)
#: its parent, which waits for it (and is killed)
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys
    subprocess.run([sys.executable, "-c", sys.argv[1], str(os.getpid())], check=False)
    """
)
#: seconds for the helper to be gone: only a broken run waits this long
GONE_S = 30.0


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_helper_blocked_in_native_code_dies_with_its_killed_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, HELPER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        helper = psutil.Process(int(parent.stdout.readline()))
        assert helper.ppid() == parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_for(lambda: gone(helper), GONE_S, f"the end of helper pid {helper.pid}", poll=0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_helper_whose_parent_is_gone_already_ends_at_once() -> None:
    not_its_parent = os.getpid() + 1  # its parent is this process
    done = subprocess.run(
        [sys.executable, "-c", HELPER, str(not_its_parent)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == ORPHANED_EXIT and done.stdout == "", done
