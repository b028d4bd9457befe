"""The emulated scheduler's and API server's rules on their own (no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_dist.common.k8s_options import K8sSpec
from jupyter_dist.control.launchers import k8s_manifests as m
from tests.k8s.api_server import parse_deny
from tests.k8s.kinds import matches_field_selector, matches_label_selector
from tests.k8s.pod_runner import expand
from tests.k8s.pod_security import violations
from tests.k8s.scheduler import NodeShape, choose_node, fits_all, parse_quantity

pytestmark = pytest.mark.k8s

NODES = [NodeShape("node-0", 4, "16Gi", 0), NodeShape("node-1", 4, "16Gi", 2)]


def pod(name: str, limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"job": "j"}},
        "spec": {"containers": [{"resources": {"limits": limits or {}}}], **spec},
        "status": {"phase": "Running"},
    }


def test_resources_pick_the_node_that_has_them() -> None:
    assert choose_node(pod("a", {"nvidia.com/gpu": "2"}), NODES, []) == ("node-1", "")
    taken = [
        {
            **pod("b", {"nvidia.com/gpu": "2"}),
            "spec": {
                "nodeName": "node-1",
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
            },
        }
    ]
    node, message = choose_node(pod("a", {"nvidia.com/gpu": "1", "cpu": "8"}), NODES, taken)
    assert node is None
    assert message == (
        "0/2 nodes are available: 2 Insufficient cpu, 2 Insufficient nvidia.com/gpu. preemption:"
        " 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    )


def test_node_selector_and_anti_affinity() -> None:
    assert choose_node(pod("a", nodeSelector={"kubernetes.io/hostname": "node-1"}), NODES, [])[
        0
    ] == ("node-1")
    node, message = choose_node(pod("a", nodeSelector={"pool": "gpu"}), NODES, [])
    assert (node, message) == (
        None,
        (
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
            " preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
        ),
    )
    spread = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"job": "j"}},
                }
            ]
        }
    }
    first = {**pod("a", affinity=spread)}
    first["spec"]["nodeName"] = "node-0"
    assert choose_node(pod("b", affinity=spread), NODES, [first])[0] == "node-1"
    second = pod("b", affinity=spread)
    second["spec"]["nodeName"] = "node-1"
    node, message = choose_node(pod("c", affinity=spread), NODES, [first, second])
    assert node is None and "2 node(s) didn't match pod anti-affinity rules." in message


def test_quantities_selectors_expansion_and_deny_specs() -> None:
    assert parse_quantity("500m") == 0.5 and parse_quantity("2Gi") == 2**31
    with pytest.raises(ValueError, match="quantity '2 cores'"):
        parse_quantity("2 cores")
    labels = {"app": "x", "tier": "db"}
    assert matches_label_selector(labels, "app=x,tier in (db,cache),!gone")
    assert not matches_label_selector(labels, "app=x,tier notin (db)")
    with pytest.raises(ValueError, match="cannot parse"):
        matches_label_selector(labels, "app=x,=y")
    assert matches_field_selector({"status": {"phase": "Running"}}, "status.phase!=Failed")
    assert expand("$(A)-$$(A)-$(B)-$", {"A": "1"}) == "1-$(A)-$(B)-$"
    assert parse_deny("patch:pods/status") == ("patch", "pods/status")
    with pytest.raises(ValueError, match="'create:widgets'"):
        parse_deny("create:widgets")


def test_extended_resources_are_fitted_by_name_and_a_gang_fits_all_or_none() -> None:
    mig = "nvidia.com/mig-1g.10gb"
    nodes = [NodeShape("node-0", 4, "16Gi", 1), NodeShape("node-1", 4, "16Gi", 0, ((mig, 2),))]
    assert nodes[1].allocatable()[mig] == "2" and mig not in nodes[0].allocatable()
    assert choose_node(pod("m", {mig: "1"}), nodes, []) == ("node-1", "")
    assert choose_node(pod("g", {"nvidia.com/gpu": "1"}), nodes, []) == ("node-0", "")
    node, message = choose_node(pod("a", {"amd.com/gpu": "1"}), nodes, [])
    assert node is None and "2 Insufficient amd.com/gpu" in message
    spread = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"job": "j"}},
                }
            ]
        }
    }
    gang = [pod(n, {mig: "1"}, affinity=spread) for n in ("a", "b")]
    placed, why = fits_all(gang, nodes, [])
    assert placed is None and why.startswith(
        "0/2 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb, 1 node(s) didn't match "
        "pod anti-affinity rules."
    ), why
    placed, why = fits_all(gang[:1], nodes, [])
    assert why == "" and placed is not None and placed[0]["spec"]["nodeName"] == "node-1"


def test_the_restricted_standard_takes_our_pods_and_names_what_one_violates() -> None:
    job = m.job_manifest(
        "jd-a", "ns", {}, m.Owner("a", "b", 1), K8sSpec(), nodes=2, gpus=1, image="i:1",
        callback="h:1",
    )  # fmt: skip
    spec = job["spec"]["template"]["spec"]
    assert violations(spec) == []
    del spec["securityContext"]
    for container in [*spec["initContainers"], *spec["containers"]]:
        del container["securityContext"]
    both = 'containers "jupyter-dist-keys", "node"'
    assert violations(spec) == [
        f"allowPrivilegeEscalation != false ({both} must set "
        "securityContext.allowPrivilegeEscalation=false)",
        f'unrestricted capabilities ({both} must set securityContext.capabilities.drop=["ALL"])',
        f"runAsNonRoot != true (pod or {both} must set securityContext.runAsNonRoot=true)",
        f"seccompProfile (pod or {both} must set securityContext.seccompProfile.type to "
        '"RuntimeDefault" or "Localhost")',
    ]
    hostile = {
        "hostNetwork": True,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 0,
                            "seccompProfile": {"type": "Unconfined"}},
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}, {"name": "e", "emptyDir": {}}],
        "containers": [{"name": "c", "securityContext": {
            "privileged": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "NET_BIND_SERVICE"]}}}],
    }  # fmt: skip
    assert [v.split(" (")[0] for v in violations(hostile)] == [
        "host namespaces", "privileged", "hostPath volumes", "restricted volume types",
        "unrestricted capabilities", "runAsUser=0", "seccompProfile",
    ]  # fmt: skip
