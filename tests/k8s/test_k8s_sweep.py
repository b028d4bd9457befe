"""A later server's sweep on the emulated cluster: it deletes the Jobs and Secrets a dead
owner's sessions left, found by label, and nothing of another owner or of anyone else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from jupyter_dist.control.launchers import k8s_manifests as m
from jupyter_dist.server.cluster_sweep import K8S_SWEEP_MODULE

from .cluster import K8sCluster

pytestmark = [pytest.mark.slow, pytest.mark.k8s]

DEAD = m.Owner("alice", "notebook-0", 4242)
LIVE = m.Owner("alice", "notebook-0", 4343)
OTHER_HOST = m.Owner("alice", "notebook-1", 4242)


def make(cluster: K8sCluster, owner: m.Owner, session: str) -> str:
    """A session's Secret and a Job with no pods to run (completions 0), as it makes them."""
    name = m.object_name(session)
    labels = m.session_labels(session, owner)
    cluster.create("secrets", m.secret_manifest(name, "default", labels, owner, ["{}"]))
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {m.OWNER_ANNOTATION: owner.text}},
        "spec": {"completions": 0, "parallelism": 0, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}},
    }  # fmt: skip
    cluster.create("jobs", job)
    return name


def names(cluster: K8sCluster, kind: str) -> set[str]:
    selector = f"{m.MANAGED_BY}={m.MANAGER}"
    return {o["metadata"]["name"] for o in cluster.list(kind, label_selector=selector)}


def test_only_the_dead_owners_objects_go(k8s_cluster: K8sCluster) -> None:
    dead = [make(k8s_cluster, DEAD, s) for s in ("a", "b")]
    kept = [make(k8s_cluster, LIVE, "a"), make(k8s_cluster, OTHER_HOST, "a")]
    stranger = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated"},
                "stringData": {"k": "v"}}  # fmt: skip
    k8s_cluster.create("secrets", stranger)
    done = subprocess.run(
        [sys.executable, "-m", K8S_SWEEP_MODULE, "--owner", DEAD.text, "--namespace", "default"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    swept = json.loads(done.stdout.strip().splitlines()[-1])
    assert swept["event"] == "swept"
    assert sorted(swept["removed"]) == sorted(
        [f"job/{n}" for n in dead] + [f"secret/{n}" for n in dead]
    )
    for kind in ("jobs", "secrets"):
        assert names(k8s_cluster, kind) == set(kept)
    assert k8s_cluster.get_or_none("secrets", "unrelated") is not None


def test_a_sweep_that_cannot_reach_the_cluster_says_so(k8s_cluster: K8sCluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", K8S_SWEEP_MODULE, "--owner", DEAD.text, "--namespace", "default",
         "--context", "no-such-context"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)},
    )  # fmt: skip
    assert done.returncode == 1
    assert "Kubernetes: cannot use context 'no-such-context'" in done.stderr, done.stderr
