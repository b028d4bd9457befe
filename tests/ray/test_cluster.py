"""The Ray cluster fixture is real: three nodes on separate addresses, fake GPUs that Ray
hands out per node, and token authentication that refuses a driver without the token."""

from __future__ import annotations

import json
import os
import textwrap
import urllib.error
import urllib.request
from typing import Any

import psutil
import pytest

from tests.netns import NETNS_DIR

from .cluster import GPUS_PER_WORKER, HOSTS, START_TIMEOUT, RayCluster

#: the first test's time includes starting the cluster (up to START_TIMEOUT)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 240)]


def driver_json(cluster: RayCluster, code: str, **env: str | None) -> Any:
    """Run ``code`` as a driver; the JSON it prints on its last line."""
    result = cluster.run_driver(textwrap.dedent(code), **env)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_three_nodes_alive_with_their_resources(ray_nodes: RayCluster) -> None:
    nodes = driver_json(
        ray_nodes,
        """
        import json, ray
        from ray.util.state import list_nodes
        ray.init(logging_level="ERROR")
        gcs = {n["NodeManagerAddress"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        state = sorted(n.node_ip for n in list_nodes() if n.state == "ALIVE")
        print(json.dumps({"gcs": gcs, "state": state}))
        """,
    )
    addresses = ray_nodes.network.addresses
    assert sorted(nodes["gcs"]) == sorted(addresses)
    assert nodes["state"] == sorted(addresses)  # the state API, through the dashboard
    head = nodes["gcs"][addresses[0]]
    assert head.get("GPU", 0) == 0
    for host, address in zip(HOSTS[1:], addresses[1:], strict=True):
        resources = nodes["gcs"][address]
        assert resources["GPU"] == GPUS_PER_WORKER
        assert resources[host] == 1
        assert not {h for h in HOSTS if h != host} & set(resources)


PLACE_ACTORS = """
import json, os, socket, ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init(logging_level="ERROR")
pg = placement_group([{"GPU": %(gpus)d}] * 2, strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=120)

@ray.remote(num_cpus=0, num_gpus=%(gpus)d)
class Probe:
    def where(self, head):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((head, 9))  # no packet: only picks the source address
            source = s.getsockname()[0]
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "source_ip": source,
            "netns_inode": os.stat("/proc/self/ns/net").st_ino,
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

actors = [
    Probe.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i
        )
    ).remote()
    for i in range(2)
]
seen = ray.get([a.where.remote(%(head)r) for a in actors], timeout=120)
bundles = ray.util.placement_group_table(pg)["bundles_to_node_id"]
node_ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
for a in actors:
    ray.kill(a)
remove_placement_group(pg)
print(json.dumps({"seen": seen, "bundles": {str(k): node_ips[v] for k, v in bundles.items()}}))
"""


def test_strict_spread_places_one_bundle_of_gpus_per_worker_node(ray_nodes: RayCluster) -> None:
    net = ray_nodes.network
    code = PLACE_ACTORS % {"gpus": GPUS_PER_WORKER, "head": net.addresses[0]}
    placed = driver_json(ray_nodes, code)

    workers = sorted(net.addresses[1:])
    assert sorted(placed["bundles"].values()) == workers  # one bundle on each worker node
    inodes = {
        os.stat(NETNS_DIR / ns).st_ino: a
        for ns, a in zip(net.namespaces, net.addresses, strict=True)
    }
    for index, seen in enumerate(placed["seen"]):
        address = placed["bundles"][str(index)]
        # the actor runs on its bundle's node, in that node's namespace, on its address
        assert seen["node_ip"] == seen["source_ip"] == address
        assert inodes[seen["netns_inode"]] == address
        # the node's 4 GPUs, all given to this actor, and what CUDA sees is what Ray gave
        assert sorted(seen["gpu_ids"]) == [str(g) for g in range(GPUS_PER_WORKER)]
        assert seen["cuda"] == ",".join(seen["gpu_ids"])


REFUSED = """
import ray
try:
    ray.init(logging_level="ERROR")
    print("CONNECTED", ray.cluster_resources())
except Exception as exc:
    print("REFUSED", type(exc).__name__, exc)
"""


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"RAY_AUTH_TOKEN": "0" * 64}, id="wrong-token"),
        pytest.param({"RAY_AUTH_TOKEN": None, "RAY_AUTH_MODE": None}, id="no-token"),
        pytest.param({"RAY_AUTH_TOKEN": None, "RAY_AUTH_MODE": "disabled"}, id="auth-off"),
    ],
)
def test_driver_without_the_token_is_refused(
    ray_nodes: RayCluster, env: dict[str, str | None]
) -> None:
    # A refused driver retries for gcs_rpc_server_reconnect_timeout_s (60 s): not that long.
    result = ray_nodes.run_driver(REFUSED, RAY_gcs_rpc_server_reconnect_timeout_s="10", **env)
    out = result.stdout + result.stderr
    assert "CONNECTED" not in out, out
    # refused by the cluster for its credentials, not for another reason
    assert "InvalidAuthToken" in out or "Unauthenticated" in out, out


def test_dashboard_refuses_a_request_without_the_token(ray_nodes: RayCluster) -> None:
    url = f"{ray_nodes.dashboard_url}/api/v0/nodes"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
    with pytest.raises(urllib.error.HTTPError) as refused:
        direct.open(url, timeout=60)
    assert refused.value.code in (401, 403)

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ray_nodes.token}"})
    with direct.open(request, timeout=60) as response:
        assert response.status == 200


def test_cluster_processes_are_no_descendants_of_the_test_process(ray_nodes: RayCluster) -> None:
    # Leak checks that walk this process's children must not see the nodes' daemons.
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    theirs = {pid for i in range(len(HOSTS)) for pid in ray_nodes.pids(i)}
    assert theirs
    assert not ours & theirs
