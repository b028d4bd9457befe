"""Nodes a cluster manager already chose: detected from its environment variables.

SkyPilot sets ``SKYPILOT_NODE_IPS`` (one address a line, head node first) and
``SKYPILOT_NUM_GPUS_PER_NODE`` on every node of a cluster; a notebook running there
gets those nodes without ``--hosts``.

Slurm sets ``SLURM_JOB_NODELIST`` (a compressed host list such as ``gpu[01-04,07]``) in
every ``salloc``/``sbatch`` allocation, and ``SLURM_GPUS_ON_NODE`` or
``SLURM_GPUS_PER_NODE`` (``4`` or ``a100:4``) when it holds GPUs; the list is expanded by
``scontrol show hostnames``, the same way job scripts do it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from jupyter_dist.common.hosts import HostSpec, no_option, parse_host
from jupyter_dist.errors import SpecError

SCONTROL_TIMEOUT = 30.0
# one entry of SLURM_GPUS_PER_NODE: "4", "a100:4", "gpu:a100:4"
_GPU_ENTRY = re.compile(r"^(?:[A-Za-z0-9_.-]+:){0,2}(?P<count>\d+)$")


@dataclass(frozen=True)
class DetectedCluster:
    source: str
    hosts: tuple[HostSpec, ...]
    gpus_per_node: int | None


def split_allocation(
    cluster: DetectedCluster, nodes: int | None
) -> tuple[tuple[HostSpec, ...], tuple[HostSpec, ...]]:
    """The first ``nodes`` of an allocation's nodes for the session, and the rest, which a
    lost node's heal or a resize may move to (all of them, none left, without ``nodes``)."""
    if nodes is None or nodes == len(cluster.hosts):
        return cluster.hosts, ()
    if not 1 <= nodes <= len(cluster.hosts):
        names = ",".join(str(h) for h in cluster.hosts)
        raise SpecError(
            f"--nodes {nodes}: the {cluster.source} allocation has {len(cluster.hosts)} "
            f"node(s) ({names}); expected 1 to {len(cluster.hosts)}"
        )
    return cluster.hosts[:nodes], cluster.hosts[nodes:]


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


def detect_slurm(env: Mapping[str, str]) -> DetectedCluster | None:
    """The nodes of the Slurm allocation this process runs in; None outside one."""
    variable = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), None)
    if variable is None:
        return None
    names = expand_nodelist(env[variable].strip(), variable)
    hosts = tuple(parse_host(name, variable) for name in names)
    return DetectedCluster("Slurm", hosts, slurm_gpus_per_node(env))


def slurm_gpus_per_node(env: Mapping[str, str]) -> int | None:
    """GPUs per node of the allocation: ``SLURM_GPUS_ON_NODE``, else ``SLURM_GPUS_PER_NODE``.

    ``SLURM_GPUS_PER_NODE`` may name types (``a100:4``, or ``a100:2,v100:2``: 4 in all).
    None when neither is set or the count is 0.
    """
    for variable in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        raw = env.get(variable, "").strip()
        if raw:
            total = sum(_gpu_count(entry, variable, raw) for entry in raw.split(","))
            return total or None
    return None


def _gpu_count(entry: str, variable: str, raw: str) -> int:
    match = _GPU_ENTRY.match(entry.strip())
    if match is None:
        raise SpecError(
            f"{variable}={raw!r}: expected a GPU count like 4 or type:count like a100:4"
        )
    return int(match.group("count"))


def expand_nodelist(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """``gpu[01-02],cpu7`` -> ``["gpu01", "gpu02", "cpu7"]``.

    A plain comma-separated list needs no help; one with ranges goes through
    ``scontrol show hostnames``, which knows every form Slurm writes.
    """
    no_option(variable, "node list", nodelist)  # it goes on scontrol's command line
    if "[" not in nodelist:
        names = [name.strip() for name in nodelist.split(",") if name.strip()]
    else:
        names = _scontrol_hostnames(nodelist, variable)
    if not names:
        raise SpecError(f"{variable}={nodelist!r}: expected one or more node names")
    return names


def _scontrol_hostnames(nodelist: str, variable: str) -> list[str]:
    where = f"{variable}={nodelist!r}: cannot expand it with `scontrol show hostnames`"
    try:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=SCONTROL_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise SpecError(
            f"{where}: scontrol is not on PATH; load the Slurm client (module load slurm) or "
            "pass --hosts"
        ) from None
    except subprocess.TimeoutExpired:
        raise SpecError(
            f"{where}: no answer within {SCONTROL_TIMEOUT:.0f} s; can scontrol read the "
            "cluster's slurm.conf (SLURM_CONF)?"
        ) from None
    except OSError as err:
        raise SpecError(f"{where}: {err}") from None
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        raise SpecError(f"{where}: {detail[0]}")
    return result.stdout.split()
