"""Ray's autoscaler as a session's driver sees it: whether the cluster has one, the node
types it can add, and what it says it is adding.

A request no live node can hold is not refused on a cluster with an autoscaler (KubeRay,
``ray up``, a cloud's): a placement group that waits is how Ray asks its autoscaler for
nodes, and the driver waits for it (``--ray-timeout``), saying what it waits for. Only a
request that no node type could ever hold fails at once, naming the node types.

Where Ray says it (`read_autoscaler`):

* the node types: the cluster configuration Ray's autoscaler reports to the GCS (each
  node group's resources and most nodes: ``ray._private.state.state.get_cluster_config``,
  which Ray Data reads too); an autoscaler that does not report it (Ray's v1 autoscaler)
  leaves them unknown, and then no request is refused for want of a node type;
* the nodes of each type running and being added: autoscaler v2's cluster status
  (``ray.autoscaler.v2.sdk.get_cluster_status``), else the status Ray's v1 autoscaler
  writes into the GCS every few seconds (``__autoscaling_status``, what ``ray status``
  reads); the mirror a plain ``ray start --head`` runs (node types named ``node_<id>``)
  is no autoscaler, and neither is a status older than `STATUS_FRESH_S`.

Part of the session's driver process (``ray_driver``): Ray is imported inside functions;
`never` and `waiting_text` are plain functions of what was read.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.control.launchers.ray_cluster import bundle_text, fits, infeasible

#: seconds after which the v1 autoscaler's status is taken as that of one no longer there
#: (it writes it every 5 s)
STATUS_FRESH_S = 60.0
#: Ray's v1 autoscaler's status in the GCS's key-value store
STATUS_KEY = "__autoscaling_status"
#: the node types Ray's read-only mirror makes up, one a node (`format_readonly_node_type`)
_MIRROR_TYPE = re.compile(r"node_[0-9a-f]{16,}")


@dataclass(frozen=True)
class NodeType:
    """One kind of node the autoscaler can add: ``max_count`` nodes at most (-1: no bound)."""

    name: str
    resources: Mapping[str, float]
    max_count: int


@dataclass(frozen=True)
class Autoscaler:
    """What the cluster's autoscaler says: its node types (empty: not reported), the nodes
    of each type that run and those it is adding (empty: not said)."""

    types: tuple[NodeType, ...] = ()
    running: Mapping[str, int] = field(default_factory=dict)
    adding: Mapping[str, int] = field(default_factory=dict)


def read_autoscaler() -> Autoscaler | None:
    """The cluster's autoscaler as the GCS tells of it, or None where it has none."""
    types = _node_types()
    counts = _v2_counts()
    if counts is None:
        counts = _v1_counts()
    if counts is None and not types:
        return None
    running, adding = counts or ({}, {})
    return Autoscaler(types=types, running=running, adding=adding)


def _node_types() -> tuple[NodeType, ...]:
    """The node groups of the cluster configuration the autoscaler reported to the GCS."""
    from ray._private.state import state

    try:
        config = state.get_cluster_config()
    except Exception:
        return ()
    if config is None:
        return ()
    return tuple(
        NodeType(
            name=str(group.name),
            resources={str(k): float(v) for k, v in group.resources.items()},
            max_count=int(group.max_count),
        )
        for group in config.node_group_configs
    )


def _v2_counts() -> tuple[dict[str, int], dict[str, int]] | None:
    """Autoscaler v2's nodes by type, running and being added; None without it."""
    try:
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        if not is_autoscaler_v2(fetch_from_server=True):
            return None
        status = get_cluster_status(ray.get_runtime_context().gcs_address)
    except Exception:
        return None
    running: dict[str, int] = {}
    adding: dict[str, int] = {}
    for node in [*status.active_nodes, *status.idle_nodes]:
        running[node.ray_node_type_name] = running.get(node.ray_node_type_name, 0) + 1
    for node in status.pending_nodes:
        adding[node.ray_node_type_name] = adding.get(node.ray_node_type_name, 0) + 1
    for launch in status.pending_launches:
        name = launch.ray_node_type_name
        adding[name] = adding.get(name, 0) + int(launch.count)
    return running, adding


def _v1_counts() -> tuple[dict[str, int], dict[str, int]] | None:
    """What Ray's v1 autoscaler last wrote into the GCS, read by `v1_counts`."""
    from ray.experimental.internal_kv import _internal_kv_get

    status: Any = None
    with contextlib.suppress(Exception):
        status = json.loads(_internal_kv_get(STATUS_KEY) or b"null")
    return v1_counts(status, time.time()) if isinstance(status, dict) else None


def v1_counts(
    status: Mapping[str, Any], now: float
) -> tuple[dict[str, int], dict[str, int]] | None:
    """The nodes by type running and being added, from the v1 autoscaler's status; None
    where it is no autoscaler (the read-only mirror of a cluster started by hand) or its
    status is older than `STATUS_FRESH_S` (it is gone)."""
    report = status.get("autoscaler_report")
    written = status.get("time")
    if not isinstance(report, dict) or not isinstance(written, (int, float)):
        return None
    if now - written > STATUS_FRESH_S:
        return None
    running = {str(k): int(v) for k, v in (report.get("active_nodes") or {}).items()}
    adding = {str(k): int(v) for k, v in (report.get("pending_launches") or {}).items()}
    for pending in report.get("pending_nodes") or []:
        if isinstance(pending, (list, tuple)) and len(pending) >= 2:
            adding[str(pending[1])] = adding.get(str(pending[1]), 0) + 1
    names = [*running, *adding]
    if names and all(_MIRROR_TYPE.fullmatch(name) for name in names):
        return None  # `ray start --head`'s mirror: every node a type of its own
    return running, adding


def never(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    nodes: Sequence[Mapping[str, Any]],
    scaler: Autoscaler,
) -> str | None:
    """Why no node the cluster has or its autoscaler could add can ever hold the bundles,
    or None (also where the node types are not known: the autoscaler may have one)."""
    if not scaler.types:
        return None
    could = [dict(n) for n in nodes if n.get("Alive")]
    for kind in scaler.types:
        more = len(bundles)
        if kind.max_count >= 0:
            more = min(more, max(kind.max_count - scaler.running.get(kind.name, 0), 0))
        could += [{"Alive": True, "Resources": dict(kind.resources)}] * more
    return infeasible(bundles, strategy, could)


def types_text(types: Sequence[NodeType]) -> str:
    """``gpu_worker (1 GPU, 4 CPUs; at most 2), cpu_worker (8 CPUs; no bound)``."""
    return ", ".join(
        f"{t.name} ({bundle_text(_shown(t.resources))}; "
        f"{'no bound' if t.max_count < 0 else f'at most {t.max_count}'})"
        for t in types
    )


def _shown(resources: Mapping[str, float]) -> dict[str, float]:
    """What a node type holds, without what every node has (memory, object store)."""
    return {
        k: v
        for k, v in resources.items()
        if k not in ("memory", "object_store_memory") and not k.startswith("node:")
    }


def waiting_text(
    bundles: Sequence[Mapping[str, float]],
    nodes: Sequence[Mapping[str, Any]],
    scaler: Autoscaler,
) -> str:
    """``waiting for Ray's autoscaler to add a node for 1 GPU, 1 CPU (node type
    gpu_worker, 0 of 2 running)``: the bundles no live node can hold, and for each the
    node types that could."""
    totals = [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive")]
    wanted: list[Mapping[str, float]] = []
    for bundle in bundles:
        if not any(fits(bundle, t) for t in totals) and bundle not in wanted:
            wanted.append(bundle)
    if not wanted:  # the live nodes could hold each: they are busy, or held apart
        wanted = list({bundle_text(b): b for b in bundles}.values())
    parts = []
    for bundle in wanted:
        kinds = [t for t in scaler.types if fits(bundle, t.resources)]
        if kinds:
            how = "; ".join(_type_count(t, scaler) for t in kinds)
        elif scaler.types:
            how = "no node type holds it alone"
        else:
            adding = ", ".join(f"{k} {v}" for k, v in sorted(scaler.adding.items()) if v)
            how = "node types not reported; adding " + (adding or "none yet")
        parts.append(f"a node for {bundle_text(bundle)} ({how})")
    return "waiting for Ray's autoscaler to add " + " and ".join(parts)


def _type_count(kind: NodeType, scaler: Autoscaler) -> str:
    running = scaler.running.get(kind.name, 0)
    of = f"{running} of {kind.max_count} running" if kind.max_count >= 0 else f"{running} running"
    adding = scaler.adding.get(kind.name, 0)
    return f"node type {kind.name}, {of}" + (f", {adding} being added" if adding else "")
