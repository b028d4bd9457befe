"""``python -m tests.ray.autoscaler_monitor``: Ray's autoscaler for the autoscaling test.

Runs Ray's own autoscaler monitor (``ray.autoscaler._private.monitor.Monitor``, as a head
started with ``--autoscaling-config`` runs it, and as KubeRay's autoscaler container does)
with the test's configuration, whose provider is ``autoscale_provider`` (network
namespaces for machines), as Ray 2.60 ships it: it reports no node types to the GCS.
`cluster_config` makes the report a deployment may write (``ClusterConfig`` under
``__autoscaler_cluster_config``, read by ``ray._private.state.state.get_cluster_config``),
which the test writes itself for the check of what no node type holds; the test removes
that report and the autoscaler's status when it stops this process.

    python -m tests.ray.autoscaler_monitor --gcs-address HEAD:6379 --config C.yaml --logs-dir D
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cluster_config(config: Mapping[str, Any]) -> bytes:
    """The worker node types of an autoscaling configuration, as Ray's ClusterConfig."""
    from ray.core.generated.autoscaler_pb2 import ClusterConfig, NodeGroupConfig

    out = ClusterConfig()
    for name, kind in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        group = NodeGroupConfig(name=name, min_count=int(kind.get("min_workers", 0)))
        group.max_count = int(kind.get("max_workers", -1))
        for key, value in kind.get("resources", {}).items():
            group.resources[key] = int(value)
        out.node_group_configs.append(group)
    return bytes(out.SerializeToString())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ray.autoscaler_monitor")
    parser.add_argument("--gcs-address", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--logs-dir", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, filename=str(Path(args.logs_dir) / "monitor.log"), force=True
    )
    from ray.autoscaler._private.monitor import Monitor

    monitor = Monitor(args.gcs_address, args.config, log_dir=args.logs_dir)
    print("autoscaler: running", flush=True)
    monitor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
