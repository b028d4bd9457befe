"""Liveness of the control plane's link to its agents: heartbeats and their deadlines,
spawns that are never answered, and what a node sends that is not the protocol.

Against in-memory agents (`fake_agent`) and hand-fed streams: no processes. The real
agents, over real links, are covered by tests/integration/test_agent_faults.py and
tests/multinode/test_link_faults.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from jupyter_dist.common.agent_protocol import PROTOCOL_VERSION, Heartbeat
from jupyter_dist.common.payloads import SessionStatus
from jupyter_dist.control.agent_client import AgentClient, read_lines
from jupyter_dist.control.launchers.base import AgentStreams, Launcher
from jupyter_dist.control.rank_group import SessionState
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.errors import AgentError, SessionError
from tests.unit.fake_agent import FakeCluster
from tests.unit.test_control_plane_fake import KernelStub, kernels, run, two_nodes

__all__ = ["kernels"]  # the fixture, used by name
#: a node deadline short enough for a unit test
QUICK = SessionTimeouts(start=5.0, process_group=5.0, node_deadline=0.4)
UNREACHABLE = re.compile(r"node 'node1' unreachable since \d\d:\d\d:\d\d: its agent did not answer")


def quick_session(cluster: FakeCluster) -> Session:
    return Session(two_nodes(), timeouts=QUICK, env={}, launchers=cluster.launcher)


def test_a_node_whose_agent_falls_silent_is_lost_and_its_ranks_given_up(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> tuple[SessionStatus, float]:
        session = quick_session(cluster)
        await session.start()
        await asyncio.sleep(0.5)  # a few beats: a node that answers stays
        assert session.state == SessionState.READY
        cluster.agents_of(1)[0].deaf = True
        began = time.monotonic()
        while session.state == SessionState.READY and time.monotonic() - began < 5:
            await asyncio.sleep(0.02)
        took = time.monotonic() - began
        await cluster.settle()
        status = session.status()
        await session.shutdown()
        return status, took

    status, took = run(main())
    assert took < 5, "the silent node was never noticed"
    assert status["state"] == "degraded"
    assert [n["lost"] for n in status["nodes"]] == [False, True]
    assert [r["state"] for r in status["ranks"]] == ["idle", "idle", "dead", "dead"]
    assert UNREACHABLE.match(status["ranks"][2]["exit"] or "")
    assert status["ranks"][2]["returncode"] is None  # out of reach: no exit status
    assert UNREACHABLE.search(status["broken_reason"])
    assert cluster.launchers[1].stopped, "the lost node's launcher was not stopped"
    agent0 = cluster.agents_of(0)[0]
    pings = [c for c in agent0.commands if c["op"] == "ping"]
    assert pings and all(p["deadline_s"] == Heartbeat(0.4).agent_deadline_s for p in pings)


def test_a_restart_on_a_silent_agent_ends_broken_with_a_reason_and_works_again(
    kernels: KernelStub,
) -> None:
    """The agent is SIGSTOPped: the restart's spawns are never answered."""
    cluster = FakeCluster(remote=True)

    async def main() -> None:
        session = quick_session(cluster)
        await session.start()
        cluster.agents_of(1)[0].deaf = True
        with pytest.raises(AgentError, match=UNREACHABLE):
            await asyncio.wait_for(session.restart(), 10)
        assert session.state == SessionState.BROKEN
        assert "unreachable since" in session.broken_reason
        await session.restart()  # the lost node gets a fresh agent
        assert session.state == SessionState.READY
        assert [len(a.ranks) for a in cluster.live_agents()] == [2, 2]
        await session.shutdown()

    run(main())


def test_a_restart_past_its_deadline_ends_broken_and_stops_the_nodes(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)
    slow = SessionTimeouts(start=5.0, process_group=5.0, restart=0.3, node_deadline=30)

    async def main() -> None:
        session = Session(two_nodes(), timeouts=slow, env={}, launchers=cluster.launcher)
        await session.start()
        cluster.agents_of(1)[0].deaf = True  # answers nothing, yet within its deadline
        with pytest.raises(Exception, match="the restart did not finish within 0 s"):
            await session.restart()
        assert session.state == SessionState.BROKEN
        assert not cluster.live_agents(), "a node was left running"
        with pytest.raises(SessionError) as refused:  # what a cell is told
            session.connection_info()
        assert str(refused.value).endswith(
            "every rank was stopped. `%dist restart --session fake` tries again, starting "
            "every rank afresh; `%dist shutdown --session fake` ends the session."
        ), refused.value
        session.timeouts = dataclasses.replace(slow, restart=30.0)
        await session.restart()  # as it said: fresh agents on both nodes
        assert [len(a.ranks) for a in cluster.live_agents()] == [2, 2]
        await session.shutdown()

    run(main())


def test_a_restart_that_cannot_reach_a_node_says_what_first_and_the_next_starts_it_afresh(
    kernels: KernelStub,
) -> None:
    """A node is lost, and the restart's new SSH connection to it is never answered (its
    link is down): once it answers, the next restart starts its agent afresh."""
    cluster = FakeCluster(remote=True)
    timeouts = SessionTimeouts(start=5.0, process_group=5.0)
    then = (
        "then `%dist restart --session fake` starts the session's agents afresh, and every "
        "rank; `%dist shutdown --session fake` ends the session."
    )
    first = "A restart cannot work until node 'node1' (no SSH answer within 10 s) can be "

    async def main() -> tuple[str, str, str]:
        session = Session(two_nodes(), timeouts=timeouts, env={}, launchers=cluster.launcher)
        await session.start()
        cluster.agents_of(1)[0].vanish()
        await cluster.settle()
        assert session.state == SessionState.DEGRADED
        cluster.script(1).unreachable = "no SSH answer within 10 s"
        with pytest.raises(AgentError) as failed:
            await session.restart()
        assert session.state == SessionState.BROKEN
        with pytest.raises(SessionError) as refused:  # what a cell is told
            session.connection_info()
        with pytest.raises(SessionError) as heal:  # every rank is gone: nothing to heal
            await session.heal()
        cluster.script(1).unreachable = None  # the node answers again
        await session.restart()
        assert session.state == SessionState.READY
        assert [(a.node, len(a.ranks)) for a in cluster.live_agents()] == [(0, 2), (1, 2)]
        assert session.status()["broken_reason"] == ""
        await session.shutdown()
        return str(failed.value), str(refused.value), str(heal.value)

    failed, refused, heal = run(main())
    advice = f"{first}started again: {then}"
    assert failed == f"node 'node1': no SSH answer within 10 s\n{advice}", failed
    assert refused == (
        "session 'fake' lost its restart, which failed: node 'node1': no SSH answer within "
        f"10 s; every rank was stopped. {advice}"
    ), refused
    assert heal == (
        "session 'fake': its restart failed and stopped every rank, so there is nothing to "
        f"heal. {advice}"
    ), heal
    # node 1: the agent lost, then the fresh one; node 0's agents were all started anew
    assert [a.node for a in cluster.agents] == [0, 1, 0, 0, 1], [a.node for a in cluster.agents]


def test_a_spawn_that_is_never_answered_times_out_naming_the_rank() -> None:
    cluster = FakeCluster()

    async def main() -> None:
        node = AgentClient(cluster.launcher(two_nodes(), 0), 0, on_exit=lambda *_: None)
        await node.start("s", {}, 5.0)
        cluster.agents[0].deaf = True
        with pytest.raises(AgentError, match="rank 3 was not started within 0 s"):
            await node.spawn(3, 0, {}, "key", "/", timeout=0.2)
        await node.stop()

    run(main())


# -- lines that are not the protocol -----------------------------------------------------------
class FedLauncher(Launcher):
    """A launcher whose agent's stdout is whatever a test feeds it."""

    kind: ClassVar[str] = "fed"

    def __init__(self, *lines: bytes) -> None:
        self.out = asyncio.StreamReader()
        for line in lines:
            self.out.feed_data(line)
        self.written: list[bytes] = []

    @property
    def host(self) -> str:
        return "fed"

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        launcher = self

        class Writer:
            def write(self, data: bytes) -> None:
                launcher.written.append(data)

            async def drain(self) -> None:
                pass

        return AgentStreams(self.out, Writer())

    async def signal(self, signum: int) -> None:
        pass

    async def stop(self, timeout: float = 5.0) -> None:
        if not self.out.at_eof():
            self.out.feed_eof()

    def alive(self) -> bool:
        return not self.out.at_eof()

    def stderr_tail(self) -> str:
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


def ready_line(**changes: Any) -> bytes:
    ready = {
        "event": "ready",
        "protocol": PROTOCOL_VERSION,
        "host": "fed",
        "pid": 7,
        "python": "/bin/python",
        "dir": "/tmp/x",
        "gpus": [],
        "free_port": 29500,
        "versions": {},
        "preload_errors": {},
        **changes,
    }
    return json.dumps(ready).encode() + b"\n"


def test_a_login_banner_before_ready_is_kept_and_the_start_goes_on() -> None:
    async def main() -> AgentClient:
        launcher = FedLauncher(b"Welcome to the cluster!\n", b"\xff\xfe not utf-8\n", ready_line())
        node = AgentClient(launcher, 0, on_exit=lambda *_: None)
        info = await node.start("s", {}, 5.0)
        assert info.pid == 7
        await node.stop()
        return node

    node = run(main())
    assert node.stray_lines == [b"Welcome to the cluster!\n", b"\xff\xfe not utf-8\n"]


def test_a_banner_then_silence_is_quoted_in_the_start_error() -> None:
    async def main() -> None:
        launcher = FedLauncher(b"Last login: Mon from 10.0.0.9\n")
        node = AgentClient(launcher, 0, on_exit=lambda *_: None)
        with pytest.raises(AgentError) as caught:
            await node.start("s", {}, 0.3)
        assert "not the agent protocol (a login banner" in str(caught.value)
        assert "b'Last login: Mon from 10.0.0.9'" in str(caught.value)

    run(main())


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"pid": "not a pid"}, "ValueError"),
        ({"gpus": 5}, "TypeError"),
        ({"host": None, "versions": None, "gpus": [{"nope": 1}]}, "TypeError"),
    ],
)
def test_a_ready_with_wrong_types_fails_the_start_quoting_it(
    changes: dict[str, Any], problem: str
) -> None:
    line = ready_line(**changes)

    async def main() -> None:
        node = AgentClient(FedLauncher(line), 0, on_exit=lambda *_: None)
        with pytest.raises(AgentError) as caught:
            await node.start("s", {}, 5.0)
        text = str(caught.value)
        assert f"node 'fed' sent a malformed 'ready' event ({problem}" in text
        assert "exited" not in text  # it did not exit: it said something wrong
        assert repr(line[:40])[2:-1] in text
        await node.stop()

    run(main())


def test_lines_are_bounded_and_a_long_one_is_cut_not_split() -> None:
    async def main() -> list[bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"first\n" + b"x" * (5 * 1024 * 1024) + b"\nafter\nlast")
        reader.feed_eof()
        return [line async for line in read_lines(reader, limit=1024 * 1024)]

    lines = run(main())
    assert lines[0] == b"first\n"
    assert lines[1] == b"x" * (1024 * 1024)  # its head only, once, with no newline
    assert lines[2:] == [b"after\n", b"last"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"y" * (5 * 1024 * 1024) + b"\n", "a line over 4194304 bytes: b'yyyy"),
        (b"Welcome to node0!\n", "a line that is not a JSON message (Expecting value"),
        (b'{"seq": 1}\n', "a JSON line with no 'event': b'{\"seq\": 1}'"),
        (b'{"event": "spawned", "rank": 0}\n', "a malformed 'spawned' event (KeyError"),
    ],
)
def test_a_line_that_is_not_the_protocol_after_ready_loses_the_node_at_once(
    line: bytes, problem: str
) -> None:
    """After ``ready`` the agent alone writes to its stdout: anything else there fails
    what waits on the node at once, quoting it, and is not taken for an exit."""

    async def main() -> AgentClient:
        launcher = FedLauncher(ready_line())
        lost: list[AgentClient] = []
        node = AgentClient(launcher, 0, on_exit=lambda *_: None, on_lost=lost.append)
        await node.start("s", {}, 5.0)
        launcher.out.feed_data(json.dumps({"event": "newer-kind", "x": 1}).encode() + b"\n")
        spawn = asyncio.ensure_future(node.spawn(0, 0, {}, "key", "/", timeout=30))
        await asyncio.sleep(0.05)
        assert not node.lost  # an event kind of a newer agent is left alone
        launcher.out.feed_data(line)
        with pytest.raises(AgentError):
            await asyncio.wait_for(spawn, 5)
        assert lost == [node]
        await node.stop()
        return node

    node = run(main())
    assert node.lost_reason.startswith("node 'fed': after its agent was ready, it sent "), node
    assert problem in node.lost_reason and "exited" not in node.lost_reason, node.lost_reason
