"""The cloud of the autoscaling Ray test: a node provider of Ray's autoscaler that starts
each node it is asked for as ``ray start --address HEAD`` in a network namespace of its
own, added to the test cluster's network then (``netns.add_node``), as a cloud starts a
machine that joins the cluster.

Ray's autoscaler loads it as an ``external`` provider (``provider.module``) and calls it
from its own process (``autoscaler_monitor``); what the provider started is written to
``provider.state_file`` (node id -> namespace index, address, type), so that the test
removes what is left whatever the autoscaler did. The cluster's own nodes are reported as
a cloud reports what it did not start: the head as the head (the autoscaler needs it),
the others as unmanaged (counted, never stopped). A node's status is ``setting-up`` until
its ``ray start`` returned or its raylet runs (``ray start`` gives up after a hard-coded
30 s on a loaded machine while its raylet still comes up), then ``up-to-date``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_UNMANAGED,
    STATUS_SETTING_UP,
    STATUS_UP_TO_DATE,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from tests import netns

#: the first namespace index of an added node (past the cluster's head and workers)
FIRST_INDEX = 10
#: Ray's smallest object store plus a little, as the cluster's nodes have
OBJECT_STORE_BYTES = 80 * 1024 * 1024
#: seconds a node's ``ray start`` gets, tries included
START_TIMEOUT = 300.0


class NamespaceNodeProvider(NodeProvider):  # type: ignore[misc]
    """Nodes as network namespaces of the test network, each running one Ray node.

    ``provider_config``: ``prefix`` and ``bridge_address`` (the network), ``gcs_address``,
    ``temp_root`` (each node's Ray temp folder is under it), ``state_file``,
    ``head_type`` and ``cluster_nodes`` (the addresses of the cluster's nodes, the head
    first).
    """

    def __init__(self, provider_config: Mapping[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self.config = dict(provider_config)
        self.lock = threading.RLock()
        #: node id -> {"index", "address", "tags", "terminated"}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.next_index = FIRST_INDEX
        for i, address in enumerate(self.config["cluster_nodes"]):
            kind = NODE_KIND_HEAD if i == 0 else NODE_KIND_UNMANAGED
            name = f"cluster-{i}"
            tags = {TAG_RAY_NODE_KIND: kind, TAG_RAY_NODE_NAME: name}
            tags |= {TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}
            if i == 0:
                tags[TAG_RAY_USER_NODE_TYPE] = str(self.config["head_type"])
            self.nodes[name] = {"index": -1, "address": address, "tags": tags}
            self.nodes[name]["terminated"] = False

    # -- what the autoscaler asks of a cloud ---------------------------------------------
    def non_terminated_nodes(self, tag_filters: Mapping[str, str]) -> list[str]:
        with self.lock:
            return [
                node_id
                for node_id, node in self.nodes.items()
                if not node["terminated"]
                and all(node["tags"].get(k) == v for k, v in tag_filters.items())
            ]

    def is_running(self, node_id: str) -> bool:
        with self.lock:
            return not self.nodes[node_id]["terminated"]

    def is_terminated(self, node_id: str) -> bool:
        with self.lock:
            return bool(self.nodes[node_id]["terminated"])

    def node_tags(self, node_id: str) -> dict[str, str]:
        with self.lock:
            return dict(self.nodes[node_id]["tags"])

    def set_node_tags(self, node_id: str, tags: Mapping[str, str]) -> None:
        with self.lock:
            self.nodes[node_id]["tags"].update(tags)

    def internal_ip(self, node_id: str) -> str:
        return str(self.nodes[node_id]["address"])

    def external_ip(self, node_id: str) -> str:
        return self.internal_ip(node_id)

    def create_node(
        self, node_config: Mapping[str, Any], tags: Mapping[str, str], count: int
    ) -> dict[str, Any]:
        return self.create_node_with_resources_and_labels(node_config, tags, count, {}, {})

    def create_node_with_resources_and_labels(
        self,
        node_config: Mapping[str, Any],
        tags: Mapping[str, str],
        count: int,
        resources: Mapping[str, float],
        labels: Mapping[str, str],
    ) -> dict[str, Any]:
        made = {}
        for _ in range(count):
            with self.lock:
                index, self.next_index = self.next_index, self.next_index + 1
            kind = str(tags.get(TAG_RAY_USER_NODE_TYPE, "worker"))
            try:
                ns, address = netns.add_node(
                    self.config["prefix"], self.config["bridge_address"], index, f"{kind}{index}"
                )
            except BaseException:
                netns.remove_node(self.config["prefix"], index)  # what it made of it
                raise
            node_id = ns
            with self.lock:
                self.nodes[node_id] = {
                    "index": index,
                    "address": address,
                    "tags": {**tags, TAG_RAY_NODE_STATUS: STATUS_SETTING_UP},
                    "terminated": False,
                }
                self._save()
            threading.Thread(
                target=self._start_ray,
                args=(node_id, ns, address, dict(resources)),
                name=f"ray start {ns}",
                daemon=True,
            ).start()
            made[node_id] = {}
        return made

    def terminate_node(self, node_id: str) -> None:
        with self.lock:
            node = self.nodes[node_id]
            if node["index"] < 0:
                raise ValueError(f"{node_id} is the test cluster's own node")
            node["terminated"] = True
            self._save()
        netns.remove_node(self.config["prefix"], int(node["index"]))

    # -- the machine's start ----------------------------------------------------------------
    def _start_ray(self, node_id: str, ns: str, address: str, resources: dict[str, float]) -> None:
        """``ray start`` of the node until its raylet runs (a failed start whose raylet
        runs is fine; one whose raylet died starts again), then ``up-to-date``."""
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
        temp_dir = Path(self.config["temp_root"]) / ns.rsplit("-", 1)[-1]
        argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "ray.scripts.scripts"]
        argv += ["start", "--disable-usage-stats", "--address", self.config["gcs_address"]]
        argv += ["--node-ip-address", address, "--temp-dir", str(temp_dir)]
        argv += ["--num-cpus", str(int(resources.get("CPU", 1)))]
        argv += ["--num-gpus", str(int(resources.get("GPU", 0)))]
        argv += ["--resources", json.dumps(custom)]
        argv += ["--object-store-memory", str(OBJECT_STORE_BYTES)]
        log = Path(self.config["temp_root"]) / f"{ns}-ray-start.log"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with self.lock:
                if self.nodes[node_id]["terminated"]:
                    return
            with log.open("ab") as out:
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=max(deadline - time.monotonic(), 1),
                    check=False,
                    start_new_session=True,
                )
            if result.returncode == 0 or _raylet_running(ns):
                with self.lock:
                    self.nodes[node_id]["tags"][TAG_RAY_NODE_STATUS] = STATUS_UP_TO_DATE
                return
            netns.kill_netns(ns)  # what the failed start left; then again

    def _save(self) -> None:
        state = {
            node_id: {k: node[k] for k in ("index", "address", "terminated")}
            | {"type": node["tags"].get(TAG_RAY_USER_NODE_TYPE)}
            for node_id, node in self.nodes.items()
            if node["index"] >= 0
        }
        Path(self.config["state_file"]).write_text(json.dumps(state))


def _raylet_running(ns: str) -> bool:
    comms = [netns.read_text(Path(f"/proc/{pid}/comm")) for pid in netns.netns_pids(ns)]
    return "raylet" in comms
