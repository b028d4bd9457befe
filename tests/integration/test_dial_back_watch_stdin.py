"""A dial-back node that watches its stdin (``--watch-stdin``, as a Ray actor starts it):
the end of stdin ends the node, its agent and its ranks, and a SIGINT blocked by whoever
started it still reaches the cell."""

from __future__ import annotations

import asyncio
import queue
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from jupyter_dist.common.events import StreamOut
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers.dial_back import DialBackListener
from jupyter_dist.control.session import Session, SessionTimeouts
from tests.async_run import in_loop

pytestmark = pytest.mark.slow

#: starts the node as a Ray actor's task thread does: SIGINT blocked, credentials on stdin
#: and stdin kept open by this (parent) process, which then waits to be killed
PARENT = r"""
import signal, subprocess, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
node = subprocess.Popen(
    [sys.executable, "-m", "jupyter_dist.node.dial_back", sys.argv[1],
     "--credentials", "-", "--watch-stdin", "--retry", "5"],
    stdin=subprocess.PIPE,
)
node.stdin.write(sys.stdin.readline().encode())
node.stdin.flush()
print(node.pid, flush=True)
time.sleep(3600)
"""


@in_loop
async def test_the_end_of_stdin_ends_the_node_and_its_ranks_and_interrupts_reach_them() -> None:
    listener = DialBackListener(1, "127.0.0.1", connect_timeout=60)
    await listener.start()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, listener.address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    spec = SessionSpec(name="watched", nodes=1, procs_per_node=1, launcher="dial_back")
    session = Session(spec, SessionTimeouts(start=90.0), env={}, launchers=listener.launcher)
    try:
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.write(listener.credentials(0) + "\n")
        parent.stdin.flush()
        node_pid = int(parent.stdout.readline())
        await session.start()
        rank_pid = session.ranks[0].pid
        assert rank_pid is not None
        blocked = _blocked_signals(rank_pid)
        assert signal.SIGINT not in blocked, blocked

        # the rank hears an interrupt although the node's parent blocked SIGINT
        sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
        run = session.execute(
            "import time\nprint('sleeping', flush=True)\ntime.sleep(600)", sink=sink
        )
        task = asyncio.ensure_future(run)
        heard = ""
        deadline = time.monotonic() + 60
        while "sleeping" not in heard:  # the rank runs the cell
            assert time.monotonic() < deadline, f"the rank did not start the cell: {heard!r}"
            while not sink.empty():
                event = sink.get()
                if isinstance(event, StreamOut):
                    heard += event.text
            await asyncio.sleep(0.05)
        await session.interrupt()
        result = await asyncio.wait_for(task, 60)
        assert result.failures, "the sleep was not interrupted"

        # the parent dies: the node, its agent and its rank end
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while psutil.pid_exists(node_pid) or psutil.pid_exists(rank_pid):
            if time.monotonic() > deadline:
                pytest.fail(f"node {node_pid} or rank {rank_pid} outlived the end of stdin")
            await asyncio.sleep(0.2)
    finally:
        await session.shutdown()
        await listener.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _blocked_signals(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigBlk:"):
                mask = int(line.split()[1], 16)
                return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    return set()
