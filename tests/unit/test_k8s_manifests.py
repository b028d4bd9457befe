"""The Job and Secret a ``--k8s`` session makes: golden files, every version's schema
(strict: an unknown field fails), and what the manifests must and must not hold."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_dist.common import pod_template as pt
from jupyter_dist.common.k8s_options import K8sSpec, read_pod_template
from jupyter_dist.control.launchers import k8s_manifests as m
from jupyter_dist.control.launchers import k8s_policy as policy
from jupyter_dist.errors import SpecError

GOLDEN = Path(__file__).parent.parent / "k8s" / "golden"
#: the Kubernetes versions the README says the manifests are for
VERSIONS = ("1.31.0", "1.34.0", "1.37.0")
OWNER = m.Owner("alice", "notebook-0", 4242)
POD = {
    "metadata": {"name": "jupyter-alice", "namespace": "team", "uid": "0b6f7c3e-1c2d-4e5f"},
    "spec": {"containers": [{"name": "notebook", "image": "team/notebook:1"}]},
}
SECRET_WORDS = ("PRIVATE KEY", "ssh-ed25519")


def manifests(spec: K8sSpec, owner: m.Owner = OWNER, template: Any = None) -> dict[str, Any]:
    labels = m.session_labels("train", owner)
    name = m.object_name("train", suffix="a1b2c")
    creds = [json.dumps({"node": n, "host_key": "PRIVATE KEY", "client_key": "ssh-ed25519 AAAA"})
             for n in range(2)]  # fmt: skip
    return {
        "job": m.job_manifest(
            name,
            "team",
            labels,
            owner,
            spec,
            nodes=2,
            gpus=4,
            image="team/train:2",
            callback="10.0.3.7:7077",
            template=template,
        ),
        "secret": m.secret_manifest(name, "team", labels, owner, creds),
    }


CASES = {
    "plain": (K8sSpec(), OWNER),
    "in_cluster_with_flags": (
        K8sSpec(
            cpus="8",
            memory="64Gi",
            node_selector=("nvidia.com/gpu.product=H100",),
            tolerations=("nvidia.com/gpu:NoSchedule", "team=ml:NoExecute"),
            deadline=3600,
        ),
        m.Owner("alice", "jupyter-alice", 7, POD),
    ),
    "with_template": (K8sSpec(node_selector=("pool=gpu",)), OWNER),
}
#: the template of a case, as `read_pod_template` returns it: a node affinity and a sized
#: /dev/shm (both dropped once), its own init container, toleration and securityContext
TEMPLATES: dict[str, Any] = {
    "with_template": yaml.safe_load(
        """
metadata:
  labels: {team: vision}
  annotations: {linkerd.io/inject: enabled}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: gpu.arch, operator: In, values: [hopper]}]
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 10
        podAffinityTerm:
          topologyKey: topology.kubernetes.io/zone
          labelSelector: {matchLabels: {team: vision}}
  nodeSelector: {disk: nvme}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  securityContext: {fsGroup: 100, runAsUser: 1001}
  volumes: [{name: dshm, emptyDir: {sizeLimit: 16Gi}}]
  initContainers: [{name: warm, image: team/warm:1, command: ["true"]}]
  containers: [{name: trainer, env: [{name: NCCL_DEBUG, value: WARN}]}]
"""
    )
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_manifests_match_their_golden_files(case: str) -> None:
    spec, owner = CASES[case]
    got = json.dumps(manifests(spec, owner, TEMPLATES.get(case)), indent=2, sort_keys=True) + "\n"
    path = GOLDEN / f"{case}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text(), f"{path} differs: UPDATE_GOLDEN=1 rewrites it after a review"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_manifests_are_valid_for_each_supported_version(case: str, version: str) -> None:
    import kubernetes_validate

    spec, owner = CASES[case]
    for manifest in manifests(spec, owner, TEMPLATES.get(case)).values():
        kubernetes_validate.validate(manifest, version, strict=True)


def test_a_field_the_schema_lacks_fails_validation() -> None:
    """The check above can fail: strict validation refuses a misspelt field."""
    import kubernetes_validate

    job = manifests(K8sSpec())["job"]
    job["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_a_heal_rewrites_the_secrets_keys_with_a_patch() -> None:
    creds = ['{"node": 0}', '{"node": 1, "host_key": "new"}']
    secret = m.secret_manifest("jd-a", "team", {}, OWNER, creds)
    assert "immutable" not in secret  # a heal renews a lost node's keys in it
    patch = m.secret_patch(creds)
    assert set(patch) == {"data"}
    text = base64.b64decode(patch["data"][m.SECRET_KEY]).decode()
    assert text == secret["stringData"][m.SECRET_KEY]
    assert json.loads(text)[1] == {"node": 1, "host_key": "new"}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_resize_scales_the_indexed_job_as_one_made_for_that_many_nodes(version: str) -> None:
    """Completions and parallelism change together (an elastic Indexed Job), and the Job
    patched is valid and as if made for three nodes."""
    import kubernetes_validate

    job = manifests(K8sSpec())["job"]
    patch = m.job_size_patch(3)
    assert set(patch) == {"spec"}
    job["spec"].update(patch["spec"])
    kubernetes_validate.validate(job, version, strict=True)
    made = m.job_manifest(
        "jd-x", "team", {}, OWNER, K8sSpec(), nodes=3, gpus=0, image="i:1", callback="h:1"
    )
    assert {k: made["spec"][k] for k in patch["spec"]} == patch["spec"]


def test_the_job_is_indexed_bounded_spread_and_mounts_no_token() -> None:
    job = manifests(K8sSpec(deadline=3600))["job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert spec["activeDeadlineSeconds"] == 3600 and spec["ttlSecondsAfterFinished"] > 0
    assert spec["backoffLimit"] == m.POD_FAILURES_PER_NODE * 2  # a lost pod is replaced
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {m.JOB_LABEL: job["metadata"]["name"]}
    assert spec["template"]["metadata"]["labels"][m.JOB_LABEL] == job["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {m.GPU_RESOURCE: "4"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert container["args"][:6] == ["10.0.3.7:7077", "--credentials", m.NODE_KEY_FILE,
                                     "--remove-credentials", "--node",
                                     "$(JOB_COMPLETION_INDEX)"]  # fmt: skip


def test_the_keys_are_in_the_secret_alone_and_only_our_init_container_mounts_it() -> None:
    """No container has a key in its environment; the Secret (every node's) is mounted by
    our init container alone, whose command is ours, and which hands this pod's node its
    own credentials in a memory-backed folder that the node's container mounts."""
    made = manifests(K8sSpec())
    job_text = json.dumps(made["job"])
    assert not any(word in job_text for word in SECRET_WORDS)
    pod = made["job"]["spec"]["template"]["spec"]
    name = made["secret"]["metadata"]["name"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume == {"name": pt.CREDENTIALS_VOLUME,
                      "secret": {"secretName": name, "defaultMode": 0o444}}  # fmt: skip
    assert {"name": pt.NODE_KEY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in (
        pod["volumes"]
    )
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert "envFrom" not in container
        for var in container.get("env", []):
            assert "valueFrom" not in var and name not in json.dumps(var), var
    (keys,) = pod["initContainers"]
    (node,) = pod["containers"]
    mounts = {c["name"]: {v["name"] for v in c["volumeMounts"]} for c in (keys, node)}
    assert mounts == {
        pt.KEYS_CONTAINER: {pt.CREDENTIALS_VOLUME, pt.NODE_KEY_VOLUME},
        m.CONTAINER: {"dshm", pt.NODE_KEY_VOLUME},
    }
    assert keys["command"] == ["python", "-m", m.KEYS_MODULE]
    assert keys["args"] == [f"{pt.CREDENTIALS_PATH}/{m.SECRET_KEY}", "--node",
                            "$(JOB_COMPLETION_INDEX)", "--to", m.NODE_KEY_FILE]  # fmt: skip
    assert m.NODE_KEY_FILE.startswith(pt.NODE_KEY_PATH + "/")
    nodes = json.loads(made["secret"]["stringData"][m.SECRET_KEY])
    assert [n["node"] for n in nodes] == [0, 1]


def test_the_keys_container_runs_as_the_node_does() -> None:
    """The node may read and remove what it writes (its user), and a quota that asks every
    container for limits finds them; a template's command is not the node's."""
    template = {
        "spec": {
            "securityContext": {"fsGroup": 100},
            "initContainers": [{"name": "setup", "image": "busybox", "command": ["true"]}],
            "containers": [
                {
                    "command": ["sh", "-c", "env"],  # refused when read; ours alone here
                    "imagePullPolicy": "Always",
                    "securityContext": {
                        "runAsUser": 1000,
                        "runAsGroup": 100,
                        "capabilities": {"add": ["IPC_LOCK"]},
                    },
                }
            ],
        }
    }
    job = manifests(K8sSpec(cpus="8", memory="64Gi"), template=template)["job"]
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["setup", pt.KEYS_CONTAINER]  # ours last
    keys, (node,) = pod["initContainers"][1], pod["containers"]
    assert node["command"] == ["python", "-m", "jupyter_dist.node.dial_back"]
    assert node["args"][0] == "10.0.3.7:7077"
    assert keys["securityContext"] == {
        "runAsUser": 1000, "runAsGroup": 100, **policy.CONTAINER_SECURITY
    }  # fmt: skip
    assert keys["imagePullPolicy"] == "Always"
    assert keys["resources"] == {"requests": m.KEYS_RESOURCES, "limits": m.KEYS_RESOURCES}
    import kubernetes_validate

    kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_the_owner_pod_owns_both_and_labels_name_session_and_owner() -> None:
    made = manifests(K8sSpec(), m.Owner("alice", "jupyter-alice", 7, POD))
    for obj in made.values():
        meta = obj["metadata"]
        assert meta["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "jupyter-alice",
             "uid": POD["metadata"]["uid"], "blockOwnerDeletion": False}
        ]  # fmt: skip
        assert meta["labels"] == {
            m.MANAGED_BY: "jupyter-dist",
            m.SESSION_LABEL: "train",
            m.OWNER_HOST_LABEL: "jupyter-alice",
            m.OWNER_PID_LABEL: "7",
        }
        assert meta["annotations"][m.OWNER_ANNOTATION] == "alice@jupyter-alice/7"
    assert "ownerReferences" not in manifests(K8sSpec())["job"]["metadata"]  # outside


def test_names_fit_dns_and_keep_sessions_apart() -> None:
    long = m.object_name("A" * 128)
    assert len(long) <= 63 - len("-1023-xxxxx") + 11 and long.startswith("jd-")
    assert m.object_name("Train_1") != m.object_name("train-1")
    assert m.object_name("x") != m.object_name("x")  # a fresh suffix each start
    assert m.label_value("user@host.example/1") == "user-host.example-1"


def test_a_pod_template_fills_in_what_the_flags_leave(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(
        "spec:\n"
        "  serviceAccountName: trainer\n"
        "  automountServiceAccountToken: true\n"
        "  volumes:\n"
        "  - {name: data, persistentVolumeClaim: {claimName: datasets}}\n"
        "  - {name: dshm, emptyDir: {}}\n"
        "  containers:\n"
        "  - name: main\n"
        "    env: [{name: HF_HOME, value: /data/hf}]\n"
        "    volumeMounts: [{name: data, mountPath: /data}]\n"
        "    resources: {limits: {rdma/ib: '1'}}\n"
        "    securityContext: {capabilities: {add: [IPC_LOCK]}}\n"
    )
    job = manifests(K8sSpec(), template=read_pod_template(str(path)))["job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["automountServiceAccountToken"] is True  # a default of ours: the template's
    assert [v["name"] for v in pod["volumes"]] == [
        "data", "dshm", pt.CREDENTIALS_VOLUME, pt.NODE_KEY_VOLUME
    ]  # fmt: skip
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    (container,) = pod["containers"]
    assert container["name"] == "main"  # kept: nothing depends on ours
    assert container["resources"]["limits"] == {"rdma/ib": "1", m.GPU_RESOURCE: "4"}
    assert {"name": "HF_HOME", "value": "/data/hf"} in container["env"]
    assert container["securityContext"] == {
        "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]},
        "allowPrivilegeEscalation": False,
    }
    import kubernetes_validate

    kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("- a\n- b\n", "expected a mapping"),
        ("kind: Deployment\nspec: {}\n", "kind 'Deployment'"),
        ("spec:\n  containers: [{name: a}, {name: b}]\n", "2 containers; expected at most one"),
        ("spec: [\n", "not YAML or JSON"),
    ],
)
def test_a_bad_pod_template_is_named(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="--pod-template") as err:
        read_pod_template(str(path))
    assert said in str(err.value)


def test_a_missing_or_huge_pod_template_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"--pod-template '.*nope.yaml': No such file"):
        read_pod_template(str(tmp_path / "nope.yaml"))
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 300_000)
    with pytest.raises(
        SpecError, match=r"expected at most 262144 bytes \(256 KiB\) of a pod template"
    ):
        read_pod_template(str(big))


def test_too_many_nodes_for_one_secret_is_refused() -> None:
    creds = ["x" * 1000] * 1000
    with pytest.raises(ValueError, match="more than one Secret holds"):
        m.secret_manifest("jd-a-b", "ns", {}, OWNER, creds)


def test_the_pods_are_restricted_and_sidecar_free_unless_the_template_says_otherwise() -> None:
    """The restricted Pod Security Standard's fields (tests/k8s/pod_security.py checks the
    standard itself) and no mesh sidecar, each a default the template's own value wins."""
    job = manifests(K8sSpec())["job"]
    meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
    assert pod["securityContext"] == policy.POD_SECURITY
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["securityContext"] == policy.CONTAINER_SECURITY, container["name"]
    assert meta["labels"][policy.ISTIO_INJECT] == "false"
    assert meta["annotations"][policy.LINKERD_INJECT] == "disabled"
    template = {
        "metadata": {"annotations": {policy.ISTIO_INJECT: "true"}},
        "spec": {
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "seccompProfile": None},
            "containers": [{"securityContext": {"privileged": True}}],
        },
    }
    job = manifests(K8sSpec(), template=template)["job"]
    meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
    assert policy.ISTIO_INJECT not in meta["labels"]  # theirs decides, as an annotation
    assert pod["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False}  # null: left out
    assert pod["containers"][0]["securityContext"]["privileged"] is True
    assert pod["initContainers"][0]["securityContext"] == policy.CONTAINER_SECURITY


def test_a_template_keeps_its_affinity_and_sized_shared_memory() -> None:
    """Nothing of the template is dropped: its node affinity and preferred anti-affinity
    beside our required one, its node selector beside ours, its /dev/shm size."""
    job = manifests(*CASES["with_template"], template=TEMPLATES["with_template"])["job"]
    meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
    theirs = TEMPLATES["with_template"]["spec"]
    assert pod["affinity"]["nodeAffinity"] == theirs["affinity"]["nodeAffinity"]
    anti = pod["affinity"]["podAntiAffinity"]
    assert (
        anti["preferredDuringSchedulingIgnoredDuringExecution"]
        == (
            theirs["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        )
    )
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert pod["nodeSelector"] == {"disk": "nvme", "pool": "gpu"}
    assert [v for v in pod["volumes"] if v["name"] == "dshm"] == [
        {"name": "dshm", "emptyDir": {"sizeLimit": "16Gi", "medium": "Memory"}}
    ]
    (node,) = pod["containers"]
    assert [m_ for m_ in node["volumeMounts"] if m_["mountPath"] == "/dev/shm"] == [
        {"name": "dshm", "mountPath": "/dev/shm"}
    ]
    assert pod["securityContext"] == {**policy.POD_SECURITY, "fsGroup": 100, "runAsUser": 1001}
    assert meta["labels"]["team"] == "vision" and meta["labels"][m.JOB_LABEL]
    assert meta["annotations"][policy.LINKERD_INJECT] == "enabled"
    assert [c["name"] for c in pod["initContainers"]] == ["warm", pt.KEYS_CONTAINER]
    # a volume of the template's own mounted at /dev/shm is the node's /dev/shm
    other = {"spec": {
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
        "containers": [{"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
    }}  # fmt: skip
    pod = manifests(K8sSpec(), template=other)["job"]["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["shm", pt.CREDENTIALS_VOLUME, pt.NODE_KEY_VOLUME]
    shm = [m_ for m_ in pod["containers"][0]["volumeMounts"] if m_["mountPath"] == "/dev/shm"]
    assert shm == [{"name": "shm", "mountPath": "/dev/shm"}]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"restartPolicy": "OnFailure"}, "spec.restartPolicy: 'OnFailure', where jupyter_dist sets "
                                         "'Never': a lost node is healed"),
        ({"affinity": [{"nodeAffinity": {}}]}, "spec.affinity: a list [{'nodeAffinity': {}}], "
                                               "where jupyter_dist sets a mapping"),
        ({"securityContext": {"runAsUser": 0}}, "spec.containers[0] (node) runs as root "
                                                "(runAsUser 0) with runAsNonRoot true"),
    ],
)  # fmt: skip
def test_a_template_field_that_cannot_be_merged_is_refused_by_name(
    spec: dict[str, Any], said: str
) -> None:
    with pytest.raises(SpecError, match=r"^--pod-template: ") as err:
        manifests(K8sSpec(), template={"spec": spec})
    assert said in str(err.value)
    label = {"metadata": {"labels": {m.MANAGED_BY: "helm"}}}
    with pytest.raises(SpecError) as err:
        manifests(K8sSpec(), template=label)
    assert "metadata.labels.app.kubernetes.io/managed-by: 'helm'" in str(err.value)
