"""What a ``--k8s`` session makes on the cluster, as plain manifests: one Secret with the
nodes' dial-back keys and one Indexed ``batch/v1`` Job with a pod per node.

The Job needs no operator or CRD. Node N is the pod of completion index N. Each pod:
* holds ``nvidia.com/gpu`` or the resource ``--k8s-gpu-resource`` names (its ``--gpus``
  count) and ``--cpus``/``--memory``, with a memory-backed ``/dev/shm``;
* goes to a machine of its own (a required pod anti-affinity on the hostname);
* runs one container,
  ``python -m jupyter_dist.node.dial_back CALLBACK --credentials FILE --node INDEX``;
* by default (`k8s_policy`) passes the ``restricted`` Pod Security Standard, has no mesh
  sidecar and mounts no service-account token.

Each pod proves its own node's identity only, and no key is ever in a container's
environment or arguments. The Secret holds every node's credentials; only our init
container `KEYS_CONTAINER` (``python -m jupyter_dist.node.pod_credentials``, never a
template's command) mounts it, and copies this pod's node's (its completion index) into
a memory-backed emptyDir, mode 0600, where the node's container finds them: the node
process reads them and removes them before it starts anything. The node's container does
not mount the Secret; a template's containers may mount neither volume
(`common.pod_template`).

The Job has a deadline (``activeDeadlineSeconds``) and a TTL after it finishes. A pod that
fails or goes (deleted, evicted, its machine lost) is a lost node, not the end of the
session: the Job tolerates `POD_FAILURES_PER_NODE` failures per node (``backoffLimit``) and
its controller starts a new pod of the same index, which `K8sPlacement.replace_node`
hands fresh keys (the Secret is not immutable: a heal rewrites the node's keys in it, and
the new pod's init container reads them). Everything carries the labels `session_labels`
names (the session and its owner ``user@host/pid``), by which a later server finds a dead
owner's leftovers. A ``--pod-template`` is merged with what the flags set (`k8s_merge`:
nothing of it dropped, what cannot be merged refused by name), then the defaults are
filled in where neither says anything.

With ``--k8s-queue NAME`` the Job is made suspended and carries Kueue's label
`QUEUE_LABEL` on its own metadata (Kueue reads the Job's, not its pods'): no pod exists
until Kueue admits the whole Job and sets ``suspend`` false. ``--k8s-priority-class`` and
``--k8s-scheduler`` are the pods' ``priorityClassName`` and ``schedulerName``.

Nothing here talks to a cluster (`control.launchers.k8s` does); the tests check these
manifests against golden files and the Kubernetes schemas.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_dist.common.k8s_options import DEFAULT_GPU_RESOURCE, K8sSpec
from jupyter_dist.common.pod_template import (
    CREDENTIALS_PATH,
    CREDENTIALS_VOLUME,
    KEYS_CONTAINER,
    NODE_KEY_PATH,
    NODE_KEY_VOLUME,
)
from jupyter_dist.control.launchers.dial_back import NODE_MODULE
from jupyter_dist.control.launchers.k8s_merge import merge_template
from jupyter_dist.control.launchers.k8s_policy import (
    CONTAINER_SECURITY,
    apply_defaults,
    fill,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "jupyter-dist"
PREFIX = "jupyter-dist.io"
SESSION_LABEL = f"{PREFIX}/session"
OWNER_HOST_LABEL = f"{PREFIX}/owner-host"
OWNER_PID_LABEL = f"{PREFIX}/owner-pid"
OWNER_ANNOTATION = f"{PREFIX}/owner"
JOB_LABEL = f"{PREFIX}/job"
#: the Job controller's label naming a pod's Job, and its completion index
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
CONTAINER = "node"
SECRET_KEY = "credentials"
#: the module of `KEYS_CONTAINER`, and the file it leaves in the node's emptyDir
KEYS_MODULE = "jupyter_dist.node.pod_credentials"
NODE_KEY_FILE = f"{NODE_KEY_PATH}/credentials"
#: what `KEYS_CONTAINER` asks of the machine (a pod's request is the larger of an init
#: container's and the sum of its containers': the node's is larger)
KEYS_RESOURCES = {"cpu": "100m", "memory": "64Mi"}
#: the fields of the node container's securityContext that `KEYS_CONTAINER` shares, so
#: that the file it writes belongs to the node's user
SHARED_SECURITY = ("runAsUser", "runAsGroup", "runAsNonRoot")
#: seconds a finished Job (and through it its pods and Secret) is kept for a look
TTL_AFTER_FINISHED_S = 600
#: pod failures the Job tolerates per node (its ``backoffLimit`` is this times the nodes):
#: a heal of a lost node costs up to two, the lost pod and the one the Job controller made
#: in its place before the heal, which holds the node's old keys
POD_FAILURES_PER_NODE = 8
#: the largest Secret the API server takes is 1 MiB; keep clear of it
MAX_SECRET_BYTES = 900 * 1024
#: the resource ``--gpus`` is asked as unless ``--k8s-gpu-resource`` names another
GPU_RESOURCE = DEFAULT_GPU_RESOURCE
#: Kueue's label naming the LocalQueue of a Job (on the Job itself)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Owner:
    """Who makes a session's objects: ``user@host/pid`` and, in-cluster, the notebook's pod
    (which then owns them: they go when it goes)."""

    user: str
    host: str
    pid: int
    pod: Mapping[str, Any] | None = None  # the notebook pod's object, in-cluster

    @property
    def text(self) -> str:
        return f"{self.user}@{self.host}/{self.pid}"


def label_value(text: str) -> str:
    """``text`` as a label value: at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both
    ends (``""`` when nothing is left)."""
    return _NOT_LABEL.sub("-", text)[:63].strip("-_.")


def object_name(session: str, suffix: str | None = None) -> str:
    """A fresh name for a session's Job and Secret: ``jd-SESSION-XXXXX`` in DNS form. The
    Job's pods are ``NAME-INDEX-xxxxx`` and their hostnames ``NAME-INDEX``: the name is
    kept short enough for both (at most 63 characters)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", session.lower()).strip("-")[:36].strip("-") or "session"
    if stem != session:  # the session's own name lost characters: keep names apart
        stem = f"{stem}-{hashlib.sha256(session.encode()).hexdigest()[:4]}"
    tail = suffix if suffix is not None else secrets.token_hex(3)[:5]
    return f"jd-{stem}-{tail}"


def session_labels(session: str, owner: Owner) -> dict[str, str]:
    return {
        MANAGED_BY: MANAGER,
        SESSION_LABEL: label_value(session) or "session",
        OWNER_HOST_LABEL: label_value(owner.host) or "host",
        OWNER_PID_LABEL: str(owner.pid),
    }


def owner_references(owner: Owner) -> list[dict[str, Any]]:
    """The notebook pod as the owner of what the session makes: when the pod is deleted
    the cluster's garbage collector deletes them."""
    pod = owner.pod
    if not pod:
        return []
    meta = pod.get("metadata", {})
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
            "blockOwnerDeletion": False,
        }
    ]


def _metadata(name: str, namespace: str, labels: Mapping[str, str], owner: Owner) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "annotations": {OWNER_ANNOTATION: owner.text},
    }
    refs = owner_references(owner)
    if refs:
        meta["ownerReferences"] = refs
    return meta


def secret_manifest(
    name: str, namespace: str, labels: Mapping[str, str], owner: Owner, credentials: Sequence[str]
) -> dict[str, Any]:
    """The Secret holding every node's dial-back credentials (a JSON list; each pod's init
    container takes its own node's by index). Not immutable: a heal gives a lost node's new
    pod fresh keys (`secret_patch`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(name, namespace, labels, owner),
        "type": "Opaque",
        "stringData": {SECRET_KEY: _credentials_text(credentials)},
    }


def secret_patch(credentials: Sequence[str]) -> dict[str, Any]:
    """A merge patch giving the Secret ``credentials`` (every node's, some renewed)."""
    text = _credentials_text(credentials)
    return {"data": {SECRET_KEY: base64.b64encode(text.encode()).decode()}}


def _credentials_text(credentials: Sequence[str]) -> str:
    text = "[" + ",".join(credentials) + "]"
    if len(text) > MAX_SECRET_BYTES:
        raise ValueError(
            f"{len(credentials)} nodes' keys are {len(text) // 1024} KiB, more than one "
            f"Secret holds ({MAX_SECRET_BYTES // 1024} KiB); expected fewer nodes"
        )
    return text


def _resources(k8s: K8sSpec, gpus: int) -> dict[str, dict[str, str]]:
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if gpus:
        limits[k8s.gpu_resource] = str(gpus)
    for key, value in (("cpu", k8s.cpus), ("memory", k8s.memory)):
        if value is not None:
            limits[key] = requests[key] = value
    out: dict[str, dict[str, str]] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def job_manifest(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: Owner,
    k8s: K8sSpec,
    *,
    nodes: int,
    gpus: int,
    image: str,
    callback: str,
    python: str = "python",
    template: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The session's Indexed Job: ``nodes`` pods of ``gpus`` GPUs each (0: none asked)."""
    pod_labels = {**labels, JOB_LABEL: name}
    index = "$(JOB_COMPLETION_INDEX)"
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": [python, "-m", NODE_MODULE],
        "args": [
            callback,
            "--credentials",
            NODE_KEY_FILE,
            "--remove-credentials",
            "--node",
            index,
            "--retry",
            f"{k8s.grace:g}",
        ],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "volumeMounts": [{"name": NODE_KEY_VOLUME, "mountPath": NODE_KEY_PATH}],
    }
    keys: dict[str, Any] = {
        "name": KEYS_CONTAINER,
        "image": image,
        "command": [python, "-m", KEYS_MODULE],
        "args": [f"{CREDENTIALS_PATH}/{SECRET_KEY}", "--node", index, "--to", NODE_KEY_FILE],
        "volumeMounts": [
            {"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_PATH, "readOnly": True},
            {"name": NODE_KEY_VOLUME, "mountPath": NODE_KEY_PATH},
        ],
        # its error (a missing entry, a full folder) in the pod's status, where it is shown
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(k8s, gpus)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "initContainers": [keys],
        "containers": [container],
        "volumes": [
            # readable by whoever mounts it (a non-root user has no other way in, and no
            # fsGroup is asked for): only the init container does
            {"name": CREDENTIALS_VOLUME, "secret": {"secretName": name, "defaultMode": 0o444}},
            {"name": NODE_KEY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {JOB_LABEL: name}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
    }
    if k8s.node_selector:
        pod_spec["nodeSelector"] = k8s.selector_dict()
    if k8s.tolerations:
        pod_spec["tolerations"] = k8s.toleration_dicts()
    if k8s.priority_class:
        pod_spec["priorityClassName"] = k8s.priority_class
    if k8s.scheduler:
        pod_spec["schedulerName"] = k8s.scheduler
    pod_meta: dict[str, Any] = {"labels": pod_labels}
    if template:
        pod_meta, pod_spec = merge_template(template, pod_meta, pod_spec)
    apply_defaults(pod_meta, pod_spec)
    _keys_like_node(pod_spec)
    meta = _metadata(name, namespace, labels, owner)
    queued: dict[str, Any] = {}
    if k8s.queue:
        meta["labels"][QUEUE_LABEL] = k8s.queue
        queued["suspend"] = True  # until Kueue admits every pod at once
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            **queued,
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": POD_FAILURES_PER_NODE * nodes,
            "activeDeadlineSeconds": k8s.deadline,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {"metadata": pod_meta, "spec": pod_spec},
        },
    }


def _keys_like_node(pod_spec: dict[str, Any]) -> None:
    """`KEYS_CONTAINER` as the node's container runs (once a template is merged): its
    user, so that the node may read and remove the file it writes, its image pull policy,
    and small requests and limits of the kinds the node's has (a quota that asks for
    limits asks them of every container); whatever the node's, the restricted standard's
    container settings (`k8s_policy.CONTAINER_SECURITY`)."""
    node = pod_spec["containers"][0]
    keys = next(c for c in pod_spec["initContainers"] if c.get("name") == KEYS_CONTAINER)
    security = node.get("securityContext") or {}
    shared = {k: security[k] for k in SHARED_SECURITY if k in security}
    keys["securityContext"] = fill(shared, CONTAINER_SECURITY)
    if "imagePullPolicy" in node:
        keys["imagePullPolicy"] = node["imagePullPolicy"]
    resources: dict[str, dict[str, str]] = {}
    for kind in ("requests", "limits"):
        asked = (node.get("resources") or {}).get(kind) or {}
        mine = {k: v for k, v in KEYS_RESOURCES.items() if k in asked}
        if mine:
            resources[kind] = mine
    if resources:
        keys["resources"] = resources


def job_size_patch(nodes: int) -> dict[str, Any]:
    """A merge patch scaling the session's Job to ``nodes`` pods: an Indexed Job's
    completions may change together with its parallelism (Kubernetes' elastic Indexed
    Job, GA in 1.31); its controller makes the new indexes' pods or deletes those past
    ``nodes``."""
    return {
        "spec": {
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": POD_FAILURES_PER_NODE * nodes,
        }
    }


__all__ = [
    "COMPLETION_INDEX_LABEL",
    "JOB_NAME_LABEL",
    "MANAGED_BY",
    "MANAGER",
    "OWNER_HOST_LABEL",
    "OWNER_PID_LABEL",
    "QUEUE_LABEL",
    "SESSION_LABEL",
    "Owner",
    "job_manifest",
    "job_size_patch",
    "label_value",
    "merge_template",
    "object_name",
    "secret_manifest",
    "secret_patch",
    "session_labels",
]
