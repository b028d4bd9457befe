"""``--k8s`` sessions owned by a real Jupyter server (token auth on), against the emulated
cluster: a notebook kernel's session outlives the kernel, its status names what it holds on
the cluster, and a server that starts after a killed one deletes the dead owner's Job and
Secret by label, touching nothing else."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_dist.common.ports import free_port
from jupyter_dist.control.launchers import k8s_manifests as m
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

from .cluster import K8sCluster

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.timeout(900)]
NOTEBOOK = "exp/k8s.ipynb"


def k8s_server(cluster: K8sCluster, root: Path, runtime_dir: Path) -> Server:
    server = start_server(
        root,
        root / "config",
        extra_env={
            "JUPYTER_DIST_OUTPUT": "text",
            "JUPYTER_RUNTIME_DIR": str(runtime_dir),
            "KUBECONFIG": str(cluster.kubeconfig),
        },
    )
    server.runtime_dir = runtime_dir
    return server


def objects(cluster: K8sCluster, selector: str) -> list[str]:
    return sorted(
        f"{kind}/{o['metadata']['name']}"
        for kind in ("jobs", "secrets")
        for o in cluster.list(kind, label_selector=selector)
    )


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    stop_servers(started)


def plant(cluster: K8sCluster, owner: m.Owner) -> str:
    """A Secret under ``owner``'s labels, as a session of it leaves one."""
    name = m.object_name("planted")
    labels = m.session_labels("planted", owner)
    cluster.create("secrets", m.secret_manifest(name, "default", labels, owner, ["{}"]))
    return name


def test_a_server_owned_session_outlives_a_kernel_and_a_dead_servers_is_swept(
    k8s_cluster: K8sCluster, servers: list[Server], tmp_path: Path, kernel_name: str
) -> None:
    cluster = k8s_cluster
    root, runtime_dir = tmp_path / "root", tmp_path / "runtime"
    (root / "exp").mkdir(parents=True)
    server = k8s_server(cluster, root, runtime_dir)
    servers.append(server)
    notebook = ServerKernel(server, NOTEBOOK, kernel_name)
    notebook.ok("%load_ext jupyter_dist")
    out = notebook.ok(
        f"%%distributed --k8s --nodes 2 --procs 1 --k8s-callback 127.0.0.1:{free_port()} "
        "--image team/train:1 --k8s-grace 2\n"
        "import os, torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "x = int(os.environ['RANK']) * 10\n"
        "print('sum', t.item(), 'node', os.environ['GROUP_RANK'])\n"
    )
    assert "[rank 0] sum 2.0 node 0" in out and "[rank 1] sum 2.0 node 1" in out, out
    status, listed = server.call("GET", f"{API}/sessions")
    assert status == 200 and len(listed) == 1, listed
    session = listed[0]
    assert (session["state"], session["spec"]["launcher"]) == ("ready", "k8s")
    owner = f"{getpass.getuser()}@{socket.gethostname()}/{server.process.pid}"
    assert session["cluster"] == {
        "kind": "k8s", "address": cluster.url, "owner": owner, "namespace": "default",
        "context": None,
    }  # fmt: skip
    host = m.label_value(socket.gethostname())
    dead = f"{m.OWNER_HOST_LABEL}={host},{m.OWNER_PID_LABEL}={server.process.pid}"
    held = objects(cluster, dead)
    assert len(held) == 2, held  # its Job and its Secret
    # the sidebar's nodes are the pods, by name
    pods = sorted(
        cluster.list("pods", label_selector=f"{m.SESSION_LABEL}={session['name']}"),
        key=lambda p: p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL],
    )
    assert [n["host"] for n in session["nodes"]] == [p["metadata"]["name"] for p in pods]

    # a new kernel process attaches to the session the server owns, its variables there
    notebook.restart()
    notebook.ok("%load_ext jupyter_dist")
    out = notebook.ok("%%distributed\nprint('x is', x)")
    assert "[rank 0] x is 0" in out and "[rank 1] x is 10" in out, out

    # the server is killed: its record names the cluster, the namespace and the owner
    (record_file,) = runtime_dir.glob(f"{RECORD_PREFIX}*.json")
    [recorded] = read_record(record_file).sessions
    assert recorded.cluster is not None
    assert (recorded.cluster.kind, recorded.cluster.owner, recorded.cluster.namespace) == (
        "k8s", owner, "default",
    )  # fmt: skip
    kernels = server_kernels(server)
    notebook.kc.stop_channels()
    kill_server(server)
    for pid in kernels:
        kill_pid(pid)
    # its pods lose their link and exit; what it made stays for the sweep, beside a live
    # owner's (this test process's) that must stay
    job = next(o.split("/")[1] for o in held if o.startswith("jobs/"))
    wait_for(lambda: not any(n.startswith(job) for n in cluster.pod_processes()), 90, "pods exit")
    live = plant(cluster, m.Owner(getpass.getuser(), socket.gethostname(), os.getpid()))
    assert objects(cluster, dead) == held

    # a new server on the same runtime folder sweeps the dead owner's, and only them
    successor = k8s_server(cluster, root, runtime_dir)
    servers.append(successor)
    wait_for(lambda: not objects(cluster, dead), 120, "the sweep of the dead owner's objects")
    assert cluster.get_or_none("secrets", live) is not None
    log = wait_for(
        lambda: (
            "removed what dead server pid" in (text := (root / "server.log").read_text()) and text
        ),
        60,
        "the sweep's log line",
    )
    assert (
        f"removed what dead server pid {server.process.pid} left on the Kubernetes cluster"
    ) in log
    cluster.delete("secrets", live)
