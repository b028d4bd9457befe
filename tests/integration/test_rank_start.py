"""A rank kernel that answers slowly (a loaded machine) still gets connected; agents and
ranks say what they are in ``ps`` and ``top``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from jupyter_dist.common.proc_titles import TITLE_PREFIX, is_ours
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.session import Session, SessionTimeouts

pytestmark = pytest.mark.slow

RUN_S, STOPPED_S = 0.02, 0.13
AGENT_TITLE = f"{TITLE_PREFIX} agent "


def cmdline(pid: int) -> str:
    """``/proc/PID/cmdline`` as ``ps`` shows it."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()


def throttle_ranks(stop: threading.Event) -> None:
    """Let every rank process of ours run 20 ms in every 150 ms (SIGSTOP/SIGCONT), so
    each request it answers takes longer than the client's first repeat interval."""
    me = psutil.Process()
    while not stop.is_set():
        ranks = [
            rank
            for agent in me.children()
            if " ".join(agent.cmdline()).startswith(AGENT_TITLE)
            for rank in agent.children()
        ]
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank.pid, signal.SIGSTOP)
        stop.wait(STOPPED_S)
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank.pid, signal.SIGCONT)
        stop.wait(RUN_S)


def test_a_rank_slower_than_the_repeats_still_connects() -> None:
    """kernel_info is repeated until IOPub answers. A client that waited only for the
    latest repeat's answer never saw one from a kernel slower than the repeats: the kernel
    worked through a growing queue of requests nobody waited for any more."""
    spec = resolve_shape("slow", ShapeRequest(procs=2), 0, "localhost")
    session = Session(spec, SessionTimeouts(start=90))
    stop = threading.Event()
    throttler = threading.Thread(target=throttle_ranks, args=(stop,), daemon=True)

    async def start_and_use() -> str:
        try:
            await session.start()
            stop.set()
            result = await session.execute("print('answered')")
            assert not result.failures, result.failures
            return session.state.value
        finally:
            stop.set()
            await session.shutdown()

    throttler.start()
    try:
        assert asyncio.run(start_and_use()) == "ready"
    finally:
        stop.set()
        throttler.join()


def test_agents_and_ranks_are_titled_with_what_they_are() -> None:
    spec = resolve_shape("titles", ShapeRequest(procs=2), 0, "localhost")
    session = Session(spec, SessionTimeouts(start=90))

    async def start_and_look() -> dict[int, tuple[str, str, str]]:
        try:
            await session.start()
            status = session.status()
            pids = [n["agent_pid"] for n in status["nodes"]] + [r["pid"] for r in status["ranks"]]
            return {
                pid: (
                    cmdline(pid),
                    Path(f"/proc/{pid}/comm").read_text().strip(),
                    Path(f"/proc/{pid}/environ").read_text(errors="replace"),
                )
                for pid in pids
            }
        finally:
            await session.shutdown()

    seen = asyncio.run(start_and_look())
    [(agent_line, agent_comm, agent_env), rank0, rank1] = seen.values()
    assert agent_line == "jupyter_dist agent node 0 session titles"
    assert agent_comm == "jd-agent-0"
    assert "PATH=" in agent_env  # the title did not overwrite the environment
    assert rank0[:2] == ("jupyter_dist rank 0/2 session titles", "jd-rank-0")
    assert rank1[:2] == ("jupyter_dist rank 1/2 session titles", "jd-rank-1")
    assert all(is_ours(line.split("\0")) for line, _, _ in seen.values())


def test_the_agent_imports_what_each_rank_kernel_would_import_as_it_starts(
    tmp_path: Path,
) -> None:
    """A forked rank starts warm: the agent has already imported what an ipykernel
    imports as it initialises (its debugger, debugpy), quietly (debugpy's warning about
    frozen modules would otherwise be the first thing a failed start shows from the
    agent's stderr), and leaves no trace of the quieting in the environment."""
    probe = (
        "import os, sys\n"
        "from jupyter_dist.node.agent import Agent\n"
        "agent = Agent(os.dup(1), 'preload-probe')\n"
        "agent.preload()\n"
        "print('debugger', 'ipykernel.debugger' in sys.modules, 'quieting left',"
        " 'PYDEVD_DISABLE_FILE_VALIDATION' in os.environ, 'errors', agent.preload_errors)\n"
        "agent._cleanup()\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("PYDEVD_DISABLE_FILE_VALIDATION", None)
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "debugger True quieting left False errors {}", done.stdout
    assert "Debugger warning" not in done.stderr and "PYDEVD" not in done.stderr, done.stderr
