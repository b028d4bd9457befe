"""The control plane's lifecycle against in-memory agents (`fake_agent`): no processes.

Sessions start, fail to start, lose ranks and nodes, restart and shut down through the
real `Session`, `SessionManager` and `AgentClient`, talking the real agent protocol to
`FakeAgent` values (`Session(launchers=...)` is the seam). The ranks are not kernels:
tests that need a session to get past its kernels take the `kernels` fixture, which
stands in for the one step that talks to them (`RankClient.connect`, and the bootstrap
cells as `Session._run_cell`); the rest use the real `RankClient` up to where a kernel
would have to answer. The real agent and real kernels are covered by tests/integration.
"""

from __future__ import annotations

import asyncio
import queue
import re
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from jupyter_dist._version import __version__
from jupyter_dist.common.events import CellEvent, CellResult
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.payloads import Backend, Device, ManagerEvent, SessionStatus
from jupyter_dist.common.spec import SessionSpec, ShapeRequest
from jupyter_dist.control.launchers.base import Launcher, Placement
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.control.rank_client import RankClient
from jupyter_dist.control.rank_group import RankGroup, RankState, SessionState
from jupyter_dist.control.rendezvous import loopback_interface
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.errors import (
    AgentError,
    NoGPUError,
    RankFailure,
    RanksFailed,
    SessionError,
    SpecError,
    UnknownSession,
)
from tests.unit.fake_agent import FakeCluster

T = TypeVar("T")
FAST = SessionTimeouts(start=5.0, process_group=5.0)


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@dataclass
class KernelStub:
    """Stands in for the rank kernels: every connect succeeds (unless the rank died
    already) and every bootstrap cell succeeds, unless `failures` says otherwise."""

    connected: list[int] = field(default_factory=list)
    cells: list[tuple[str, list[int]]] = field(default_factory=list)
    #: a text found in a cell -> the failures that cell reports
    failures: dict[str, tuple[RankFailure, ...]] = field(default_factory=dict)


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelStub]:
    stub = KernelStub()

    async def connect(self: RankClient, timeout: float, dead: Callable[[], str | None]) -> None:
        reason = dead()
        if reason:
            raise SessionError(f"rank {self.rank} exited while starting: {reason}")
        stub.connected.append(self.rank)

    async def run_cell(
        self: RankGroup,
        code: str,
        ranks: list[int],
        sink: queue.SimpleQueue[CellEvent] | None,
        timeout: float | None,
        silent: bool = False,
        execution_count: int | None = None,
        allow_stdin: bool = False,
    ) -> CellResult:
        stub.cells.append((code, list(ranks)))
        failed = next((f for text, f in stub.failures.items() if text in code), ())
        return CellResult(tuple(ranks), failed, {r: 0.0 for r in ranks})

    monkeypatch.setattr(RankClient, "connect", connect)
    monkeypatch.setattr(Session, "_run_cell", run_cell)
    yield stub


def two_nodes(device: Device = "cpu") -> SessionSpec:
    """Two listed hosts with two ranks each (the launcher kind is the fake's anyway)."""
    backend: Backend = "nccl" if device == "cuda" else "gloo"
    hosts = (HostSpec("node0"), HostSpec("node1"))
    return SessionSpec(
        name="fake", nodes=2, procs_per_node=2, device=device, backend=backend, hosts=hosts
    )


def session_on(cluster: FakeCluster, spec: SessionSpec) -> Session:
    return Session(spec, timeouts=FAST, env={}, launchers=cluster.launcher)


def assert_all_stopped(cluster: FakeCluster, session: Session) -> None:
    """Nothing runs any more: every agent exited, with no rank left, after a stop."""
    assert cluster.agents, "no agent was ever started"
    assert session.state == SessionState.STOPPED
    for agent in cluster.agents:
        assert agent.exited, f"agent of {agent.host} still runs"
        assert not agent.ranks, f"{agent.host} still runs ranks {sorted(agent.ranks)}"
    for launcher in cluster.launchers:
        assert launcher.stopped


# -- a start that works ---------------------------------------------------------------------
def test_a_two_node_session_starts_its_ranks_through_each_nodes_agent(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)
    progress: list[str] = []

    async def main() -> tuple[Session, SessionStatus]:
        session = session_on(cluster, two_nodes())
        await session.start(progress.append)
        status = session.status()
        await session.shutdown()
        return session, status

    session, status = run(main())
    node0, node1 = cluster.agents
    assert (node0.host, node1.host) == ("node0", "node1")
    assert node0.session == node1.session == "fake"
    # several ranks share a node; the node rank names the agent in ps
    assert node0.env == {"OMP_NUM_THREADS": "1", "NODE_RANK": "0"}
    assert node1.env == {"OMP_NUM_THREADS": "1", "NODE_RANK": "1"}

    # torchrun's layout: node-major, each rank spawned once on its own node's agent
    assert [(r.rank, r.local_rank) for r in node0.spawned] == [(0, 0), (1, 1)]
    assert [(r.rank, r.local_rank) for r in node1.spawned] == [(2, 0), (3, 1)]
    for agent in (node0, node1):
        for child in agent.spawned:
            env = child.env
            assert env["RANK"] == str(child.rank) and env["LOCAL_RANK"] == str(child.local_rank)
            assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
            assert env["NODE_RANK"] == str(agent.node) and env["GROUP_WORLD_SIZE"] == "2"
            # MASTER_ADDR is node 0 as the other nodes reach it; the port its agent found
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29555")
            assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
            assert child.key == session.key and child.cwd == session.cwd

    # every node was asked for its route to node 0; node 1 probed the store's port
    for agent in (node0, node1):
        routes = [c for c in agent.commands if c["op"] == "route"]
        assert [c["addr"] for c in routes] == ["10.0.0.1"]
    assert not [c for c in node0.commands if c["op"] == "probe"]
    probes = [c for c in node1.commands if c["op"] == "probe"]
    assert [(c["addr"], c["port"]) for c in probes] == [("10.0.0.1", 29555)]

    # rank 0 hosts the store first, then every rank bootstraps
    (host_code, host_ranks), (boot_code, boot_ranks) = kernels.cells
    assert "host_store('10.0.0.1', 29555, 4" in host_code and host_ranks == [0]
    assert "bootstrap(True" in boot_code and boot_ranks == [0, 1, 2, 3]
    assert sorted(kernels.connected) == [0, 1, 2, 3]

    assert status["state"] == "ready" and status["master"] == "10.0.0.1:29555"
    assert [n["agent_pid"] for n in status["nodes"]] == [node0.pid, node1.pid]
    assert not any(n["lost"] for n in status["nodes"])
    pids = {c.rank: c.pid for a in (node0, node1) for c in a.spawned}
    assert [(r["rank"], r["host"], r["pid"], r["state"]) for r in status["ranks"]] == [
        (0, "node0", pids[0], "idle"),
        (1, "node0", pids[1], "idle"),
        (2, "node1", pids[2], "idle"),
        (3, "node1", pids[3], "idle"),
    ]
    assert status["ranks"][2]["log"] == node1.spawned[0].log_path
    assert any("node node1: agent ready" in p for p in progress)


def test_a_single_host_session_meets_on_loopback(kernels: KernelStub) -> None:
    cluster = FakeCluster()

    async def main() -> tuple[Session, SessionStatus]:
        session = session_on(cluster, SessionSpec(name="local", procs_per_node=3))
        await session.start()
        status = session.status()
        await session.shutdown()
        return session, status

    session, status = run(main())
    (agent,) = cluster.agents
    assert session.rendezvous is not None and session.rendezvous.master_addr == "localhost"
    port = str(session.rendezvous.master_port)
    assert int(port) > 0
    loopback = loopback_interface()
    for child in agent.spawned:
        assert (child.env["MASTER_ADDR"], child.env["MASTER_PORT"]) == ("localhost", port)
        assert child.env.get("GLOO_SOCKET_IFNAME") == loopback
    assert not [c for c in agent.commands if c["op"] in ("route", "probe")]
    assert status["state"] == "ready" and status["master"] == f"localhost:{port}"


# -- starts that fail, and leave nothing running ---------------------------------------------
def test_a_node_with_another_jupyter_dist_is_told_which_to_install() -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(1).versions = {"jupyter_dist": "0.0.9"}
    session = session_on(cluster, two_nodes())
    with pytest.raises(AgentError) as err:
        run(session.start())
    message = str(err.value)
    assert "node 'node1'" in message and "jupyter_dist 0.0.9" in message
    assert f"install jupyter_dist=={__version__} there" in message
    assert not any(a.spawned for a in cluster.agents)
    assert_all_stopped(cluster, session)


def test_a_node_that_cannot_import_torch_is_named() -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(0).preload_errors = {"torch": "ModuleNotFoundError: No module named 'torch'"}
    session = session_on(cluster, two_nodes())
    with pytest.raises(AgentError, match=r"node 'node0': /fake/bin/python cannot import torch"):
        run(session.start())
    assert_all_stopped(cluster, session)


def test_an_agent_that_dies_during_start_fails_it_with_its_output_and_a_hint() -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(1).dies_at_start = "/usr/bin/python3: No module named jupyter_dist"
    session = session_on(cluster, two_nodes())
    with pytest.raises(AgentError) as err:
        run(session.start())
    message = str(err.value)
    assert message.startswith("node 'node1': the agent exited; its last output:")
    assert "No module named jupyter_dist" in message
    assert f"install jupyter_dist=={__version__} in that node's Python" in message
    # node 0's agent was up, and was told to go
    (node0,) = cluster.agents_of(0)
    assert {"op": "shutdown"} in node0.commands
    assert_all_stopped(cluster, session)


def test_every_failed_node_is_listed_when_several_fail() -> None:
    cluster = FakeCluster(remote=True, dies_at_start="Connection reset by peer")
    session = session_on(cluster, two_nodes())
    with pytest.raises(AgentError) as err:
        run(session.start())
    assert str(err.value).startswith("2 of 2 nodes failed to start:\n  - node 'node0'")
    assert "  - node 'node1': the agent exited" in str(err.value)
    assert_all_stopped(cluster, session)


def test_an_agent_that_never_says_ready_times_out() -> None:
    cluster = FakeCluster(says_ready=False)
    timeouts = SessionTimeouts(start=0.2)
    session = Session(SessionSpec(name="hung"), timeouts=timeouts, launchers=cluster.launcher)
    with pytest.raises(AgentError, match="the agent did not report ready within 0 s"):
        run(session.start())
    assert_all_stopped(cluster, session)


def test_an_agent_speaking_another_protocol_is_told_which_version_to_install() -> None:
    """Said at once from the agent's ready event, not after the start timeout."""
    cluster = FakeCluster(protocol=2, versions={"jupyter_dist": "0.0.1"})
    session = Session(
        SessionSpec(name="old"), timeouts=SessionTimeouts(start=30.0), launchers=cluster.launcher
    )
    started = time.monotonic()
    with pytest.raises(AgentError, match=f"install jupyter_dist=={__version__}") as err:
        run(session.start())
    assert time.monotonic() - started < 10.0
    assert "has jupyter_dist 0.0.1, whose agent speaks protocol 2" in str(err.value)
    assert not any(a.spawned for a in cluster.agents)
    assert_all_stopped(cluster, session)


def test_gpus_asked_of_a_node_without_them_fail_before_any_rank() -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(0).gpus = 2
    session = session_on(cluster, two_nodes(device="cuda"))
    with pytest.raises(NoGPUError, match="--gpus 2: node 'node1' has 0 CUDA devices"):
        run(session.start())
    assert not any(a.spawned for a in cluster.agents)
    assert_all_stopped(cluster, session)


def test_a_node_without_a_route_to_node_0_is_named() -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(1).ifname = None
    session = session_on(cluster, two_nodes())
    with pytest.raises(AgentError, match=r"node 'node1' has no route to node 0 \(node0"):
        run(session.start())
    assert_all_stopped(cluster, session)


def test_a_node_0_behind_nat_is_refused_not_served_on_every_interface() -> None:
    """The SSH connection landed on an address node 0 does not hold (NAT): its store could
    only listen there by listening on every interface, so the start fails, naming both."""
    cluster = FakeCluster(remote=True)
    cluster.script(0).route_ip = "192.168.7.7"
    session = session_on(cluster, two_nodes())
    with pytest.raises(
        AgentError, match=r"node 0 \(node0\) does not hold the address 10\.0\.0\.1 .*192\.168\.7\.7"
    ):
        run(session.start())
    assert not any(a.spawned for a in cluster.agents)
    assert_all_stopped(cluster, session)


def test_a_node_that_cannot_reach_the_store_fails_the_start(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(1).probe_error = "ConnectionRefusedError: [Errno 111] Connection refused"
    session = session_on(cluster, two_nodes())
    reach = r"node 'node1' cannot reach the rendezvous at 10\.0\.0\.1:29555 on node 0"
    with pytest.raises(AgentError, match=reach):
        run(session.start())
    # rank 0 hosted the store; nobody got as far as init_process_group
    assert [ranks for _, ranks in kernels.cells] == [[0]]
    assert_all_stopped(cluster, session)


def test_a_rank_the_agent_cannot_spawn_fails_the_start() -> None:
    cluster = FakeCluster()
    cluster.script(0).spawn_errors = {1: "OSError: [Errno 12] Cannot allocate memory"}
    session = session_on(cluster, SessionSpec(name="nomem"))
    with pytest.raises(AgentError, match=r"node 'node0': agent error: OSError: .*Cannot allocate"):
        run(session.start())
    assert_all_stopped(cluster, session)


@pytest.mark.parametrize(
    ("returncode", "said"), [(3, "exit code 3"), (-11, "killed by signal SIGSEGV (11)")]
)
def test_a_rank_that_exits_while_starting_fails_the_start(returncode: int, said: str) -> None:
    """The real `RankClient` waits for the kernel and hears of the exit from the agent."""
    cluster = FakeCluster()
    cluster.script(0).exits_at_spawn = {1: returncode}
    session = session_on(cluster, SessionSpec(name="crash"))
    with pytest.raises(SessionError, match=f"^rank 1 exited while starting: {re.escape(said)}$"):
        run(session.start())
    rank1 = session.ranks[1]
    assert rank1.state == RankState.DEAD and rank1.exit_code == returncode
    assert_all_stopped(cluster, session)


def test_a_rank_whose_kernel_never_answers_is_shown_where_it_is() -> None:
    """No kernel listens at the rank's sockets: the start gives up on it after its timeout
    and shows the rank's stack dump and log, asked of its agent."""
    cluster = FakeCluster()
    cluster.script(0).log_text = "importing a huge module\n"
    session = Session(
        SessionSpec(name="mute", procs_per_node=1),
        timeouts=SessionTimeouts(start=0.3),
        launchers=cluster.launcher,
    )
    with pytest.raises(SessionError) as err:
        run(session.start())
    message = str(err.value)
    assert message.startswith("rank 0: kernel did not answer within 0 s")
    assert "its stack:\nThread 0x1 (most recent call first)" in message
    assert "the end of its log" in message and "importing a huge module" in message
    (agent,) = cluster.agents
    assert [c["op"] for c in agent.commands if c["op"] in ("read_log", "stacks")][:2] == [
        "read_log",
        "stacks",
    ]
    assert_all_stopped(cluster, session)


def test_a_failed_bootstrap_fails_the_start(kernels: KernelStub) -> None:
    failure = RankFailure(1, "node0", 1, "error", "DistBackendError", "connection refused")
    kernels.failures["bootstrap(True"] = (failure,)
    cluster = FakeCluster()
    session = session_on(cluster, SessionSpec(name="noinit"))
    with pytest.raises(RanksFailed, match="DistBackendError"):
        run(session.start())
    assert_all_stopped(cluster, session)


# -- a running session loses ranks and nodes ------------------------------------------------
async def started(cluster: FakeCluster, spec: SessionSpec) -> Session:
    session = session_on(cluster, spec)
    await session.start()
    assert session.state == SessionState.READY
    return session


@pytest.mark.parametrize(
    ("returncode", "said"), [(1, "exit code 1"), (-9, "killed by signal SIGKILL (9)")]
)
def test_a_rank_that_exits_degrades_the_session_and_the_next_cell_replaces_it(
    kernels: KernelStub, returncode: int, said: str
) -> None:
    cluster = FakeCluster(remote=True)
    changes: list[str] = []

    async def main() -> tuple[SessionStatus, SessionStatus, dict[int, int | None]]:
        session = await started(cluster, two_nodes())
        before = {r: rec.pid for r, rec in session.ranks.items()}
        session.on_change = lambda group: changes.append(group.state.value)
        node1 = cluster.agents_of(1)[0]
        pid = node1.ranks[3].pid
        node1.exit_rank(3, returncode, log_tail="Segmentation fault\n")
        await cluster.settle()
        assert session.broken_reason == f"rank 3 (host node1, pid {pid}) {said}"
        status = session.status()
        kernels.cells.clear()
        result = await session.execute("print(1)")
        assert not result.failures
        healed = session.status()
        await session.shutdown()
        return status, healed, before

    status, healed, before = run(main())
    assert status["state"] == "degraded" and changes[:2] == ["ready", "degraded"]
    assert "healing" in changes and changes[-1] == "stopped"
    rank3 = status["ranks"][3]
    assert (rank3["state"], rank3["returncode"], rank3["exit"]) == ("dead", returncode, said)
    assert rank3["exit_tail"] == "Segmentation fault\n"
    assert [r["state"] for r in status["ranks"][:3]] == ["idle"] * 3
    # rank 3 alone is new; every rank then joined generation 1's group; the cell ran
    assert healed["state"] == "ready" and healed["generation"] == 1
    assert [r["pid"] for r in healed["ranks"][:3]] == [before[0], before[1], before[2]]
    assert healed["ranks"][3]["pid"] != before[3]
    joins = [(code, ranks) for code, ranks in kernels.cells if "_jd_regroup.join(" in code]
    assert len(joins) == 1 and joins[0][1] == [0, 1, 2, 3], kernels.cells
    assert ", 4, 1, " in joins[0][0]  # world size 4, generation 1
    assert kernels.cells[-1] == ("print(1)", [0, 1, 2, 3])
    assert not any("host_store" in code for code, _ in kernels.cells)  # rank 0's store kept


def test_a_lost_node_waits_for_a_heal_that_starts_it_again(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> tuple[str, SessionStatus]:
        session = await started(cluster, two_nodes())
        cluster.agents_of(1)[0].vanish(stderr="Killed")
        await cluster.settle()
        with pytest.raises(SessionError) as err:
            await session.execute("print(1)")
        said = await session.heal()
        status = session.status()
        await session.shutdown()
        return str(err.value) + "\n" + said, status

    said, status = run(main())
    assert "is degraded: rank 2 was lost" in said and "%dist heal --session fake" in said
    assert "ranks 0-1 kept their state" in said
    assert "ranks 2-3 replaced by fresh rank kernels (node 1 started again)" in said
    assert status["state"] == "ready" and status["generation"] == 1
    assert [n["lost"] for n in status["nodes"]] == [False, False]
    assert len(cluster.agents_of(1)) == 2  # a new agent on node 1


def test_an_agent_that_vanishes_takes_its_ranks_with_it(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> SessionStatus:
        session = await started(cluster, two_nodes())
        cluster.agents_of(1)[0].vanish(stderr="Killed")
        await cluster.settle()
        status = session.status()
        await session.shutdown()
        return status

    status = run(main())
    assert status["state"] == "degraded"
    assert [n["lost"] for n in status["nodes"]] == [False, True]
    assert [r["state"] for r in status["ranks"]] == ["idle", "idle", "dead", "dead"]
    assert status["ranks"][2]["exit"] == "node 'node1': the agent exited"
    assert status["ranks"][2]["returncode"] is None  # out of reach: no exit status known
    assert (
        status["ranks"][2]["exit_tail"]
        == "node 'node1': the agent exited; its last output:\nKilled"
    )
    assert status["broken_reason"].startswith("rank 2 (host node1, pid ")
    assert status["broken_reason"].endswith("): node 'node1': the agent exited")


def test_stacks_are_asked_of_each_ranks_agent(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(1).stack_dump = "Thread 0x2 (most recent call first):\n  in all_reduce\n"

    async def main() -> dict[int, str]:
        session = await started(cluster, two_nodes())
        dumps = await session.stacks([1, 2])
        await session.shutdown()
        return dumps

    dumps = run(main())
    assert dumps[1].startswith("Thread 0x1") and "all_reduce" in dumps[2]
    asked = {a.node: [c for c in a.commands if c["op"] == "stacks"] for a in cluster.agents}
    assert [c["ranks"] for c in asked[0]] == [[1]] and [c["ranks"] for c in asked[1]] == [[2]]


def test_a_rank_that_cannot_answer_for_itself_is_asked_through_faulthandler(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)
    cluster.script(1).gil_held = {2}

    async def main() -> tuple[dict[int, str], float]:
        session = await started(cluster, two_nodes())
        began = time.monotonic()
        dumps = await session.stacks([1, 2])
        took = time.monotonic() - began
        await session.shutdown()
        return dumps, took

    dumps, took = run(main())
    assert all(d.startswith("Thread 0x1") for d in dumps.values()), dumps
    asked = {a.node: [c for c in a.commands if c["op"] == "stacks"] for a in cluster.agents}
    # rank 1 answered at once; rank 2 was asked again, through the signal, after waiting
    assert [(c["ranks"], c.get("fallback")) for c in asked[0]] == [([1], False)]
    assert [(c["ranks"], c.get("fallback")) for c in asked[1]] == [([2], False), ([2], True)]
    assert took >= 2.0


def test_a_failed_agent_request_fails_at_once(kernels: KernelStub) -> None:
    """An agent's error in answer to a request reaches that request's caller (a rank that
    exited between a dump and its read), instead of leaving it waiting for a reply."""
    cluster = FakeCluster(remote=True)

    async def main() -> tuple[str, float]:
        session = await started(cluster, two_nodes())
        agent = session.ranks[1].node
        assert agent is not None
        began = time.monotonic()
        with pytest.raises(AgentError) as err:
            await agent.request("read_log", rank=7, offset=0)
        took = time.monotonic() - began
        await session.shutdown()
        return str(err.value), took

    message, took = run(main())
    assert "rank 7 does not run on this node" in message and took < 5


# -- restart ----------------------------------------------------------------------------------
def test_a_restart_replaces_the_ranks_and_keeps_the_agents(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> tuple[SessionStatus, dict[int, int]]:
        session = await started(cluster, two_nodes())
        cluster.agents_of(0)[0].exit_rank(0, -9)
        await cluster.settle()
        assert session.state == SessionState.DEGRADED
        await session.restart()
        new_pids = {r.rank: r.pid for a in cluster.agents for r in a.ranks.values()}
        status = session.status()
        await session.shutdown()
        return status, new_pids

    status, new_pids = run(main())
    assert status["state"] == "ready" and status["broken_reason"] == ""
    assert len(cluster.agents) == 2, "a restart with every agent alive starts no new one"
    for agent in cluster.agents:
        kills = [c for c in agent.commands if c["op"] == "kill"]
        assert kills == [{"op": "kill", "ranks": None, "grace": 0.0}]
        assert [r.rank for r in agent.spawned] == [2 * agent.node, 2 * agent.node + 1] * 2
    assert {r["rank"]: r["pid"] for r in status["ranks"]} == new_pids
    assert all(r["state"] == "idle" and r["exit"] is None for r in status["ranks"])
    assert len(kernels.cells) == 4  # host_store and bootstrap, twice


def test_a_restart_after_a_lost_node_starts_fresh_agents(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> SessionStatus:
        session = await started(cluster, two_nodes())
        cluster.agents_of(1)[0].vanish()
        await cluster.settle()
        await session.restart()
        old, new = cluster.agents[:2], cluster.agents[2:]
        assert all(a.exited for a in old) and [a.node for a in new] == [0, 1]
        assert all(not a.exited and len(a.ranks) == 2 for a in new)
        status = session.status()
        await session.shutdown()
        return status

    status = run(main())
    assert status["state"] == "ready" and not any(n["lost"] for n in status["nodes"])
    assert [n["agent_pid"] for n in status["nodes"]] == [a.pid for a in cluster.agents[2:]]


def test_a_failed_restart_leaves_the_session_broken(kernels: KernelStub) -> None:
    cluster = FakeCluster()

    async def main() -> Session:
        session = await started(cluster, SessionSpec(name="again"))
        cluster.script(0).spawn_errors = {0: "RuntimeError: out of file descriptors"}
        with pytest.raises(AgentError, match="out of file descriptors"):
            await session.restart()
        assert session.state == SessionState.BROKEN
        assert session.broken_reason == (
            "its restart, which failed: node 'node0': agent error: RuntimeError: out of "
            "file descriptors"
        )
        await session.shutdown()
        return session

    session = run(main())
    assert_all_stopped(cluster, session)


# -- shutdown ---------------------------------------------------------------------------------
def test_shutdown_stops_every_agent_and_rank(kernels: KernelStub) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> Session:
        session = await started(cluster, two_nodes())
        await session.shutdown()
        await session.shutdown()  # a second call is harmless
        return session

    session = run(main())
    assert_all_stopped(cluster, session)
    for agent in cluster.agents:
        assert agent.commands[-1] == {"op": "shutdown"}
        assert [c["op"] for c in agent.commands].count("shutdown") == 1
    # the ranks' ends were heard, yet a stopped session is not broken
    assert all(r.state == RankState.DEAD for r in session.ranks.values())
    assert session.broken_reason == ""
    with pytest.raises(SessionError, match="was shut down"):
        run(session.restart())


# -- the manager ------------------------------------------------------------------------------
def test_the_manager_starts_a_session_once_and_reports_it(kernels: KernelStub) -> None:
    cluster = FakeCluster()
    manager = SessionManager(timeouts=FAST, launchers=cluster.launcher)
    events: list[ManagerEvent] = []

    async def main() -> None:
        watcher = manager.subscribe()
        request = ShapeRequest(procs=2)
        session, new = await manager.get_or_start("m", request, env={})
        again, new_again = await manager.get_or_start("m", request, env={})
        assert (new, new_again) == (True, False) and again is session
        assert manager.get("m") is session and manager.names() == ["m"]
        await manager.shutdown("m")
        while not watcher.empty():
            events.append(watcher.get_nowait())

    run(main())
    assert len(cluster.agents) == 1 and cluster.agents[0].exited
    kinds = [e["type"] for e in events]
    assert kinds[0] == "progress" and kinds[-1] == "removed"
    ready = [e for e in events if e["type"] == "session" and e["session"]["state"] == "ready"]
    assert ready and ready[0]["session"]["world_size"] == 2
    with pytest.raises(UnknownSession):
        manager.get("m")


def test_the_manager_keeps_no_session_that_failed_to_start() -> None:
    cluster = FakeCluster(versions={"jupyter_dist": "0.0.9"})
    manager = SessionManager(timeouts=FAST, launchers=cluster.launcher)
    with pytest.raises(AgentError, match=f"install jupyter_dist=={__version__} there"):
        run(manager.get_or_start("bad", ShapeRequest(procs=1), env={}))
    assert manager.names() == []
    assert all(a.exited for a in cluster.agents)
    cluster.script(0).versions = {}
    with pytest.raises(UnknownSession):
        manager.get("bad")


def test_nodes_that_report_one_hostname_go_by_the_names_they_were_given(
    kernels: KernelStub,
) -> None:
    """Two nodes whose agents both say ``vm`` (containers, cloned machines) are shown as
    the ssh aliases or host strings the user gave, in the status and in progress."""
    from tests.unit.fake_agent import FakeLauncher

    class Named(FakeLauncher):
        @property
        def label(self) -> str:
            return f"alias{self.node}" if self.node == 0 else "me@vm:2202"

    cluster = FakeCluster(remote=True, host="vm")
    progress: list[str] = []

    def launcher(spec: SessionSpec, node: int) -> Named:
        made = Named(cluster, node)
        cluster.launchers.append(made)
        return made

    async def main() -> SessionStatus:
        session = Session(two_nodes(), timeouts=FAST, env={}, launchers=launcher)
        await session.start(progress.append)
        try:
            return session.status()
        finally:
            await session.shutdown()

    status = run(main())
    assert [a.host for a in cluster.agents] == ["vm", "vm"]  # what the agents report
    assert [n["host"] for n in status["nodes"]] == ["alias0", "me@vm:2202"]
    assert [r["host"] for r in status["ranks"]] == ["alias0"] * 2 + ["me@vm:2202"] * 2
    assert any("node me@vm:2202: agent ready" in p for p in progress), progress


def test_an_ssh_node_is_labelled_as_the_user_wrote_it() -> None:
    from jupyter_dist.control.launchers.local import LocalLauncher
    from jupyter_dist.control.launchers.ssh import SSHLauncher

    assert SSHLauncher(HostSpec("gpu-a")).label == "gpu-a"
    assert SSHLauncher(HostSpec("vm", user="me", port=2202)).label == "me@vm:2202"
    assert LocalLauncher().label is None  # this machine goes by its reported hostname


@dataclass
class RecordingPlacement(Placement):
    """A cluster kind's placement over the fake cluster's launchers, saying what was
    asked of it."""

    cluster: FakeCluster
    calls: list[str] = field(default_factory=list)

    async def place(self, progress: Callable[[str], None], timeout: float) -> None:
        self.calls.append("place")

    def launcher(self, spec: SessionSpec, node: int) -> Launcher:
        return self.cluster.launcher(spec, node)

    async def release(self) -> None:
        self.calls.append("release")

    async def replace_node(
        self, node: int, progress: Callable[[str], None], timeout: float
    ) -> None:
        progress(f"node {node}: another machine")
        self.calls.append(f"replace {node}")


def test_a_cluster_kinds_lost_node_is_replaced_by_its_placement_and_a_restart_releases_it(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)
    made: list[RecordingPlacement] = []

    def placements(spec: SessionSpec, env: Any) -> RecordingPlacement:
        made.append(RecordingPlacement(cluster))
        return made[-1]

    async def main() -> tuple[str, list[str]]:
        session = Session(
            two_nodes(), timeouts=FAST, env={}, launchers=cluster.launcher, placements=placements
        )
        await session.start()
        cluster.agents_of(1)[0].vanish(stderr="Killed")
        await cluster.settle()
        said: list[str] = []
        text = await session.heal(progress=said.append)
        cluster.agents_of(1)[-1].vanish(stderr="Killed")  # lost again: restarted whole
        await cluster.settle()
        await session.restart()
        await session.shutdown()
        return text + "\n" + "\n".join(said), [c for p in made for c in p.calls]

    said, calls = run(main())
    assert "node 1: another machine" in said, said
    assert "ranks 2-3 replaced by fresh rank kernels (node 1 started again)" in said, said
    # the first placement is given back before the restart places the session anew
    assert calls == ["place", "replace 1", "release", "place", "release"], calls


@dataclass
class ResizingPlacement(RecordingPlacement):
    """A placement that holds machines for a resized session, or (``room`` too small)
    says the cluster cannot."""

    room: int = 3
    resizable = True

    async def resize(
        self, spec: SessionSpec, progress: Callable[[str], None], timeout: float
    ) -> None:
        if spec.nodes > self.room:
            raise AgentError(f"the cluster has room for {self.room} nodes")
        running = [a.node for a in self.cluster.live_agents()]
        self.calls.append(f"resize {spec.nodes} with agents on {running}")


def cluster_session(cluster: FakeCluster, placement: RecordingPlacement) -> Session:
    """Two nodes of a rank each, placed by ``placement`` (no listed hosts, as on Ray)."""
    spec = SessionSpec(
        name="fake", nodes=2, procs_per_node=1, device="cpu", backend="gloo", launcher="ray"
    )
    return Session(
        spec, timeouts=FAST, env={}, launchers=cluster.launcher, placements=lambda *_: placement
    )


def test_a_cluster_kinds_resize_holds_new_machines_first_and_gives_removed_ones_back(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)
    placement = ResizingPlacement(cluster)

    async def main() -> list[str]:
        session = cluster_session(cluster, placement)
        await session.start()
        said = [await session.resize([1, 1, 1]), await session.resize([1, 1])]
        assert [len(session.nodes), session.spec.nodes, session.generation] == [2, 2, 2]
        await session.shutdown()
        return said

    said = run(main())
    # the machine is held before node 2's agent starts; given back after it stopped
    assert placement.calls == [
        "place",
        "resize 3 with agents on [0, 1]",
        "resize 2 with agents on [0, 1]",
        "release",
    ], placement.calls
    assert len(cluster.agents_of(2)) == 1 and cluster.agents_of(2)[0].exited
    assert "rank 2 added" in said[0] and "rank 2 removed" in said[1], said


def test_a_grow_whose_new_rank_cannot_start_is_undone_and_tried_again(kernels: KernelStub) -> None:
    """The new rank's spawn fails before any survivor left its group: the resize is undone
    (its node stopped, its machine given back) and says so; the next one works."""
    cluster = FakeCluster(remote=True)
    placement = ResizingPlacement(cluster)
    full = "rank 2: cannot write its connection file: no space left on device in /tmp/jd-1"

    async def main() -> tuple[str, list[Any], str]:
        session = cluster_session(cluster, placement)
        await session.start()
        cluster.script(2).spawn_errors = {2: full}
        with pytest.raises(SessionError) as failed:
            await session.resize([1, 1, 1])
        undone = [session.state, len(session.nodes), sorted(session.ranks), session.generation]
        cluster.script(2).spawn_errors = {}
        said = await session.resize([1, 1, 1])
        await session.shutdown()
        return str(failed.value), undone, said

    failed, undone, said = run(main())
    assert failed.startswith("session 'fake': adding rank 2 failed, so the resize was undone: ")
    assert full in failed and "Its 2 ranks are as they were" in failed, failed
    assert undone == [SessionState.READY, 2, [0, 1], 0], undone
    assert cluster.agents_of(2)[0].exited and "rank 2 added" in said, said
    assert placement.calls[1:4] == [
        "resize 3 with agents on [0, 1]",
        "resize 2 with agents on [0, 1]",  # the added machine given back
        "resize 3 with agents on [0, 1]",
    ], placement.calls


def test_a_heal_whose_spawn_failed_can_be_tried_again(kernels: KernelStub) -> None:
    """The rank a failed heal could not start has no process: the next heal does not wait
    for it to exit, it starts it."""
    cluster = FakeCluster(remote=True)

    async def main() -> tuple[str, SessionState, str]:
        session = await started(cluster, two_nodes())
        cluster.agents_of(1)[0].exit_rank(3, -9)
        await cluster.settle()
        cluster.script(1).spawn_errors = {3: "rank 3: cannot write its connection file"}
        with pytest.raises(AgentError) as failed:
            await session.heal()
        state = session.state
        cluster.script(1).spawn_errors = {}
        said = await asyncio.wait_for(session.heal(), 5)
        await session.shutdown()
        return str(failed.value), state, said

    failed, state, said = run(main())
    assert "rank 3: cannot write its connection file" in failed and state == SessionState.BROKEN
    assert "rank 3 replaced by a fresh rank kernel" in said, said


def test_a_resize_the_cluster_cannot_hold_changes_nothing_and_a_kind_that_cannot_is_named(
    kernels: KernelStub,
) -> None:
    cluster = FakeCluster(remote=True)

    async def main() -> tuple[str, str, SessionState, int]:
        session = cluster_session(cluster, ResizingPlacement(cluster, room=2))
        await session.start()
        with pytest.raises(AgentError) as full:
            await session.resize([1, 1, 1])
        state, nodes = session.state, len(session.nodes)
        await session.shutdown()
        fixed = cluster_session(cluster, RecordingPlacement(cluster))
        await fixed.start()
        with pytest.raises(SpecError) as refused:
            await fixed.resize([1])
        await fixed.shutdown()
        return str(full.value), str(refused.value), state, nodes

    full, refused, state, nodes = run(main())
    assert full == "the cluster has room for 2 nodes"
    assert (state, nodes) == (SessionState.READY, 2)
    assert not cluster.agents_of(2)
    assert refused == (
        "resize: adding or removing nodes of a ray session is not supported; its nodes are "
        "placed when it starts (restart it with --nodes 1)"
    ), refused
