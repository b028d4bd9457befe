"""An autoscaling Ray cluster: the test cluster with Ray's own autoscaler running beside it
(``autoscaler_monitor``), whose cloud starts a GPU node in a network namespace of its own
on demand (``autoscale_provider``). As Ray 2.60 ships it, the autoscaler reports no node
types: a request no live node holds is asked of it and waited for, saying so; the stop
button ends that wait leaving nothing; the next such request starts its session on the
node the autoscaler added. Where node types are reported (the test writes the report a
deployment may), what no node type could hold fails at once naming the node types.

The autoscaler runs for this module alone: the report of node types and its status are
removed from the GCS when it stops, and the node it added is stopped, so the other Ray
tests see the cluster they always did."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import netns

from .autoscaler_monitor import cluster_config
from .cluster import RayCluster
from .notebook_kernel import NetnsKernel, Reply, notebook_kernel
from .test_ray_sessions import WHERE, left_on_cluster, nothing_left, where

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
NODE_TYPE = "gpu_worker"
#: the GPU node type: 1 GPU of accelerator type T4 (as Ray's GPU detection labels a
#: machine's, `accelerator_type:T4`), 2 CPUs; at most one such node
GPU_NODE = {"CPU": 2, "GPU": 1, "accelerator_type:T4": 1}
#: asks what only the autoscaler's GPU node type holds: a GPU of type T4
GPU_FLAGS = "--ray --nodes 1 --procs 1 --ray-gpus 1 --ray-resources accelerator_type=T4"
#: what the cell says while it waits, on Ray 2.60 whose autoscaler reports no node types
WAITING = (
    "waiting for Ray's autoscaler to add a node for 1 GPU, 1 CPU, 0.001 accelerator_type:T4 "
    "(node types not reported; adding"
)

#: what ``ray up`` fills into the configuration it gives the autoscaler: nothing to copy or
#: run on the nodes (the cloud starts Ray on them itself)
RAY_UP_FIELDS: dict[str, object] = {
    "file_mounts": {},
    "file_mounts_sync_continuously": False,
    "cluster_synced_files": [],
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
}
#: what the GCS holds of an autoscaler (as a driver in the head's namespace): whether node
#: types are reported, and the addresses of the live nodes
GCS_VIEW = """
import json, ray, ray._raylet as r
from ray.experimental.internal_kv import _internal_kv_get
ray.init(logging_level="ERROR", log_to_driver=False)
types = _internal_kv_get(r.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY,
                         namespace=r.GCS_AUTOSCALER_STATE_NAMESPACE)
alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
print(json.dumps({"types": bool(types), "alive": alive}))
"""
#: whether the session's driver sees an autoscaler (its status fresh, and not that of the
#: read-only mirror a head started by hand runs)
SEES_AUTOSCALER = """
import ray
from jupyter_dist.control.launchers.ray_autoscale import read_autoscaler
ray.init(logging_level="ERROR", log_to_driver=False)
print(read_autoscaler() is not None)
"""
#: the node types reported to the GCS as a deployment may (the autoscalers of Ray 2.60
#: do not): a serialized ClusterConfig, in place of HEX
REPORT = """
import ray, ray._raylet as r
from ray.experimental.internal_kv import _internal_kv_put
ray.init(logging_level="ERROR", log_to_driver=False)
_internal_kv_put(r.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, bytes.fromhex("HEX"),
                 overwrite=True, namespace=r.GCS_AUTOSCALER_STATE_NAMESPACE)
"""
#: the autoscaler's report and status removed from the GCS, as if it never ran
FORGET = """
import ray, ray._raylet as r
from ray.experimental.internal_kv import _internal_kv_del
ray.init(logging_level="ERROR", log_to_driver=False)
_internal_kv_del(r.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, namespace=r.GCS_AUTOSCALER_STATE_NAMESPACE)
_internal_kv_del("__autoscaling_status")
"""


@dataclass(frozen=True)
class Autoscaling:
    """The running autoscaler: its process and the file its cloud lists its nodes in."""

    process: subprocess.Popen[bytes]
    state_file: Path
    logs: Path
    config: dict[str, Any]

    def nodes(self) -> dict[str, dict[str, object]]:
        """The nodes the cloud started: namespace -> index, address, type, terminated."""
        text = netns.read_text(self.state_file)
        found: dict[str, dict[str, object]] = json.loads(text) if text else {}
        return found


def gcs_view(cluster: RayCluster) -> dict[str, object]:
    result = cluster.run_driver(GCS_VIEW)
    assert result.returncode == 0, result.stderr[-3000:]
    view: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return view


@pytest.fixture(scope="module")
def autoscaler(
    ray_nodes: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Autoscaling]:
    folder = tmp_path_factory.mktemp("autoscaler")
    net = ray_nodes.network
    config = {
        "cluster_name": "jupyter-dist-test",
        "max_workers": 1,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 60,  # the test stops the node itself
        "provider": {
            "type": "external",
            "module": "tests.ray.autoscale_provider.NamespaceNodeProvider",
            "disable_node_updaters": True,  # the cloud starts Ray on its machines
            "worker_liveness_check": False,  # a loaded machine's raylet may be slow
            "prefix": net.prefix,
            "bridge_address": net.bridge_address,
            "gcs_address": ray_nodes.address,
            "temp_root": str(ray_nodes.temp_root),
            "state_file": str(folder / "nodes.json"),
            "head_type": "head",
            "cluster_nodes": list(net.addresses),
        },
        "auth": {},
        **RAY_UP_FIELDS,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {}, "node_config": {}, "max_workers": 0},
            NODE_TYPE: {
                "resources": GPU_NODE,
                "node_config": {},
                "min_workers": 0,
                "max_workers": 1,
            },
        },
    }
    (folder / "config.yaml").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "tests.ray.autoscaler_monitor"]
    argv += ["--gcs-address", ray_nodes.address, "--config", str(folder / "config.yaml")]
    argv += ["--logs-dir", str(folder)]
    env = ray_nodes.driver_env(
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    with (folder / "monitor.out").open("ab") as out:
        process = subprocess.Popen(
            argv,  # on this machine, as a cloud's autoscaler beside the cluster: it makes
            # namespaces, and reaches the GCS over the network
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Autoscaling(process, folder / "nodes.json", folder, config)
    try:
        stop_mirror(ray_nodes)
        deadline = time.monotonic() + 120
        while not sees_autoscaler(ray_nodes):  # its first status written over the mirror's
            assert process.poll() is None, netns.tail(folder / "monitor.out")
            assert time.monotonic() < deadline, netns.tail(folder / "monitor.out")
            time.sleep(1)
        yield running
    finally:
        stop_autoscaler(ray_nodes, running)


def stop_mirror(cluster: RayCluster) -> None:
    """End the read-only mirror of the nodes that ``ray start --head`` runs on the head
    where no autoscaling configuration was given: it writes the autoscaler's status key
    too, every 5 s, and a cluster with an autoscaler has only the autoscaler writing it
    (``ray start --head --autoscaling-config`` runs the autoscaler in its place). The other
    Ray tests see no autoscaler either way."""
    for pid in cluster.pids(0):
        cmdline = netns.read_text(Path(f"/proc/{pid}/cmdline")).replace("\0", " ")
        if "autoscaler/_private/monitor.py" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def sees_autoscaler(cluster: RayCluster) -> bool:
    result = cluster.run_driver(SEES_AUTOSCALER)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1] == "True"


def stop_autoscaler(cluster: RayCluster, running: Autoscaling) -> None:
    """The autoscaler stopped, the nodes its cloud started stopped (their Ray processes
    first asked to end, so the GCS hears of it) and removed, its report and status gone
    from the GCS; until the cluster is what it was."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.process.pid, signal.SIGTERM)
    try:
        running.process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()
    prefix = cluster.network.prefix
    for node in running.nodes().values():
        ns = f"{prefix}-n{node['index']}"
        for pid in netns.netns_pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while netns.netns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        netns.remove_node(prefix, int(str(node["index"])))
    forgot = cluster.run_driver(FORGET)
    assert forgot.returncode == 0, forgot.stderr[-3000:]
    want = sorted(cluster.network.addresses)
    deadline = time.monotonic() + 120
    while (view := gcs_view(cluster)) != {"types": False, "alive": want}:
        assert time.monotonic() < deadline, f"the cluster is not as it was: {view}"
        time.sleep(1)


@pytest.fixture(scope="module")
def kernel(
    ray_nodes: RayCluster, autoscaler: Autoscaling, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NetnsKernel]:
    with notebook_kernel(ray_nodes, tmp_path_factory.mktemp("nb")) as running:
        assert running.run("%load_ext jupyter_dist").ok
        yield running


def run_and_stop_at(kernel: NetnsKernel, code: str, seen: str, timeout: float = 240) -> Reply:
    """Run ``code`` as a cell and press the stop button (interrupt the kernel) once its
    output holds ``seen``; what it showed."""
    msg_id = kernel.kc.execute(code)
    parts: list[str] = []
    stopped = False
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "".join(parts)
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1)
        except Exception:  # queue.Empty: nothing yet
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            parts.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            parts.append(content.get("data", {}).get("text/plain", "") + "\n")
        elif kind == "error":
            parts.append(f"{content.get('ename')}: {content.get('evalue')}\n")
        elif kind == "status" and content["execution_state"] == "idle":
            break
        if not stopped and seen in "".join(parts):
            kernel.km.interrupt_kernel()
            stopped = True
    reply = kernel.kc.get_shell_msg(timeout=60)
    return Reply(reply["content"]["status"] == "ok", "".join(parts))


def test_a_gpu_request_no_live_node_holds_is_asked_of_the_autoscaler_and_starts_there(
    ray_nodes: RayCluster, autoscaler: Autoscaling, kernel: NetnsKernel
) -> None:
    # Ray 2.60 as shipped: an autoscaler runs, and it reports no node types
    assert not gcs_view(ray_nodes)["types"], "node types are reported before the test did"
    # a T4 GPU: no live node has one; asked of the autoscaler, stopped while it waits
    stopped = run_and_stop_at(kernel, f"%%distributed {GPU_FLAGS} --session up\npass", WAITING)
    assert not stopped.ok, stopped.text
    assert "no node can hold it now: asking Ray's autoscaler for 1 bundle" in stopped.text
    assert nothing_left(ray_nodes, timeout=60) == ""  # no placement group, no driver

    # asked again: the session starts on the node the autoscaler added for it
    reply = kernel.run(
        f"%%distributed {GPU_FLAGS} --ray-timeout 400 --session up\n{WHERE}", timeout=480
    )
    assert reply.ok, reply.text
    added = [n for n in autoscaler.nodes().values() if not n["terminated"]]
    assert [n["type"] for n in added] == [NODE_TYPE], autoscaler.nodes()
    ranks = where(reply.text)
    assert list(ranks) == [0], reply.text
    # MASTER_ADDR is node 0's address as Ray knows it; CUDA_VISIBLE_DEVICES Ray's GPU
    assert ranks[0][3] == added[0]["address"], (ranks, added)
    assert ranks[0][2] == "0" and ranks[0][4] == "1", ranks
    kernel.run("%dist shutdown --session up")
    assert not any(left_on_cluster(ray_nodes).values())

    # where the node types are reported, what no node type could ever hold fails at once,
    # naming the ask and the node types, and nothing is added for it
    report = REPORT.replace("HEX", cluster_config(autoscaler.config).hex())
    result = ray_nodes.run_driver(report)
    assert result.returncode == 0, result.stderr[-3000:]
    reply = kernel.run("%%distributed --ray --nodes 1 --procs 1 --ray-resources TPU=1 "
                       "--session never\npass")  # fmt: skip
    assert not reply.ok
    assert "cannot place 1 bundle of 1 CPU, 1 TPU (STRICT_SPREAD" in reply.text, reply.text
    assert "nor with every node Ray's autoscaler can add;" in reply.text, reply.text
    assert (
        f"its node types: {NODE_TYPE} (1 GPU, 2 CPUs, 1 accelerator_type:T4; at most 1)"
        in reply.text
    ), reply.text
    assert len(autoscaler.nodes()) == 1, "a node was added for what no node type holds"
