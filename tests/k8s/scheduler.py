"""The scheduler's part of the emulated cluster: which fake node a pod goes to, or why none,
and (``Scheduler``) the binding or the Unschedulable condition and Event, through the API.

Plays kube-scheduler's default filters in its order, each node stopping at the first that
fails: NodeAffinity (``nodeSelector`` only), NodeResourcesFit (``cpu``, ``memory`` and every
extended resource by its name, ``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
``amd.com/gpu``...; a container's requests, else its limits) and InterPodAffinity (required
pod anti-affinity on ``kubernetes.io/hostname``). `fits_all` asks whether a gang of pods
fits at once (the queue controller's question). A pod that fits nowhere gets the
scheduler's message (``0/2 nodes are available: 2 Insufficient nvidia.com/gpu.
preemption: ...``). Of the rest, the first node in name order wins (no scoring).

Does not play: node affinity expressions, taints and tolerations, pod affinity (only
anti-affinity), topology spread constraints, priorities and preemption (the message says
what preemption would find, nothing is evicted), init containers' requests, schedulers
other than the default (a pod's ``schedulerName`` is not looked at).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tests.k8s.job_controller import iso
from tests.k8s.kinds import matches_label_selector
from tests.k8s.kube_client import ApiClient

__all__ = [
    "RESOURCES",
    "NodeShape",
    "Scheduler",
    "choose_node",
    "fits_all",
    "parse_quantity",
    "pod_requests",
]

log = logging.getLogger("k8s.scheduler")

#: what NodeResourcesFit counts besides extended resources (any ``DOMAIN/NAME``)
RESOURCES = ("cpu", "memory")
HOSTNAME = "kubernetes.io/hostname"

_SUFFIXES = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``16Gi``, ``1e3``) as a number."""
    text = str(value).strip()
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", text)
    if m is None or m[2] not in ("", *_SUFFIXES):
        raise ValueError(
            f"quantity {value!r}: expected a number with an optional suffix"
            f" ({', '.join(_SUFFIXES)})"
        )
    return float(m[1]) * _SUFFIXES.get(m[2], 1.0)


@dataclasses.dataclass(frozen=True)
class NodeShape:
    """One fake node: its name and what it offers: ``gpus`` of ``nvidia.com/gpu`` and
    ``extended`` other device plugins' resources, ``(name, count)`` (MIG slices,
    ``amd.com/gpu``)."""

    name: str
    cpus: int
    memory: str
    gpus: int
    extended: tuple[tuple[str, int], ...] = ()

    def allocatable(self) -> dict[str, str]:
        offered = {"cpu": str(self.cpus), "memory": self.memory, "pods": "110"}
        if self.gpus:
            offered["nvidia.com/gpu"] = str(self.gpus)
        for name, count in self.extended:
            offered[name] = str(count)
        return offered


def _counted(name: str) -> bool:
    return name in RESOURCES or "/" in name


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """What a pod asks of a node: per resource, the sum over its containers of the request,
    or of the limit where no request is given (as the API server defaults requests)."""
    total: defaultdict[str, float] = defaultdict(float)
    for container in pod.get("spec", {}).get("containers", []):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, amount in asked.items():
            if _counted(name):
                total[name] += parse_quantity(amount)
    return dict(total)


def _live(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def _anti_affinity_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    affinity = pod.get("spec", {}).get("affinity") or {}
    anti = affinity.get("podAntiAffinity") or {}
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return [t for t in terms if t.get("topologyKey") == HOSTNAME]


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector object (matchLabels, matchExpressions) against labels."""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return matches_label_selector(labels, ",".join(parts))


def _failure(
    pod: Mapping[str, Any], node: NodeShape, bound: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Why ``pod`` cannot go to ``node`` (empty: it can), as the scheduler words it."""
    wanted = pod.get("spec", {}).get("nodeSelector") or {}
    labels = {HOSTNAME: node.name, "kubernetes.io/os": "linux"}
    if any(labels.get(k) != v for k, v in wanted.items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    on_node = [p for p in bound if p.get("spec", {}).get("nodeName") == node.name and _live(p)]
    used: defaultdict[str, float] = defaultdict(float)
    for other in on_node:
        for name, amount in pod_requests(other).items():
            used[name] += amount
    offered = {k: parse_quantity(v) for k, v in node.allocatable().items()}
    insufficient = [
        f"Insufficient {name}"
        for name, amount in sorted(pod_requests(pod).items())
        if amount > 0 and used[name] + amount > offered.get(name, 0.0)
    ]
    if insufficient:
        return insufficient
    namespace = pod.get("metadata", {}).get("namespace")
    for term in _anti_affinity_terms(pod):
        namespaces = term.get("namespaces") or [namespace]
        for other in on_node:
            other_meta = other.get("metadata", {})
            if other_meta.get("namespace") in namespaces and _selector_matches(
                term.get("labelSelector") or {}, other_meta.get("labels") or {}
            ):
                return ["node(s) didn't match pod anti-affinity rules"]
    return []


def choose_node(
    pod: Mapping[str, Any], nodes: Iterable[NodeShape], bound: Sequence[Mapping[str, Any]]
) -> tuple[str | None, str]:
    """The node for ``pod`` given the pods already ``bound`` to nodes, and an empty message;
    or None and the FailedScheduling message."""
    nodes = list(nodes)
    reasons: Counter[str] = Counter()
    preemption: Counter[str] = Counter()
    for node in nodes:
        why = _failure(pod, node, bound)
        if not why:
            return node.name, ""
        reasons.update(why)
        helpless = why[0].startswith("node(s) didn't match Pod's node affinity")
        preemption[
            "Preemption is not helpful for scheduling."
            if helpless
            else "No preemption victims found for incoming pod."
        ] += 1
    n = len(nodes)
    listed = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    victims = ", ".join(f"{count} {text}" for text, count in sorted(preemption.items()))
    return None, (
        f"0/{n} nodes are available: {listed}. preemption: 0/{n} nodes are available: {victims}"
    )


def fits_all(
    pods: Sequence[Mapping[str, Any]],
    nodes: Iterable[NodeShape],
    bound: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]] | None, str]:
    """Whether ``pods`` all fit at once beside the pods already ``bound``, placed one after
    another as the scheduler would: ``bound`` with them on their nodes and an empty
    message; else None and the scheduler's message for the first that does not fit."""
    nodes = list(nodes)
    placed = list(bound)
    for pod in pods:
        node, message = choose_node(pod, nodes, placed)
        if node is None:
            return None, message
        placed.append({**pod, "spec": {**pod.get("spec", {}), "nodeName": node}})
    return placed, ""


class Scheduler:
    """Binds waiting pods through the API (``spec.nodeName``), or marks them Unschedulable
    with the scheduler's message and a FailedScheduling Event (once per message)."""

    def __init__(self, client: ApiClient, nodes: list[NodeShape], node_ips: dict[str, str]) -> None:
        self.client = client
        self.nodes = nodes
        self.node_ips = node_ips
        self._reported: dict[str, str] = {}  # pod uid -> the last message written

    async def schedule(self, pods: list[dict[str, Any]]) -> None:
        bound = [p for p in pods if p.get("spec", {}).get("nodeName")]
        waiting = sorted(
            (
                p
                for p in pods
                if not p.get("spec", {}).get("nodeName")
                and p.get("status", {}).get("phase", "Pending") == "Pending"
            ),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        for pod in waiting:
            meta = pod["metadata"]
            node, message = choose_node(pod, self.nodes, bound)
            if node is None:
                if self._reported.get(meta["uid"]) != message:
                    self._reported[meta["uid"]] = message
                    log.info(
                        "scheduler: %s/%s unschedulable: %s",
                        meta["namespace"],
                        meta["name"],
                        message,
                    )
                    await self.client.patch(
                        "pods",
                        meta["name"],
                        meta["namespace"],
                        {
                            "status": {
                                "phase": "Pending",
                                "conditions": [
                                    {
                                        "type": "PodScheduled",
                                        "status": "False",
                                        "reason": "Unschedulable",
                                        "message": message,
                                        "lastProbeTime": None,
                                        "lastTransitionTime": iso(time.time()),
                                    }
                                ],
                            }
                        },
                        status=True,
                    )
                    await self.client.event(
                        pod, "Warning", "FailedScheduling", message, "default-scheduler"
                    )
                continue
            log.info("scheduler: bind %s/%s to %s", meta["namespace"], meta["name"], node)
            await self.client.patch(
                "pods", meta["name"], meta["namespace"], {"spec": {"nodeName": node}}
            )
            await self.client.patch(
                "pods",
                meta["name"],
                meta["namespace"],
                {
                    "status": {
                        "phase": "Pending",
                        "hostIP": self.node_ips[node],
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "True",
                                "lastTransitionTime": iso(time.time()),
                            }
                        ],
                    }
                },
                status=True,
            )
            await self.client.event(
                pod,
                "Normal",
                "Scheduled",
                f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
                "default-scheduler",
            )
            pod.setdefault("spec", {})["nodeName"] = node
            bound.append(pod)
            self._reported.pop(meta["uid"], None)
