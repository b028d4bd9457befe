"""The limits of one owner of sessions: how many sessions, and ranks a node across them."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.spec import SessionSpec, ShapeRequest
from jupyter_dist.control.limits import SessionLimits, check_room, node_of, ranks_by_node
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.control.session import SessionTimeouts
from jupyter_dist.errors import DistError, LimitError
from tests.unit.fake_agent import FakeCluster

HERE = "box.example.org"
SERVER = SessionLimits(
    max_sessions=2,
    max_node_ranks=4,
    owner="this Jupyter server",
    sessions_setting="DistServerApp.max_sessions",
    node_ranks_setting="DistServerApp.max_ranks_per_node_all_sessions",
)


def local(name: str, procs: int) -> SessionSpec:
    return SessionSpec(name, procs_per_node=procs)


def remote(name: str, *counts: tuple[str, int]) -> SessionSpec:
    hosts = tuple(HostSpec(host) for host, _ in counts)
    node_procs = tuple(n for _, n in counts)
    return SessionSpec(
        name, len(hosts), node_procs[0], hosts=hosts, node_procs=node_procs, launcher="ssh"
    )


def test_a_node_is_known_by_its_host_name_and_this_machine_by_any_of_its_names() -> None:
    for name in ("localhost", "127.0.0.1", "::1", HERE, "box", "LOCALHOST"):
        assert node_of(HostSpec(name), HERE) == HERE, name
    assert node_of(None, HERE) == HERE
    assert node_of(HostSpec("gpu1", user="me", port=2222), HERE) == "gpu1"
    spec = remote("r", ("gpu1", 2), ("localhost", 3), ("box", 1))
    assert ranks_by_node(spec, HERE) == {"gpu1": 2, HERE: 4}


def test_sessions_past_the_limit_are_refused_naming_the_limit_and_who_holds_it() -> None:
    running = {"a": local("a", 1)}
    check_room(local("b", 1), running, {}, SERVER, 8, HERE)
    with pytest.raises(LimitError) as caught:
        check_room(local("c", 1), running, {"b": local("b", 1)}, SERVER, 8, HERE)
    message = str(caught.value)
    assert message.startswith("session 'c': this Jupyter server runs 2 sessions already")
    assert "('a', 'b' (starting))" in message
    assert "DistServerApp.max_sessions = 2" in message
    assert message.endswith("or raise DistServerApp.max_sessions")
    check_room(local("c", 1), running, {}, SessionLimits(max_sessions=None), 8, HERE)


def test_ranks_of_all_sessions_on_one_node_are_summed() -> None:
    running = {"a": local("a", 2), "far": remote("far", ("gpu1", 4))}
    limits = SessionLimits(max_node_ranks=4, node_ranks_setting="DistServerApp.x")
    check_room(local("b", 2), running, {}, limits, 64, HERE)  # 2 + 2 = 4 here
    with pytest.raises(LimitError) as caught:
        check_room(local("b", 3), running, {}, limits, 64, HERE)
    message = str(caught.value)
    assert f"session 'b': 3 ranks on node {HERE!r} would make 5 there" in message
    assert "more than the 4 that this process's sessions may run on one node" in message
    assert "(DistServerApp.x = 4); 2 run there already ('a': 2)" in message
    assert "'far'" not in message  # its ranks are elsewhere
    # an ssh session naming this machine lands on the same node; gpu1 is full
    with pytest.raises(LimitError, match=r"3 ranks on node 'box.example.org' would make 5"):
        check_room(remote("r", ("localhost", 3)), running, {}, limits, 64, HERE)
    with pytest.raises(LimitError, match=r"1 rank on node 'gpu1' would make 5 there.*'far': 4"):
        check_room(remote("r", ("gpu2", 1), ("gpu1", 1)), running, {}, limits, 64, HERE)
    check_room(remote("r", ("gpu2", 4)), running, {}, limits, 64, HERE)


def test_without_a_limit_across_sessions_each_session_has_its_own() -> None:
    """A notebook's sessions of 8 ranks each may run side by side (each is held to the
    ranks one session may have on a node, by `check_limits`); a cap set across sessions
    counts them all."""
    running = {"a": local("a", 6)}
    check_room(local("b", 8), running, {}, SessionLimits(), 8, HERE)
    with pytest.raises(LimitError, match=r"more than the 8 "):
        check_room(local("b", 3), running, {}, SessionLimits(max_node_ranks=8), 8, HERE)
    with pytest.raises(LimitError, match="0 run there already"):  # alone past a low total
        check_room(local("b", 3), {}, {}, SessionLimits(max_node_ranks=2), 8, HERE)


def test_limits_refuse_nonsense() -> None:
    for bad in ({"max_sessions": 0}, {"max_node_ranks": -1}):
        with pytest.raises(ValueError, match="expected None or at least 1"):
            SessionLimits(**bad)  # type: ignore[arg-type]


def test_the_manager_counts_starting_sessions_and_frees_a_failed_start() -> None:
    """Two starts at once cannot both take the last room; a start that failed (or was
    never allowed) leaves its room to the next."""
    cluster = FakeCluster(says_ready=False)  # a start that hangs until cancelled
    manager = SessionManager(
        timeouts=SessionTimeouts(start=30.0, process_group=5.0),
        launchers=cluster.launcher,
        limits=SessionLimits(max_sessions=1),
    )

    async def main() -> None:
        first = asyncio.ensure_future(manager.get_or_start("a", ShapeRequest(procs=1), env={}))
        while not cluster.agents:
            await asyncio.sleep(0.01)
        assert manager.starting == {"a": manager.starting["a"]}
        with pytest.raises(LimitError, match=r"runs 1 session already \('a' \(starting\)\)"):
            await manager.get_or_start("b", ShapeRequest(procs=1), env={})
        assert len(cluster.agents) == 1  # nothing of b started
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert manager.starting == {} and manager.names() == []
        cluster.script(0).dies_at_start = "boom"
        with pytest.raises(DistError, match="boom"):
            await manager.get_or_start("c", ShapeRequest(procs=1), env={})
        assert manager.starting == {}

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_servers_limit_options_refuse_negative_values() -> None:
    from traitlets import TraitError

    from jupyter_dist.server.app import DistServerApp

    with pytest.raises(TraitError, match=r"max_sessions -1: expected 0 \(no limit\) or more"):
        DistServerApp(max_sessions=-1)
    with pytest.raises(TraitError, match=r"max_ranks_per_node_all_sessions -2: expected 0"):
        DistServerApp(max_ranks_per_node_all_sessions=-2)
    assert DistServerApp().max_sessions == 16
