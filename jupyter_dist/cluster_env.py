"""Nodes a cluster manager already chose: detected from its environment variables.

SkyPilot sets ``SKYPILOT_NODE_IPS`` (one address a line, head node first) and
``SKYPILOT_NUM_GPUS_PER_NODE`` on every node of a cluster; a notebook running there
gets those nodes without ``--hosts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jupyter_dist.errors import SpecError
from jupyter_dist.hosts import HostSpec, parse_host


@dataclass(frozen=True)
class DetectedCluster:
    source: str
    hosts: tuple[HostSpec, ...]
    gpus_per_node: int | None


def detect_skypilot(env: Mapping[str, str]) -> DetectedCluster | None:
    ips = env.get("SKYPILOT_NODE_IPS", "").split()
    if not ips:
        return None
    hosts = tuple(parse_host(ip, "SKYPILOT_NODE_IPS") for ip in ips)
    raw = env.get("SKYPILOT_NUM_GPUS_PER_NODE", "").strip()
    if raw and not raw.isdigit():
        raise SpecError(f"SKYPILOT_NUM_GPUS_PER_NODE={raw!r}: expected a whole number")
    gpus = int(raw) if raw and int(raw) > 0 else None
    return DetectedCluster("SkyPilot", hosts, gpus)
