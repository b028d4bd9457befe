"""Sessions on a real multi-node Ray cluster (``%%distributed --ray``), from a real notebook
kernel in the head's namespace: placement, the GPUs Ray gives, gloo across nodes, state,
interrupts, faults, cleanup, and what crosses the network."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jupyter_dist.settings import INTERRUPT_ACK_VAR
from tests.fault_flows import ddp_goes_on_bitwise, hang_is_freed, resize_two_three_two
from tests.integration.rank_lines import with_start

from .cluster import RayCluster
from .notebook_kernel import NetnsKernel, notebook_kernel
from .wire_capture import captured

pytestmark = [pytest.mark.slow, pytest.mark.ray]

#: prints, per rank: its address as Ray knows its node, pid, CUDA_VISIBLE_DEVICES,
#: MASTER_ADDR and an all_reduce of rank+1 over the session
WHERE = (
    "import os, torch, torch.distributed as dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('where', os.environ['GLOO_SOCKET_IFNAME'], os.getpid(), "
    "os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['MASTER_ADDR'], int(t.item()))\n"
)

#: what this project left on the cluster: named actors and live placement groups in its
#: namespace (run as a driver in the head's namespace)
LEFT_ON_CLUSTER = """
import json, ray
from ray.util import placement_group_table
ray.init(namespace="jupyter_dist", logging_level="ERROR", log_to_driver=False)
groups = [g["name"] for g in placement_group_table().values()
          if g["name"].startswith("jupyter_dist/") and g["state"] != "REMOVED"]
print(json.dumps({"actors": ray.util.list_named_actors(), "groups": groups}))
"""


def left_on_cluster(cluster: RayCluster) -> dict[str, list[str]]:
    result = cluster.run_driver(LEFT_ON_CLUSTER)
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def session_groups(cluster: RayCluster, session: str) -> list[str]:
    """Session ``session``'s live placement groups (its own, and any a resize made)."""
    groups = left_on_cluster(cluster)["groups"]
    return [g for g in groups if g.endswith(f"/{session}") or f"/{session}/" in g]


def session_processes(cluster: RayCluster) -> list[str]:
    """This project's processes on the cluster's nodes (dial-back, agents, ranks, actors)."""
    found = []
    for node in range(len(cluster.network.hosts)):
        for pid in cluster.pids(node):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            text = cmdline.decode(errors="replace")
            if "jupyter_dist" in text or "RayNodeHost" in text:
                found.append(f"{cluster.network.hosts[node]}: {pid} {text[:120]}")
    return found


def nothing_left(cluster: RayCluster, timeout: float) -> str:
    """Empty once nothing of a session is left on the cluster within ``timeout``; else what is."""
    deadline = time.monotonic() + timeout
    while True:
        on_cluster = left_on_cluster(cluster)
        processes = session_processes(cluster)
        if not any(on_cluster.values()) and not processes:
            return ""
        if time.monotonic() > deadline:
            return f"left on the cluster: {on_cluster}; processes: {processes}"
        time.sleep(1)


#: a cell that says it runs on each rank (a file ``<mark>-<rank>``; the nodes share this
#: machine's files), then sleeps
RUNNING = "import os, time\nopen({mark!r} + '-' + os.environ['RANK'], 'w').close()\ntime.sleep(600)"


def when_running(mark: Path, ranks: int, fault: Callable[[], None]) -> threading.Thread:
    """A started thread that calls ``fault`` once the `RUNNING` cell with ``mark`` runs on
    each of ``ranks`` ranks (it gives up after two minutes: see `fault_at`)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(Path(f"{mark}-{r}").exists() for r in range(ranks)):
                Path(f"{mark}-fault").write_text(str(time.monotonic()))
                fault()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def fault_at(mark: Path) -> float:
    """When `when_running` made its fault (``time.monotonic()``)."""
    made = Path(f"{mark}-fault")
    assert made.exists(), f"the cell did not run on every rank within two minutes ({mark})"
    return float(made.read_text())


def where(text: str) -> dict[int, list[str]]:
    """Rank -> the words of its ``where`` line."""
    return {r: lines[0].split()[1:] for r, lines in with_start(text, "where ").items() if lines}


@pytest.fixture(scope="module")
def kernel(
    ray_nodes: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NetnsKernel]:
    with notebook_kernel(ray_nodes, tmp_path_factory.mktemp("nb")) as running:
        assert running.run("%load_ext jupyter_dist").ok
        yield running


def test_one_actor_and_agent_per_node_with_the_gpus_ray_gave_and_state_kept(
    ray_nodes: RayCluster, kernel: NetnsKernel
) -> None:
    # bundles of 2 GPUs: only the worker nodes have GPUs, one bundle each (STRICT_SPREAD)
    reply = kernel.run(f"%%distributed --ray --nodes 2 --procs 2 --ray-gpus 2 --session a\n{WHERE}")
    assert reply.ok, reply.text
    try:
        # start-up said where each node went and which GPUs Ray gave it
        given = dict(re.findall(r"node \d: Ray node (\S+) \(\S+\), GPUs (\S+)", reply.text))
        workers = set(ray_nodes.network.addresses[1:])
        assert set(given) == workers, reply.text
        seen = where(reply.text)
        assert sorted(seen) == [0, 1, 2, 3], reply.text
        nodes = {}
        for rank, (_ifname, pid, visible, _master, total) in seen.items():
            assert total == "10"  # 1+2+3+4 across both nodes
            node = next(i for i in (1, 2) if int(pid) in ray_nodes.pids(i))
            nodes.setdefault(node, []).append(rank)
            assert visible == given[ray_nodes.network.addresses[node]]  # Ray's, untouched
        assert sorted(map(sorted, nodes.values())) == [[0, 1], [2, 3]]
        # node 0 (ranks 0, 1) holds the rendezvous, at its address as Ray knows it
        node0 = next(n for n, ranks in nodes.items() if 0 in ranks)
        assert {w[3] for w in seen.values()} == {ray_nodes.network.addresses[node0]}
        # one actor per node on the cluster, named after the session
        actors = left_on_cluster(ray_nodes)["actors"]
        assert len([a for a in actors if a.endswith(("/a/0", "/a/1"))]) == 2, actors
        # the next cell runs in the same ranks
        reply = kernel.run("%%distributed --session a\nprint('kept', t.item() * 2)")
        assert reply.ok, reply.text
        assert {r: x for r, x in with_start(reply.text, "kept").items()} == {
            r: ["kept 20.0"] for r in range(4)
        }
        status = kernel.run("%dist status --session a")
        assert status.ok, status.text
        for address in workers:
            assert address in status.text, status.text
    finally:
        kernel.run("%dist shutdown --session a")
    assert not nothing_left(ray_nodes, 30), nothing_left(ray_nodes, 0)


def test_a_session_outlives_an_interrupt_a_hang_a_lost_rank_and_a_resize(
    ray_nodes: RayCluster, kernel: NetnsKernel, tmp_path: Path
) -> None:
    """One session through the faults that cost only what they touched: an interrupt; a
    one-rank barrier hang stopped (the rank freed); a DDP loop that lost rank 1, healed and
    synced, bitwise as an unbroken run; a resize to a third Ray node and back
    (`tests.fault_flows`)."""

    def cell(code: str) -> tuple[bool, str]:
        reply = kernel.run(code, stop_on_error=False)  # the next cell comes at once
        return reply.ok, reply.text

    # a rank that does not take an interrupt is looked at after 3 s (10 by default)
    assert kernel.run(f"import os\nos.environ[{INTERRUPT_ACK_VAR!r}] = '3'").ok
    started = kernel.run("%%distributed --ray --nodes 2 --procs 1 --session b\nx = 1")
    assert kernel.run(f"os.environ.pop({INTERRUPT_ACK_VAR!r})").ok
    assert started.ok, started.text
    try:
        mark = tmp_path / "running"
        stop = when_running(mark, 2, kernel.km.interrupt_kernel)
        began = time.monotonic()
        reply = kernel.run(f"%%distributed --session b\n{RUNNING.format(mark=str(mark))}")
        stop.join()
        fault_at(mark)
        assert not reply.ok
        # the stop button SIGINTs the notebook kernel's process group: the session's Ray
        # driver is not in it, and the ranks' SIGINT is not blocked (a Ray actor blocks it)
        assert "interrupted on ranks 0-1" in reply.text, reply.text
        assert "time.sleep(600)" in reply.text
        assert time.monotonic() - began < 120
        reply = kernel.run("%%distributed --session b\nprint('after', x)")
        assert reply.ok, reply.text
        assert with_start(reply.text, "after") == {0: ["after 1"], 1: ["after 1"]}
        # the stop button again, rank 0 in a barrier: freed, both ranks kept
        hang_is_freed(cell, "b", kernel.km.interrupt_kernel, tmp_path / "hang")
        # a rank that dies fails the cell naming it; the next cell replaces it alone, on
        # its Ray node, and the DDP loop goes on bitwise after a sync
        ddp_goes_on_bitwise(cell, "b")
        # a third node on the Ray node the session does not use, then back to two
        machines = set(re.findall(r"node \d: Ray node (\S+)", started.text))
        assert len(machines) == 2, started.text
        grew, _ = resize_two_three_two(cell, "b")
        third = re.findall(r"node 2: Ray node (\S+)", grew)
        assert third and third[0] in set(ray_nodes.network.addresses) - machines, grew
        deadline = time.monotonic() + 30  # Ray removes a placement group in the background
        while len(groups := session_groups(ray_nodes, "b")) != 1:
            assert time.monotonic() < deadline, f"the grown node's group is still held: {groups}"
            time.sleep(0.5)
    finally:
        kernel.run("%dist shutdown --session b")
    assert not nothing_left(ray_nodes, 30), nothing_left(ray_nodes, 0)


def test_two_sessions_side_by_side_and_a_rerun_of_the_same_name(
    ray_nodes: RayCluster, kernel: NetnsKernel
) -> None:
    # each session takes 2 of each worker's 4 GPUs
    flags = "--ray --nodes 2 --procs 1 --ray-gpus 2"
    try:
        for name in ("c1", "c2"):
            reply = kernel.run(f"%%distributed {flags} --session {name}\n{WHERE}")
            assert reply.ok, reply.text
        for name in ("c1", "c2"):
            reply = kernel.run(f"%%distributed --session {name}\n{WHERE}")
            assert {w[4] for w in where(reply.text).values()} == {"3"}, reply.text
        # every GPU is held now: a third waits, says why, and gives up at its timeout
        reply = kernel.run(f"%%distributed {flags} --ray-timeout 4 --session c3\npass")
        assert not reply.ok
        assert "waited 4 s for 2 bundles of 2 GPUs, 1 CPU" in reply.text, reply.text
        assert "waiting for 2 bundles" in reply.text  # progress while it waited
        # shut down and started again under the same name: the old actors freed the GPUs
        kernel.run("%dist shutdown --session c1")
        reply = kernel.run(f"%%distributed {flags} --session c1\n{WHERE}")
        assert reply.ok, reply.text
    finally:
        kernel.run("%dist shutdown --all")
    assert not nothing_left(ray_nodes, 30), nothing_left(ray_nodes, 0)


def test_an_infeasible_request_names_the_ask_and_the_cluster_and_leaves_nothing(
    ray_nodes: RayCluster, kernel: NetnsKernel
) -> None:
    began = time.monotonic()
    reply = kernel.run("%%distributed --ray --nodes 3 --procs 1 --ray-gpus 4 --session d\npass")
    assert not reply.ok
    assert time.monotonic() - began < 60
    assert "cannot place 3 bundles of 4 GPUs, 1 CPU (STRICT_SPREAD" in reply.text, reply.text
    assert "the cluster has 3 nodes" in reply.text
    for address in ray_nodes.network.addresses[1:]:
        assert f"{address} (4 GPUs, 4 CPUs)" in reply.text, reply.text
    # --gpus on nodes without CUDA: placed, then refused by the agents, naming the CPU option
    reply = kernel.run("%%distributed --ray --nodes 2 --gpus 1 --session d\npass")
    assert not reply.ok
    assert "--procs" in reply.text, reply.text
    assert not nothing_left(ray_nodes, 30), nothing_left(ray_nodes, 0)
    # and the name is free for a good start
    reply = kernel.run("%%distributed --ray --nodes 2 --procs 1 --session d\nprint('fine')")
    assert reply.ok, reply.text
    kernel.run("%dist shutdown --session d")


def test_what_crosses_the_network_between_nodes_is_not_plain_text(
    ray_nodes: RayCluster, kernel: NetnsKernel, tmp_path: Path
) -> None:
    flags = "--ray --nodes 2 --procs 1 --ray-gpus 1 --session w"  # on the two worker nodes
    assert kernel.run(f"%%distributed {flags}\npass").ok
    try:
        with captured(ray_nodes, [1, 2], tmp_path) as seen:
            reply = kernel.run(
                "%%distributed --session w\n"
                "code_canary_in_clear = 'kept'\nprint('printed' + '-canary-' + 'text')\n"
                # the ranks' own torch.distributed traffic is theirs, plain as under
                # torchrun: it shows that the capture sees what goes between the nodes
                "import torch.distributed as dist\n"
                "said = ['gloo' + '-plain-' + 'control']\n"
                "dist.broadcast_object_list(said, src=0)\n"
            )
            assert reply.ok, reply.text
            pushed = kernel.run(
                "secret_value = 'pushed' + '-canary'\n%dist push secret_value --session w"
            )
            assert pushed.ok, pushed.text
    finally:
        kernel.run("%dist shutdown --session w")
    wire = seen()
    assert b"gloo-plain-control" in wire  # the capture saw traffic between the nodes
    for clear in (b"code_canary_in_clear", b"printed-canary-text", b"execute_request"):
        assert clear not in wire
    assert b"pushed-canary" not in wire


def test_the_notebook_kernel_killed_leaves_nothing_on_the_cluster(
    ray_nodes: RayCluster, tmp_path: Path
) -> None:
    """Killed (SIGKILL) while a cell runs on both nodes: the driver, the actors, their
    agents and ranks go, and the placement group with them."""
    with notebook_kernel(ray_nodes, tmp_path) as doomed:
        assert doomed.run("%load_ext jupyter_dist").ok
        reply = doomed.run("%%distributed --ray --nodes 2 --procs 1 --ray-gpus 1\nx = 1")
        assert reply.ok, reply.text
        assert session_processes(ray_nodes)
        mark = tmp_path / "running"
        doomed.kc.execute("%%distributed\n" + RUNNING.format(mark=str(mark)))
        deadline = time.monotonic() + 120
        while not all(Path(f"{mark}-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the cell did not start on both nodes"
            time.sleep(0.05)
        doomed.kill()
        assert not nothing_left(ray_nodes, 30), nothing_left(ray_nodes, 0)


#: per rank: an all_reduce of rank+1 over the session's group, its generation, and what
#: it kept of ``kept``
SUM = (
    "import torch, torch.distributed as dist, jupyter_dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('sum', int(t.item()), 'generation', jupyter_dist.info().generation, "
    "'kept', globals().get('kept'))\n"
)


def session_state(kernel: NetnsKernel, name: str, want: str, within: float = 30) -> str:
    """Session ``name``'s state as its owner, the notebook kernel, has it, once it is
    ``want`` or ``within`` seconds passed."""
    reply = kernel.run(
        "import time as _t\n"
        "from jupyter_dist.notebook.owners import embedded_owner as _owner\n"
        f"_end = _t.monotonic() + {within}\n"
        f"while (_s := _owner().manager.get({name!r}).status()['state']) != {want!r}:\n"
        "    if _t.monotonic() > _end: break\n"
        "    _t.sleep(0.2)\n"
        "print('state', _s)\n"
    )
    assert reply.ok, reply.text
    return reply.text.split("state ")[-1].strip()


@pytest.mark.timeout(900)  # the node starts again: `ray start` and its registration
def test_a_lost_ray_node_fails_the_cell_naming_it_and_heal_places_it_again(
    ray_nodes: RayCluster, kernel: NetnsKernel, tmp_path: Path
) -> None:
    """Last: the node is started again (it is also what the healed node is placed on)."""
    flags = "--ray --nodes 2 --procs 1 --ray-gpus 1 --session h"  # on the two worker nodes
    reply = kernel.run(f"%%distributed {flags}\nimport os\nkept = 40 + int(os.environ['RANK'])")
    assert reply.ok, reply.text
    ranks = where(kernel.run(f"%%distributed --session h\n{WHERE}").text)
    lost = next(r for r, w in ranks.items() if int(w[1]) in ray_nodes.pids(2))
    victim = ray_nodes.network.addresses[2]
    mark = tmp_path / "running"
    killer = when_running(mark, 2, lambda: ray_nodes.kill_node(2))
    restarted = False
    try:
        reply = kernel.run(
            f"%%distributed --session h\n{RUNNING.format(mark=str(mark))}", timeout=120
        )
        failed_after = time.monotonic() - fault_at(mark)
        assert not reply.ok
        assert victim in reply.text, reply.text
        # within 10 s where nothing else runs (README); the bound leaves a loaded
        # machine its slack
        assert failed_after < 30, failed_after
        killer.join()
        assert session_state(kernel, "h", "degraded") == "degraded"
        ray_nodes.restart_node(2)  # a node with room for the lost bundle (the only one)
        restarted = True
        began = time.monotonic()
        healed = kernel.run("%dist heal --session h", timeout=300)
        took = time.monotonic() - began
        assert healed.ok, healed.text
        said = " ".join(healed.text.split())
        assert f"rank {lost} replaced by a fresh rank kernel (node " in said, said
        assert re.search(
            rf"node \d: Ray node {re.escape(victim)} \(\S+\), GPUs \S+ in place of", said
        ), said
        back = kernel.run(f"%%distributed --session h\n{SUM}")
        assert back.ok, back.text
        kept = {r: lines[0] for r, lines in with_start(back.text, "sum").items()}
        assert kept == {
            r: f"sum 3 generation 1 kept {None if r == lost else 40 + r}" for r in (0, 1)
        }, (back.text, took)
        assert session_state(kernel, "h", "ready", within=0) == "ready"
    finally:
        killer.join()
        kernel.run("%dist shutdown --session h")
        if not restarted:
            ray_nodes.restart_node(2)
    assert not nothing_left(ray_nodes, 30), nothing_left(ray_nodes, 0)
