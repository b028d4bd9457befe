"""The ``--k8s`` options of gangs and queues, checked where they are given (a cell's line,
a request's ``k8s`` object), the Job they make (a golden file, every supported version's
schema), and the words a released gang fails with. No processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.k8s_options import K8sSpec
from jupyter_dist.common.launcher_options import check_launcher_options, given_options
from jupyter_dist.control.launchers import k8s_manifests as m
from jupyter_dist.control.launchers.k8s_admission import GangWatch, waited_text
from jupyter_dist.errors import SpecError
from jupyter_dist.notebook.magics import DistMagics, _k8s_spec
from jupyter_dist.server.handlers import shape_from_json

GOLDEN = Path(__file__).parent.parent / "k8s" / "golden" / "queued_mig.json"
#: the Kubernetes versions the README says the manifests are for
VERSIONS = ("1.31.0", "1.34.0", "1.37.0")
QUEUED = K8sSpec(
    queue="team-gpus",
    priority_class="high",
    scheduler="scheduler-plugins-scheduler",
    gpu_resource="nvidia.com/mig-1g.10gb",
)


def job(spec: K8sSpec) -> dict[str, Any]:
    owner = m.Owner("alice", "notebook-0", 4242)
    return m.job_manifest(
        m.object_name("train", suffix="a1b2c"), "team", m.session_labels("train", owner),
        owner, spec, nodes=2, gpus=4, image="team/train:2", callback="10.0.3.7:7077",
    )  # fmt: skip


def test_a_queued_job_is_suspended_with_kueues_label_on_the_job_alone() -> None:
    queued = job(QUEUED)
    got = json.dumps(queued, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), (
        f"{GOLDEN} differs: UPDATE_GOLDEN=1 rewrites it after a review"
    )
    assert queued["spec"]["suspend"] is True
    assert queued["metadata"]["labels"][m.QUEUE_LABEL] == "team-gpus"
    assert m.QUEUE_LABEL not in queued["spec"]["template"]["metadata"]["labels"]
    pod = queued["spec"]["template"]["spec"]
    assert (pod["priorityClassName"], pod["schedulerName"]) == (
        "high",
        "scheduler-plugins-scheduler",
    )
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "4"}
    plain = job(K8sSpec())
    assert "suspend" not in plain["spec"] and m.QUEUE_LABEL not in plain["metadata"]["labels"]
    assert not {"priorityClassName", "schedulerName"} & set(plain["spec"]["template"]["spec"])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_queued_job_is_valid_for_each_supported_version(version: str) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(job(QUEUED), version, strict=True)


def refusal(**fields: object) -> str:
    with pytest.raises(SpecError) as refused:
        K8sSpec(**fields)  # type: ignore[arg-type]
    return str(refused.value)


@pytest.mark.parametrize(
    "name", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "gpu.intel.com/i915"]
)
def test_gpu_resources_of_device_plugins_are_taken(name: str) -> None:
    assert K8sSpec(gpu_resource=name).gpu_resource == name


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("gpu", "--k8s-gpu-resource 'gpu': expected an extended resource name DOMAIN/NAME"),
        ("nvidia/gpu", "--k8s-gpu-resource 'nvidia/gpu': expected an extended resource"),
        ("nvidia.com/", "--k8s-gpu-resource 'nvidia.com/': expected"),
        ("nvidia.com/mig 1g", "--k8s-gpu-resource 'nvidia.com/mig 1g': expected"),
        ("NVIDIA.com/gpu", "--k8s-gpu-resource 'NVIDIA.com/gpu': expected"),
        ("kubernetes.io/gpu", "kubernetes.io names Kubernetes' own resources"),
        ("nvidia.com/" + "g" * 55, "expected an extended resource name"),
        ("nvidia.com/" + "g" * 100, "... (111 characters): expected an extended resource"),
    ],
)
def test_a_gpu_resource_that_is_no_extended_resource_is_named(name: str, said: str) -> None:
    assert said in refusal(gpu_resource=name)


def test_queue_priority_class_scheduler_and_bounds_are_checked() -> None:
    assert "--k8s-queue 'Team_GPUs': expected the name of a Kueue LocalQueue" in refusal(
        queue="Team_GPUs"
    )
    assert "at most 63" in refusal(queue="q" * 64)
    assert "--k8s-priority-class 'High': expected a Kubernetes name" in refusal(
        priority_class="High"
    )
    assert "--k8s-scheduler 'my scheduler': expected a Kubernetes name" in refusal(
        scheduler="my scheduler"
    )
    assert "--k8s-queue-timeout 0: expected seconds, more than 0, at most 86400" in refusal(
        queue_timeout=0
    )
    assert "--k8s-gang-timeout 100000: expected seconds" in refusal(gang_timeout=100000)
    spec = K8sSpec(queue="team-gpus", priority_class="high", scheduler="volcano")
    assert (spec.queue_timeout, spec.gang_timeout, spec.gpu_resource) == (
        3600.0,
        60.0,
        "nvidia.com/gpu",
    )
    assert K8sSpec.from_json(spec.to_json()) == spec


def test_a_cell_gives_them_as_flags_and_they_are_kubernetes_options() -> None:
    magics = DistMagics(None)
    line = (
        "--k8s --k8s-queue team --k8s-queue-timeout 600 --k8s-gang-timeout 30 "
        "--k8s-priority-class high --k8s-scheduler volcano --k8s-gpu-resource amd.com/gpu"
    )
    spec = _k8s_spec(magics._cell_args(line))
    assert spec == K8sSpec(
        queue="team",
        queue_timeout=600,
        gang_timeout=30,
        priority_class="high",
        scheduler="volcano",
        gpu_resource="amd.com/gpu",
    )
    # any of them implies --k8s; with another launcher each is named as Kubernetes'
    assert _k8s_spec(magics._cell_args("--k8s-queue team")) == K8sSpec(queue="team")
    args = magics._cell_args("--ray --k8s-queue team --procs 1")
    with pytest.raises(SpecError) as refused:
        check_launcher_options([("ray", "--ray")], given_options(vars(args)))
    assert "--k8s-queue team: --k8s-queue is a Kubernetes option (--k8s: the Kueue queue" in str(
        refused.value
    )
    with pytest.raises(SpecError, match=r"--k8s-gang-timeout '9999999.*9' \(500 digits\)"):
        _k8s_spec(magics._cell_args("--k8s --k8s-gang-timeout " + "9" * 500))


def test_a_request_gives_them_as_fields() -> None:
    body = {"launcher": "k8s", "procs": 1, "k8s": {"queue": "team", "queue_timeout": 120}}
    k8s = shape_from_json(body).shape.k8s
    assert k8s is not None and (k8s.queue, k8s.queue_timeout) == ("team", 120)
    for fields, said in (
        ({"queue": 7}, "k8s.queue: '7' is not a str"),
        ({"gpu_resource": "gpu"}, "k8s: --k8s-gpu-resource 'gpu': expected an extended"),
        ({"gang_timeout": "1m"}, "k8s.gang_timeout: '1m' is not a int or float"),
    ):
        with pytest.raises(SpecError) as refused:
            shape_from_json({"launcher": "k8s", "procs": 1, "k8s": fields})
        assert said in str(refused.value)


def test_a_released_gang_names_each_waiting_pod_and_the_schedulers_reason() -> None:
    watch = GangWatch("team", "jd-train-a1b2c", 3, bound=60)
    unschedulable = {
        "metadata": {"name": "jd-train-a1b2c-1-xk2pq"},
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                }
            ]
        },
    }
    bound = {"metadata": {"name": "jd-train-a1b2c-0-bb7rt"}, "spec": {"nodeName": "gpu-0"}}
    assert list(watch.waiting({0: bound, 1: unschedulable})) == [1, 2]
    assert not watch.placed
    assert watch.text({1: unschedulable, 2: None}) == (
        "Kubernetes: 2 of the session's 3 pods were not on a machine within 60 s "
        "(--k8s-gang-timeout): node 1 (pod jd-train-a1b2c-1-xk2pq): Unschedulable: 0/2 nodes "
        "are available: 2 Insufficient nvidia.com/gpu.; node 2: no pod yet (the Job's "
        "controller has made none). Released them all (deleted job team/jd-train-a1b2c, its "
        "pods and its secret), so that none holds a machine waiting for the others. Ask for "
        "what the cluster has free (fewer --nodes or --gpus, another --k8s-gpu-resource or "
        "--node-selector), or give --k8s-queue NAME: Kueue admits the pods all at once, when "
        "they fit"
    )
    assert watch.waiting({0: bound, 1: bound, 2: bound}) == {}
    assert watch.placed
    assert [waited_text(s) for s in (4, 75, 3720)] == ["4 s", "1 min", "1 h 2 min"]
