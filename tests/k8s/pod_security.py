"""The ``restricted`` Pod Security Standard, as the API server's PodSecurity admission
checks a pod in a namespace labelled ``pod-security.kubernetes.io/enforce: restricted``.

`violations` runs the checks of the baseline and restricted levels (latest version) on a
pod spec and words each failure as the API server does (``allowPrivilegeEscalation !=
false (container "node" must set securityContext.allowPrivilegeEscalation=false)``);
`forbidden_message` is the whole refusal (``pods "x" is forbidden: violates PodSecurity
"restricted:latest": ...``). Checked: host namespaces, privileged containers,
capabilities (restricted: ALL dropped, only NET_BIND_SERVICE added), hostPath and every
volume type the restricted level does not allow, host ports, ``/proc`` mount type,
privilege escalation, ``runAsNonRoot``, ``runAsUser`` 0, seccomp profile
(RuntimeDefault or Localhost, Unconfined nowhere), unsafe sysctls. Not checked: AppArmor
and SELinux options, Windows host processes, the ``baseline`` and ``privileged`` levels
on their own, ``warn`` and ``audit`` modes, exemptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENFORCE_LABEL", "RESTRICTED_VOLUMES", "forbidden_message", "violations"]

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
#: the volume types a restricted pod may use
RESTRICTED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
_SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
)
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def forbidden_message(pod: Mapping[str, Any], found: list[str]) -> str:
    name = (pod.get("metadata") or {}).get("name") or ""
    return f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": ' + ", ".join(
        found
    )


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for kind in _CONTAINER_LISTS for c in spec.get(kind) or []]


def _names(containers: list[Mapping[str, Any]]) -> str:
    words = ", ".join(f'"{c.get("name")}"' for c in containers)
    return f"container {words}" if len(containers) == 1 else f"containers {words}"


def violations(spec: Mapping[str, Any]) -> list[str]:
    """What of pod spec ``spec`` the restricted standard forbids, in the API server's
    words and order; empty when it passes."""
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)

    def sc(c: Mapping[str, Any]) -> Mapping[str, Any]:
        return c.get("securityContext") or {}

    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        out.append(f"host namespaces ({', '.join(host)})")
    privileged = [c for c in containers if sc(c).get("privileged")]
    if privileged:
        out.append(
            f"privileged ({_names(privileged)} must not set securityContext.privileged=true)"
        )
    ports = [c for c in containers if any(p.get("hostPort") for p in c.get("ports") or [])]
    if ports:
        out.append(f"hostPort ({_names(ports)} uses hostPorts)")
    host_path = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_path:
        out.append(f"hostPath volumes (volume {', '.join(repr(n) for n in host_path)})")
    proc = [c for c in containers if sc(c).get("procMount") not in (None, "Default")]
    if proc:
        out.append(f"procMount ({_names(proc)} must not set securityContext.procMount)")
    sysctls = [
        s.get("name") for s in pod_sc.get("sysctls") or [] if s.get("name") not in _SAFE_SYSCTLS
    ]
    if sysctls:
        out.append(f"forbidden sysctls ({', '.join(sysctls)})")
    kinds = sorted(
        {
            k
            for v in spec.get("volumes") or []
            for k in v
            if k != "name" and k not in RESTRICTED_VOLUMES
        }
    )
    if kinds:
        out.append(f"restricted volume types (volume types {', '.join(repr(k) for k in kinds)})")
    escalation = [c for c in containers if sc(c).get("allowPrivilegeEscalation") is not False]
    if escalation:
        out.append(
            f"allowPrivilegeEscalation != false ({_names(escalation)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    caps_drop = [
        c for c in containers if "ALL" not in ((sc(c).get("capabilities") or {}).get("drop") or [])
    ]
    caps_add = [
        c
        for c in containers
        if set((sc(c).get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}
    ]
    if caps_drop or caps_add:
        parts = []
        if caps_drop:
            parts.append(f'{_names(caps_drop)} must set securityContext.capabilities.drop=["ALL"]')
        if caps_add:
            parts.append(
                f"{_names(caps_add)} must not include capabilities other than "
                "NET_BIND_SERVICE in securityContext.capabilities.add"
            )
        out.append(f"unrestricted capabilities ({'; '.join(parts)})")
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_non_root is False or not all(
        sc(c).get("runAsNonRoot", pod_non_root) is True for c in containers
    ):
        unset = [c for c in containers if sc(c).get("runAsNonRoot", pod_non_root) is not True]
        out.append(
            f"runAsNonRoot != true (pod or {_names(unset) if unset else 'pod'} must set "
            "securityContext.runAsNonRoot=true)"
        )
    root = [c for c in containers if sc(c).get("runAsUser", pod_sc.get("runAsUser")) == 0]
    if root:
        out.append(f"runAsUser=0 (pod or {_names(root)} must not set runAsUser=0)")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    unconfined = pod_seccomp == "Unconfined" or any(
        (sc(c).get("seccompProfile") or {}).get("type") == "Unconfined" for c in containers
    )
    no_profile = [
        c
        for c in containers
        if (sc(c).get("seccompProfile") or {}).get("type", pod_seccomp)
        not in ("RuntimeDefault", "Localhost")
    ]
    if unconfined or no_profile:
        where = _names(no_profile) if no_profile else "pod"
        out.append(
            f"seccompProfile (pod or {where} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return out
