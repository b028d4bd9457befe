"""The container runtime of the emulated kubelet: a pod's containers as local processes.

What a pod's process gets, as a kubelet would give it:

* argv: ``command`` + ``args`` (no image, so no entrypoint: without ``command`` the args
  are the whole argv), with ``$(VAR)`` expanded from the container's env as Kubernetes
  expands it (``$$`` escapes, unknown names stay as written); ``python`` / ``python3`` /
  ``pythonX.Y`` as argv[0] is this interpreter (``sys.executable``);
* environment: this process's ``os.environ`` (the test's: PYTHONPATH and so on carry), then
  what Kubernetes adds (``HOSTNAME`` = pod name, ``KUBERNETES_SERVICE_HOST``/``PORT`` = the
  API server), then ``envFrom`` and ``env`` in order: plain values (``$(VAR)`` expanded from
  the vars before), ``fieldRef`` (metadata.name / namespace / uid, labels['k'],
  annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP, status.hostIP),
  ``secretKeyRef`` and ``configMapKeyRef`` (read through the API);
* volumes, made once per pod (`prepare`) and shared by its containers: ``secret`` and
  ``configMap`` written to a fresh private (0700) directory per pod (file modes
  ``defaultMode`` or the item's ``mode``, default 0644; ``items`` honoured), ``emptyDir``
  an empty one; the bind mount is played by replacing every occurrence of a container's
  own ``mountPath`` (with ``subPath`` appended) in its argv, env values and
  ``workingDir`` by that directory. Other volume types are ignored;
* cwd: ``workingDir`` where it exists here, else the kubelet's own cwd;
* a new session (its own process group); stdout and stderr to the container's log file.

The order (`run_order`): the init containers, one after another, each to its end, then
the pod's one container.

Not played: images, more than one container, sidecar init containers (``restartPolicy:
Always``: skipped), restarts, probes, resource limits, the service-account token mount,
isolation between a pod's containers (a container's mounts are what its argv, env and
cwd name; nothing hides the pod's other volumes from it) and network isolation (the
kubelet preloads ``pod_network.c`` so the process leaves from its pod IP; nothing else
separates pods), and the security context: the API server checks it (the restricted Pod
Security Standard, ``pod_security.py``), but every process runs as the kubelet's own user,
whatever ``runAsUser`` says (the test's interpreter need not be readable by another user).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.k8s.kube_client import ApiClient, ApiError

__all__ = [
    "ConfigError",
    "LaunchPlan",
    "PodSandbox",
    "expand",
    "plan_container",
    "prepare",
    "run_order",
    "start",
]

_PYTHON = re.compile(r"python(3(\.\d+)?)?")
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


class ConfigError(Exception):
    """The container cannot be created yet: ``reason`` as the kubelet reports it (e.g.
    CreateContainerConfigError), the message naming what is missing."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True)
class PodSandbox:
    """A pod's private directory and its volumes' directories in it, by volume name."""

    path: Path
    volumes: dict[str, Path]


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What to run for one container of a pod, and where the pod's private directories are."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    sandbox: Path
    container: str = ""
    init: bool = False


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names replaced, ``$$`` -> ``$``, the rest kept."""

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        return env.get(m[1], m[0])

    return _REF.sub(one, text)


def _field(pod: Mapping[str, Any], field_path: str, ips: Mapping[str, str]) -> str:
    meta = pod.get("metadata", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": pod.get("spec", {}).get("nodeName"),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", "default"),
        "status.podIP": ips["podIP"],
        "status.podIPs": ips["podIP"],
        "status.hostIP": ips["hostIP"],
    }
    if field_path in simple:
        return str(simple[field_path] or "")
    if m := _FIELD.fullmatch(field_path):
        return str((meta.get(m[1]) or {}).get(m[2], ""))
    raise ConfigError(
        "CreateContainerConfigError",
        f"unsupported fieldRef {field_path!r}: expected one of {', '.join(simple)},"
        " metadata.labels['k'] or metadata.annotations['k']",
    )


async def _key_of(
    client: ApiClient, resource: str, ref: Mapping[str, Any], namespace: str
) -> str | None:
    """The value of ``ref.key`` in Secret/ConfigMap ``ref.name``; None where optional and absent."""
    singular = "secret" if resource == "secrets" else "configmap"
    try:
        obj = await client.get(resource, ref["name"], namespace)
    except ApiError as e:
        if e.status == 404 and ref.get("optional"):
            return None
        raise ConfigError(
            "CreateContainerConfigError", f'{singular} "{ref["name"]}" not found'
        ) from e
    data = obj.get("data") or {}
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise ConfigError(
            "CreateContainerConfigError",
            f"couldn't find key {ref['key']} in {singular.capitalize()} {namespace}/{ref['name']}",
        )
    value = data[ref["key"]]
    return base64.b64decode(value).decode() if resource == "secrets" else str(value)


async def _environment(
    client: ApiClient,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    ips: Mapping[str, str],
    api_port: int,
) -> dict[str, str]:
    """The variables the pod declares, in order, after what Kubernetes adds itself."""
    namespace = pod["metadata"]["namespace"]
    declared: dict[str, str] = {
        "HOSTNAME": pod["metadata"]["name"],
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api_port),
    }
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for resource, key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
            if key not in source:
                continue
            ref = source[key]
            try:
                obj = await client.get(resource, ref["name"], namespace)
            except ApiError as e:
                if e.status == 404 and ref.get("optional"):
                    continue
                raise ConfigError(
                    "CreateContainerConfigError", f'{resource[:-1]} "{ref["name"]}" not found'
                ) from e
            for name, raw in (obj.get("data") or {}).items():
                declared[prefix + name] = (
                    base64.b64decode(raw).decode() if resource == "secrets" else str(raw)
                )
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        value: str | None
        if source is None:
            value = expand(str(var.get("value", "")), declared)
        elif "fieldRef" in source:
            value = _field(pod, source["fieldRef"]["fieldPath"], ips)
        elif "secretKeyRef" in source:
            value = await _key_of(client, "secrets", source["secretKeyRef"], namespace)
        elif "configMapKeyRef" in source:
            value = await _key_of(client, "configmaps", source["configMapKeyRef"], namespace)
        else:
            raise ConfigError(
                "CreateContainerConfigError",
                f"env {var['name']}: unsupported valueFrom {sorted(source)}",
            )
        if value is not None:
            declared[var["name"]] = value
    return declared


def _write_files(
    directory: Path, data: Mapping[str, str], volume: Mapping[str, Any], binary: bool
) -> None:
    default_mode = int(volume.get("defaultMode", 0o644))
    items = volume.get("items") or [{"key": key, "path": key} for key in data]
    for item in items:
        if item["key"] not in data:
            if volume.get("optional"):
                continue
            raise ConfigError("ContainerCreating", f"volume item key {item['key']!r} not found")
        target = directory / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        raw = data[item["key"]]
        target.write_bytes(base64.b64decode(raw) if binary else str(raw).encode())
        target.chmod(int(item.get("mode", default_mode)))


async def _volumes(client: ApiClient, pod: Mapping[str, Any], sandbox: Path) -> dict[str, Path]:
    """Each volume's directory on this machine, by volume name."""
    namespace = pod["metadata"]["namespace"]
    dirs: dict[str, Path] = {}
    for volume in pod.get("spec", {}).get("volumes") or []:
        name = volume["name"]
        directory = sandbox / "volumes" / name
        for resource, key, ref_name in (
            ("secrets", "secret", "secretName"),
            ("configmaps", "configMap", "name"),
        ):
            if key not in volume:
                continue
            source = volume[key]
            directory.mkdir(parents=True, mode=0o700)
            try:
                obj = await client.get(resource, source[ref_name], namespace)
            except ApiError as e:
                if e.status == 404 and source.get("optional"):
                    break
                raise ConfigError(
                    "ContainerCreating",
                    f'MountVolume.SetUp failed for volume "{name}" : {resource[:-1]}'
                    f' "{source[ref_name]}" not found',
                ) from e
            _write_files(directory, obj.get("data") or {}, source, binary=resource == "secrets")
        if "emptyDir" in volume:
            directory.mkdir(parents=True, mode=0o700)
        if directory.exists():
            dirs[name] = directory
    return dirs


def _mounts(
    container: Mapping[str, Any], dirs: Mapping[str, Path]
) -> list[tuple[re.Pattern[str], str]]:
    """(mountPath pattern, local directory) pairs, longest mountPath first."""
    pairs = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in dirs:
            continue
        local = dirs[mount["name"]] / mount.get("subPath", "")
        pattern = re.compile(re.escape(mount["mountPath"].rstrip("/")) + r"(?=/|$|[^\w.-])")
        pairs.append((len(mount["mountPath"]), pattern, str(local).rstrip("/")))
    return [(p, local) for _, p, local in sorted(pairs, key=lambda t: -t[0])]


def _mounted(text: str, mounts: list[tuple[re.Pattern[str], str]]) -> str:
    for pattern, local in mounts:
        text = pattern.sub(local.replace("\\", "\\\\"), text)
    return text


def run_order(pod: Mapping[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """The containers ``pod`` runs, in order, each with whether it is an init container:
    its init containers (not the sidecars) and then its one container; ConfigError when
    it has not exactly one."""
    spec = pod.get("spec", {})
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise ConfigError(
            "CreateContainerConfigError",
            f"{len(containers)} containers: the emulated kubelet runs exactly one",
        )
    inits = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") != "Always"]
    return [*((c, True) for c in inits), (containers[0], False)]


async def prepare(client: ApiClient, pod: Mapping[str, Any], sandbox_root: Path) -> PodSandbox:
    """The pod's private directory and its volumes; ConfigError (nothing left) if a volume
    cannot be made yet."""
    sandbox = Path(tempfile.mkdtemp(prefix=f"{pod['metadata']['name']}-", dir=sandbox_root))
    try:
        return PodSandbox(sandbox, await _volumes(client, pod, sandbox))
    except BaseException:
        shutil.rmtree(sandbox, ignore_errors=True)
        raise


async def plan_container(
    client: ApiClient,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    sandbox: PodSandbox,
    ips: Mapping[str, str],
    api_port: int,
    init: bool = False,
) -> LaunchPlan:
    """Resolve env, mounts and argv of ``container``; ConfigError if it cannot be yet."""
    mounts = _mounts(container, sandbox.volumes)
    declared = {
        k: _mounted(v, mounts)
        for k, v in (await _environment(client, pod, container, ips, api_port)).items()
    }
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv:
        raise ConfigError(
            "CreateContainerConfigError",
            "no command or args: images are not run here, so there is no entrypoint",
        )
    argv = [_mounted(expand(str(a), declared), mounts) for a in argv]
    if _PYTHON.fullmatch(os.path.basename(argv[0])):
        argv[0] = sys.executable
    workdir = _mounted(container.get("workingDir") or "", mounts)
    cwd = workdir if workdir and os.path.isdir(workdir) else os.getcwd()
    return LaunchPlan(
        argv=argv,
        env={**os.environ, **declared},
        cwd=cwd,
        sandbox=sandbox.path,
        container=str(container.get("name", "")),
        init=init,
    )


def start(plan: LaunchPlan, log_file: Path) -> subprocess.Popen[bytes]:
    """Start the planned process in its own session; OSError if it cannot be executed."""
    with log_file.open("ab") as out:
        return subprocess.Popen(
            plan.argv,
            env=plan.env,
            cwd=plan.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
