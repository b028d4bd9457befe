"""The README's Role for ``--k8s`` is enough, and each of its verbs is needed: a session
starts, runs and stops, and a later server's sweep runs, for an account the emulated API
server refuses everything else; taking any one verb away fails naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from jupyter_dist.common.ports import free_port
from jupyter_dist.server.cluster_sweep import K8S_SWEEP_MODULE
from tests.conftest import CellOutput

from .api_server import VERBS
from .cluster import K8sCluster
from .kinds import KINDS

pytestmark = [pytest.mark.slow, pytest.mark.k8s, pytest.mark.timeout(900)]

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_role() -> set[tuple[str, str]]:
    """(verb, resource) pairs of the Role in the README's Kubernetes section."""
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "Role":
                return {
                    (verb, resource)
                    for rule in doc["rules"]
                    for resource in rule["resources"]
                    for verb in rule["verbs"]
                }
    raise AssertionError("README.md has no Role in a yaml block")


def everything_but(allowed: set[tuple[str, str]]) -> list[str]:
    resources = sorted({k.split("/")[0] for k in KINDS})
    return [f"{v}:{r}" for v in VERBS for r in resources if (v, r) not in allowed]


def start(run: Callable[[str], CellOutput], session: str) -> tuple[bool, str]:
    cell = (
        f"%%distributed --k8s --nodes 2 --procs 1 --k8s-callback 127.0.0.1:{free_port()} "
        f"--image team/train:1 --k8s-timeout 60 --k8s-grace 5 --session {session}\nx = 1"
    )
    out = run(cell)
    return bool(out.result.success), out.stdout + out.stderr


def left(cluster: K8sCluster, resource: str, session: str) -> list[str]:
    found = cluster.list(resource, label_selector=f"jupyter-dist.io/session={session}")
    return [o["metadata"]["name"] for o in found]


def test_the_readme_role_is_enough_and_every_verb_in_it_is_needed(
    k8s_cluster_factory: Callable[..., K8sCluster],
    run: Callable[[str], CellOutput],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    role = readme_role()
    assert ("create", "jobs") in role and ("create", "secrets") in role
    cluster = k8s_cluster_factory(deny=everything_but(role))
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    ok, text = start(run, "krole")
    assert ok, text
    assert run("%dist shutdown --session krole").result.success
    cluster.wait_for(
        "the session's Job and Secret deleted",
        lambda: not left(cluster, "jobs", "krole") and not left(cluster, "secrets", "krole"),
    )
    sweep = subprocess.run(
        [sys.executable, "-m", K8S_SWEEP_MODULE, "--owner", "a@b/1", "--namespace", "default"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    # each verb of the Role is used: without it the start fails naming it, or (delete) the
    # session's objects stay after it stops
    # get pods: in-cluster only; delete pods: a heal of a lost node only; patch jobs: a
    # resize only; list events: why a pod was refused, else the start waits as without it
    # (test_k8s_sessions)
    unneeded = {("get", "pods"), ("delete", "pods"), ("patch", "jobs"), ("list", "events")}
    for verb, resource in sorted(role - unneeded):
        # the Secret goes with its Job (it is owned by it) unless the Job was never made
        orphan = (verb, resource) == ("delete", "secrets")
        also = ["create:jobs"] if orphan else []
        lacking = k8s_cluster_factory(deny=[*everything_but(role), f"{verb}:{resource}", *also])
        monkeypatch.setenv("KUBECONFIG", str(lacking.kubeconfig))
        session = f"krole-{verb}-{resource}"
        ok, text = start(run, session)
        run(f"%dist shutdown --session {session}")
        if verb == "delete":
            assert ok != orphan, text
            assert left(lacking, resource, session), f"{verb} {resource} was not needed"
            continue
        assert not ok, f"{verb} {resource} was not needed"
        assert f"needs the verb {verb!r} on {resource!r}" in text, (verb, resource, text)
