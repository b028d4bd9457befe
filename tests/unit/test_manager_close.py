"""Stopping every session stops those still starting: the owner's stop (a Jupyter server
that stops) leaves nothing a start had made, and says why to whoever asked for the start.

The same through a real server, whose Ray session's driver is still connecting:
tests/ray/test_ray_unreachable.py.
"""

from __future__ import annotations

import asyncio

import pytest

from jupyter_dist.common.spec import ShapeRequest
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.control.session import SessionTimeouts
from jupyter_dist.errors import SessionError
from tests.unit.fake_agent import FakeCluster

#: a start that would hang this long unless it is stopped
HUNG_START_S = 600.0


async def started_agent(cluster: FakeCluster, count: int = 1) -> None:
    """Until ``count`` agents were started (their sessions are mid-start)."""
    while len(cluster.agents) < count:
        await asyncio.sleep(0.01)


def test_the_owners_stop_stops_a_start_and_refuses_the_next() -> None:
    cluster = FakeCluster(says_ready=False)  # each start hangs until it is stopped
    manager = SessionManager(
        timeouts=SessionTimeouts(start=HUNG_START_S, process_group=5.0),
        launchers=cluster.launcher,
    )

    async def main() -> None:
        starting = asyncio.ensure_future(manager.get_or_start("a", ShapeRequest(procs=1), env={}))
        await started_agent(cluster)
        assert cluster.live_agents()
        stopped = await manager.close("the Jupyter server is stopping")
        assert stopped == ["a"]
        with pytest.raises(SessionError) as caught:
            await starting
        assert str(caught.value) == (
            "session 'a' did not start: the Jupyter server is stopping; nothing of it is left"
        )
        assert not cluster.live_agents(), "the stopped start's agent still runs"
        assert manager.starting == {} and manager.names() == []
        with pytest.raises(SessionError, match="session 'b' cannot start: the Jupyter server"):
            await manager.get_or_start("b", ShapeRequest(procs=1), env={})
        assert len(cluster.agents) == 1  # nothing of b started

    asyncio.run(asyncio.wait_for(main(), 60))


def test_shutdown_all_stops_starts_too_and_a_cancelled_caller_stays_cancelled() -> None:
    cluster = FakeCluster(says_ready=False)
    manager = SessionManager(
        timeouts=SessionTimeouts(start=HUNG_START_S, process_group=5.0),
        launchers=cluster.launcher,
    )

    async def main() -> None:
        first = asyncio.ensure_future(manager.get_or_start("a", ShapeRequest(procs=1), env={}))
        await started_agent(cluster)
        await manager.shutdown_all()
        with pytest.raises(SessionError, match="did not start: every session was shut down"):
            await first
        assert not cluster.live_agents()
        # shutdown_all leaves the manager open: a start after it runs (and is cancelled
        # by its own caller: a cancelled cell, not a stop of every session)
        second = asyncio.ensure_future(manager.get_or_start("b", ShapeRequest(procs=1), env={}))
        await started_agent(cluster, 2)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert not cluster.live_agents() and manager.starting == {}

    asyncio.run(asyncio.wait_for(main(), 60))
