"""Sessions on Ray owned by a real Jupyter server (token auth on), in the head node's
namespace as a session owner must be: a notebook kernel's session outlives the kernel,
and a server that starts after a killed one removes what the dead one held on the cluster,
touching nothing else."""

from __future__ import annotations

import getpass
import json
import os
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_dist.server.process_records import RECORD_PREFIX, read_record
from tests.integration.server_process import (
    API,
    Server,
    kill_pid,
    kill_server,
    server_kernels,
    start_server,
    stop_servers,
    wait_for,
)
from tests.integration.test_server_kernels import ServerKernel

from .cluster import START_TIMEOUT, RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 900)]
NOTEBOOK = "exp/ray.ipynb"
#: seconds for what a dead owner held to be gone from the cluster
GONE_S = 180.0


def ray_server(cluster: RayCluster, root: Path, runtime_dir: Path) -> Server:
    """A server on the head node (its Ray drivers need a raylet on their address), with
    the cluster's environment, listening on the head's address; its notebook kernels too,
    so that this process reaches them."""
    head = cluster.network.addresses[0]
    server = start_server(
        root,
        root / "config",
        args=(f"--KernelManager.ip={head}",),
        extra_env={"JUPYTER_DIST_OUTPUT": "text", "JUPYTER_RUNTIME_DIR": str(runtime_dir)},
        argv_prefix=cluster.driver_argv([]),
        ip=head,
        base_env=cluster.driver_env(),
    )
    server.runtime_dir = runtime_dir
    return server


def cluster_names(cluster: RayCluster) -> dict[str, list[str]]:
    """Every actor named in the ``jupyter_dist`` namespace, and every placement group not
    removed, by name."""
    result = cluster.run_driver(
        textwrap.dedent(
            """
            import json, ray
            from ray.util import placement_group_table
            ray.init(namespace="jupyter_dist", logging_level="ERROR")
            actors = sorted(ray.util.list_named_actors(all_namespaces=False))
            groups = sorted(
                str(g.get("name", "")) for g in placement_group_table().values()
                if g.get("state") != "REMOVED"
            )
            print(json.dumps({"actors": actors, "groups": groups}))
            """
        )
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found: dict[str, list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def under(names: dict[str, list[str]], prefix: str) -> list[str]:
    return [n for kind in ("actors", "groups") for n in names[kind] if n.startswith(prefix)]


#: a detached actor and placement group under each prefix, as a driver that did not end
#: (or Ray's own cleanup that has not run yet) would leave them
PLANT = """
import json, sys, ray
from ray.util.placement_group import placement_group
ray.init(namespace="jupyter_dist", logging_level="ERROR")

@ray.remote(num_cpus=0)
class Left:
    def ping(self):
        return "pong"

for prefix in sys.argv[1:]:
    actor = Left.options(name=prefix + "planted/0", lifetime="detached").remote()
    assert ray.get(actor.ping.remote(), timeout=120) == "pong"
    group = placement_group([{"worker1": 0.01}], name=prefix + "planted", lifetime="detached")
    ray.get(group.ready(), timeout=120)
print("planted")
"""


def plant(cluster: RayCluster, *prefixes: str) -> None:
    result = cluster.run_driver(PLANT.replace("sys.argv[1:]", json.dumps(list(prefixes))))
    assert result.returncode == 0 and "planted" in result.stdout, result.stdout + result.stderr


@pytest.fixture
def servers(ray_nodes: RayCluster, tmp_path: Path, kernel_name: str) -> Iterator[list[Server]]:
    """The servers a test starts, in one runtime folder; stopped (or killed) whatever
    happens, with every notebook kernel they started."""
    started: list[Server] = []
    yield started
    stop_servers(started)


def test_a_server_owned_ray_session_outlives_a_kernel_and_a_dead_servers_is_swept(
    ray_nodes: RayCluster, servers: list[Server], tmp_path: Path, kernel_name: str
) -> None:
    root, runtime_dir = tmp_path / "root", tmp_path / "runtime"
    (root / "exp").mkdir(parents=True)
    server = ray_server(ray_nodes, root, runtime_dir)
    servers.append(server)
    notebook = ServerKernel(server, NOTEBOOK, kernel_name)
    kernel_pids = [notebook.pid()]
    notebook.ok("%load_ext jupyter_dist")
    out = notebook.ok(
        "%%distributed --ray --nodes 2 --procs 2\n"
        "import os, torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "x = int(os.environ['RANK']) * 10\n"
        "print('sum', t.item(), 'node', os.environ['GROUP_RANK'])\n"
    )
    assert "[ranks 0-1] sum 4.0 node 0" in out and "[ranks 2-3] sum 4.0 node 1" in out, out
    # which cluster it joined, and where its address came from (the server's environment)
    joined = f"joined the Ray cluster at {ray_nodes.address} (from the RAY_ADDRESS environment"
    assert joined in out, out
    status, listed = server.call("GET", f"{API}/sessions")
    assert status == 200 and len(listed) == 1, listed
    session = listed[0]
    assert (session["state"], session["world_size"], session["spec"]["launcher"]) == (
        "ready", 4, "ray",
    )  # fmt: skip
    owner = f"{getpass.getuser()}@{socket.gethostname()}/{server.process.pid}"
    assert session["cluster"] == {"kind": "ray", "address": ray_nodes.address, "owner": owner}
    prefix = f"jupyter_dist/{owner}/"
    held = under(cluster_names(ray_nodes), prefix)
    name = session["name"]
    assert sorted(held) == [f"{prefix}{name}", f"{prefix}{name}/0", f"{prefix}{name}/1"], held
    rank_pids = [r["pid"] for r in session["ranks"]]

    # a new kernel process attaches to the session the server owns, its variables there
    notebook.restart()
    kernel_pids.append(notebook.pid())
    assert kernel_pids[1] != kernel_pids[0]
    notebook.ok("%load_ext jupyter_dist")
    out = notebook.ok("%%distributed\nprint('x is', x)")
    for rank in range(4):
        assert f"[rank {rank}] x is {rank * 10}" in out, out
    status, again = server.call("GET", f"{API}/sessions/{name}")
    assert status == 200 and [r["pid"] for r in again["ranks"]] == rank_pids

    # the server is killed: its record stays, naming the cluster and the owner
    (record_file,) = runtime_dir.glob(f"{RECORD_PREFIX}*.json")
    [recorded] = read_record(record_file).sessions
    assert recorded.cluster is not None
    assert (recorded.cluster.address, recorded.cluster.owner) == (ray_nodes.address, owner)
    kernels = server_kernels(server)
    notebook.kc.stop_channels()
    kill_server(server)
    for pid in kernels:  # the notebook kernels are the server's children, not the session's
        kill_pid(pid)
    # what the dead server's session held goes (its driver saw its stdin end); then, so
    # that the sweep has something to remove whatever Ray did, leftovers under the dead
    # owner's prefix, and some under a live owner's (this test's) that must stay
    wait_for(
        lambda: not under(cluster_names(ray_nodes), prefix), GONE_S, "the session's names", poll=2
    )
    live = f"jupyter_dist/{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}/"
    plant(ray_nodes, prefix, live)
    names = cluster_names(ray_nodes)
    assert sorted(under(names, prefix)) == [f"{prefix}planted", f"{prefix}planted/0"]
    assert sorted(under(names, live)) == [f"{live}planted", f"{live}planted/0"]

    # a new server on the same runtime folder sweeps the dead owner's prefix, and only it
    successor = ray_server(ray_nodes, root, runtime_dir)
    servers.append(successor)

    def swept() -> bool:
        return not under(cluster_names(ray_nodes), prefix)

    wait_for(swept, GONE_S, f"the sweep of {prefix}", poll=2)
    names = cluster_names(ray_nodes)
    assert sorted(under(names, live)) == [f"{live}planted", f"{live}planted/0"], names
    log = wait_for(
        lambda: (
            "removed what dead server pid" in (text := (root / "server.log").read_text()) and text
        ),
        60,
        "the sweep's log line",
        poll=2,
    )
    assert f"removed what dead server pid {server.process.pid} left on the Ray cluster" in log
    assert f"{prefix}planted/0" in log
    assert not list(runtime_dir.glob(f"{RECORD_PREFIX}*{server.process.pid}.json"))

    # the live owner's leftovers are this test's to remove
    result = ray_nodes.run_driver(
        "from jupyter_dist.control.launchers.ray_driver import main; "
        f"raise SystemExit(main(['--sweep', {live!r}, '--address', {ray_nodes.address!r}]))"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not under(cluster_names(ray_nodes), live)
