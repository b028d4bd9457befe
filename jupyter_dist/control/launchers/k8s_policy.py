"""What a ``--k8s`` session's pods ask for by default, where neither a flag nor the
``--pod-template`` says otherwise (`k8s_manifests.job_manifest` fills it in after
`k8s_merge.merge_template`):

* the ``restricted`` Pod Security Standard: the pod runs as a non-root user
  (``runAsNonRoot``, ``runAsUser`` `DEFAULT_USER`) with the runtime's default seccomp
  profile, and each container (a template's init containers too) without privilege
  escalation and with every capability dropped (`POD_SECURITY`, `CONTAINER_SECURITY`). A
  namespace that enforces the standard takes the pods as they are; the image needs
  nothing but to run as that user (the README says what an image needs);
* no service-mesh sidecar: Istio's ``sidecar.istio.io/inject: "false"`` label (the pod
  label Istio reads first; its annotation is the older spelling) and Linkerd's
  ``linkerd.io/inject: disabled`` annotation. A sidecar would sit in the pods' dial-back
  and NCCL traffic, and one that keeps running never lets a Job's pod end. A template that
  sets either key, as a label or an annotation, decides for that mesh;
* a memory-backed ``/dev/shm`` (an emptyDir of medium Memory, mounted by the node's
  container): a template's volume mounted there is the node's ``/dev/shm`` instead, and a
  template's emptyDir named `SHM_VOLUME` is used with medium Memory where it names none
  (its ``sizeLimit`` kept);
* no service-account token, no service links, `TERMINATION_GRACE_S` to end.

A default the template sets to ``null`` is left out. A container that would run as root
(``runAsUser: 0``) while ``runAsNonRoot`` is true (our default or the template's) could
never start: that is refused by name when the manifest is made.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from jupyter_dist.errors import SpecError

#: the user the pods run as where the template names none: non-root, and the user of the
#: Jupyter docker-stacks' and Kubeflow's notebook images (jovyan)
DEFAULT_USER = 1000
#: the pod's securityContext, for the restricted Pod Security Standard
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": DEFAULT_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: each container's securityContext, for the restricted Pod Security Standard
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
ISTIO_INJECT = "sidecar.istio.io/inject"
LINKERD_INJECT = "linkerd.io/inject"
#: seconds a deleted pod's processes get before they are killed
TERMINATION_GRACE_S = 30
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
SPEC_DEFAULTS: dict[str, Any] = {
    "automountServiceAccountToken": False,
    "enableServiceLinks": False,
    "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
    "securityContext": POD_SECURITY,
}
_CONTAINER_LISTS = ("containers", "initContainers")


def apply_defaults(meta: dict[str, Any], spec: dict[str, Any]) -> None:
    """Fill in the defaults (see the module's docstring) where ``meta`` and ``spec`` (the
    pod's, a template merged) leave them out; a `SpecError` for a container that would run
    as root with ``runAsNonRoot``."""
    said = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    if ISTIO_INJECT not in said:
        meta.setdefault("labels", {})[ISTIO_INJECT] = "false"
    if LINKERD_INJECT not in said:
        meta.setdefault("annotations", {})[LINKERD_INJECT] = "disabled"
    fill(spec, SPEC_DEFAULTS)
    for kind in _CONTAINER_LISTS:  # the template's init containers too
        for container in spec.get(kind) or []:
            security = container.get("securityContext") or {}
            container["securityContext"] = fill(security, CONTAINER_SECURITY)
    _shared_memory(spec, spec["containers"][0])
    _drop_nulls(meta)
    _drop_nulls(spec)
    check_user(spec)


def fill(out: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``out`` with every key of ``defaults`` it lacks (mappings filled at every depth);
    what ``out`` has, ``null`` included, stays."""
    for key, value in defaults.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
        elif isinstance(out[key], dict) and isinstance(value, Mapping):
            fill(out[key], value)
    return out


def _shared_memory(spec: dict[str, Any], node: dict[str, Any]) -> None:
    mounts = node.setdefault("volumeMounts", [])
    theirs = next(
        (m for m in mounts if str(m.get("mountPath") or "").rstrip("/") == SHM_PATH), None
    )
    name = str(theirs.get("name")) if theirs else SHM_VOLUME
    if theirs is None:
        mounts.insert(0, {"name": SHM_VOLUME, "mountPath": SHM_PATH})
    volumes = spec.setdefault("volumes", [])
    volume = next((v for v in volumes if v.get("name") == name), None)
    if volume is None:
        if name == SHM_VOLUME:
            volumes.insert(0, {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    elif "emptyDir" in volume:
        volume["emptyDir"] = fill(volume.get("emptyDir") or {}, {"medium": "Memory"})


def _drop_nulls(value: Any) -> None:
    if isinstance(value, dict):
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
        for item in value.values():
            _drop_nulls(item)
    elif isinstance(value, list):
        for item in value:
            _drop_nulls(item)


def check_user(spec: Mapping[str, Any]) -> None:
    """No container runs as root (``runAsUser: 0``, its own or the pod's) while
    ``runAsNonRoot`` is true (its own or the pod's): the kubelet would never start it."""
    pod = spec.get("securityContext") or {}
    for kind in _CONTAINER_LISTS:
        for n, container in enumerate(spec.get(kind) or []):
            own = container.get("securityContext") or {}
            user = own.get("runAsUser", pod.get("runAsUser"))
            non_root = own.get("runAsNonRoot", pod.get("runAsNonRoot"))
            if user == 0 and non_root is True:
                where = f"spec.{kind}[{n}] ({container.get('name')})"
                raise SpecError(
                    f"--pod-template: {where} runs as root (runAsUser 0) with runAsNonRoot "
                    "true (jupyter_dist's default, for the restricted Pod Security Standard): "
                    "the kubelet would not start it. Expected a non-root runAsUser, or "
                    "runAsNonRoot: false beside runAsUser: 0 in the pod's securityContext to run "
                    "as root (the pods then do not pass the restricted standard)"
                )


__all__ = [
    "CONTAINER_SECURITY",
    "DEFAULT_USER",
    "ISTIO_INJECT",
    "LINKERD_INJECT",
    "POD_SECURITY",
    "SHM_PATH",
    "SHM_VOLUME",
    "TERMINATION_GRACE_S",
    "apply_defaults",
    "check_user",
    "fill",
]
