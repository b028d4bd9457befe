"""What a dead server's sessions held on a cluster manager, removed by a later server.

A session on Ray names everything it holds there (its placement group and node actors)
under ``jupyter_dist/OWNER/``, OWNER being the owning process (``user@host/pid``), and its
record (`server.process_records`) keeps the cluster's address and that owner. Ray removes
a dead driver's actors itself, but not a detached one, nor what a driver that did not end
still holds; so a starting server that finds a dead server's record runs the Ray driver's
sweep (``python -m jupyter_dist.control.launchers.ray_driver --sweep PREFIX --address A``)
once for each cluster and owner the record names, in a child process bounded in time, and
logs what it removed. Only names under that owner's prefix are touched.

A session on Kubernetes labels its Job and Secret with its owner's host and pid; the sweep
there (``python -m jupyter_dist.control.launchers.k8s_sweep --owner OWNER --namespace NS``)
deletes the objects with that owner's labels in the session's namespace, and nothing else.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence

from jupyter_dist.control.launchers.ray import DRIVER_MODULE
from jupyter_dist.control.launchers.ray_cluster import owner_prefix
from jupyter_dist.server.process_records import ClusterRecord, ServerRecord

#: the Kubernetes sweep, run as ``python -m`` this module
K8S_SWEEP_MODULE = "jupyter_dist.control.launchers.k8s_sweep"

#: seconds one sweep may take (connecting to the cluster included) before it is given up
SWEEP_TIMEOUT_S = 120.0
#: the most characters of a failed sweep's output that go into the log
MAX_LOGGED_CHARS = 2000

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def sweep_argv(cluster: ClusterRecord) -> list[str]:
    """The command that removes what ``cluster.owner`` named on ``cluster.address``."""
    if cluster.kind == "k8s":
        context = ["--context", cluster.context] if cluster.context else []
        return [
            sys.executable, "-m", K8S_SWEEP_MODULE, "--owner", cluster.owner,
            "--namespace", cluster.namespace or "default", *context,
        ]  # fmt: skip
    return [
        sys.executable, "-m", DRIVER_MODULE,
        "--sweep", owner_prefix(cluster.owner), "--address", cluster.address,
    ]  # fmt: skip


def run_bounded(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with no stdin, its output captured, for at most ``timeout`` seconds."""
    return subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def clusters_of(record: ServerRecord) -> list[ClusterRecord]:
    """The clusters and owners ``record``'s sessions held things under, each once (a
    server's sessions on one cluster share its owner prefix)."""
    found: list[ClusterRecord] = []
    for session in record.sessions:
        if session.cluster is not None and session.cluster not in found:
            found.append(session.cluster)
    return found


def sweep_clusters(
    record: ServerRecord,
    log: logging.Logger,
    timeout: float = SWEEP_TIMEOUT_S,
    run: Runner = run_bounded,
) -> None:
    """Remove what the dead server of ``record`` left on the clusters its sessions used,
    one log line for each; never raises for a sweep that fails."""
    for cluster in clusters_of(record):
        if cluster.kind not in ("ray", "k8s"):
            log.warning(
                "jupyter_dist: dead server pid %d held %s on a %r cluster at %s; nothing "
                "here sweeps that kind",
                record.pid, owner_prefix(cluster.owner), cluster.kind, cluster.address,
            )  # fmt: skip
            continue
        sweep_ray(cluster, record.pid, log, timeout, run)


def sweep_ray(
    cluster: ClusterRecord, server_pid: int, log: logging.Logger, timeout: float, run: Runner
) -> list[str] | None:
    """Run the Ray driver's sweep for ``cluster``; what it removed, or None if it failed."""
    prefix = owner_prefix(cluster.owner) if cluster.kind == "ray" else cluster.owner
    manager = "Ray" if cluster.kind == "ray" else "Kubernetes"
    try:
        done = run(sweep_argv(cluster), timeout)
    except subprocess.TimeoutExpired:
        log.warning(
            "jupyter_dist: sweeping %s of dead server pid %d on the %s cluster at %s: no "
            "answer within %.0f s; what it held stays until the cluster removes it",
            prefix, server_pid, manager, cluster.address, timeout,
        )  # fmt: skip
        return None
    except OSError as err:
        log.warning("jupyter_dist: cannot run the %s sweep of %s: %s", manager, prefix, err)
        return None
    removed = _removed(done.stdout) if done.returncode == 0 else None
    if removed is None:
        said = (done.stderr + done.stdout).strip()[-MAX_LOGGED_CHARS:]
        log.warning(
            "jupyter_dist: sweeping %s of dead server pid %d on the %s cluster at %s failed "
            "(exit status %d): %s",
            prefix, server_pid, manager, cluster.address, done.returncode,
            said or "(no output)",
        )  # fmt: skip
        return None
    if removed:
        log.warning(
            "jupyter_dist: removed what dead server pid %d left on the %s cluster at %s: %s",
            server_pid, manager, cluster.address, ", ".join(removed),
        )  # fmt: skip
    else:
        log.info(
            "jupyter_dist: dead server pid %d left nothing under %s on the %s cluster at %s",
            server_pid, prefix, manager, cluster.address,
        )  # fmt: skip
    return removed


def _removed(stdout: str) -> list[str] | None:
    """The names the sweep's ``swept`` event lists (its last line), or None without one."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "swept":
            removed = event.get("removed")
            if isinstance(removed, list):
                return [str(name) for name in removed]
    return None


__all__ = ["SWEEP_TIMEOUT_S", "clusters_of", "owner_prefix", "sweep_argv", "sweep_clusters"]
