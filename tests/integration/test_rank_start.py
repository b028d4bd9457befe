"""A rank kernel that answers slowly (a loaded machine) still gets connected."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

import psutil
import pytest

from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.session import Session, SessionTimeouts

pytestmark = pytest.mark.slow

RUN_S, STOPPED_S = 0.02, 0.13


def throttle_ranks(stop: threading.Event) -> None:
    """Let every rank process of ours run 20 ms in every 150 ms (SIGSTOP/SIGCONT), so
    each request it answers takes longer than the client's first repeat interval."""
    me = psutil.Process()
    while not stop.is_set():
        ranks = [
            rank
            for agent in me.children()
            if "jupyter_dist.node" in " ".join(agent.cmdline())
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
