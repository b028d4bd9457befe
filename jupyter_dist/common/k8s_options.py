"""The ``--k8s`` options of a session, checked: where its pods run (namespace, kubeconfig
context, image), what each holds (CPUs, memory, GPUs come from ``--gpus``, of the resource
``--k8s-gpu-resource`` names), which machines take them (node selector, tolerations, a pod
template, priority class, scheduler), the Kueue queue that admits them, the address the
pods dial back to, and how long the session waits (queued, its gang scheduled, started)
and may live.

Every check raises a `SpecError` naming the flag, the bad value and what was expected.
Values are kept as the user wrote them (Kubernetes quantities, ``key=value``) and turned
into manifest fields by `control.launchers.k8s_manifests`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, cast

from jupyter_dist.common.payloads import K8sSpecJSON
from jupyter_dist.common.pod_template import MAX_TEMPLATE_BYTES, read_pod_template
from jupyter_dist.errors import SpecError

#: the longest a session may wait for its pods to be scheduled and started (a day)
MAX_WAIT_S = 86400.0
#: the longest a session's Job may live (``activeDeadlineSeconds``): 30 days
MAX_DEADLINE_S = 30 * 86400
#: a session's Job lives this long unless ``--k8s-deadline`` says otherwise (7 days)
DEFAULT_DEADLINE_S = 7 * 86400
#: seconds a pod keeps dialling the notebook after its connection is lost, then exits
DEFAULT_GRACE_S = 60.0
MAX_GRACE_S = 3600.0
#: a queued session waits this long for its queue to admit it (``--k8s-queue-timeout``)
DEFAULT_QUEUE_S = 3600.0
#: every pod must be on a machine this long after the Job is made (or admitted), else the
#: gang is released (``--k8s-gang-timeout``)
DEFAULT_GANG_S = 60.0
#: the extended resource a pod's GPUs are asked as (``--k8s-gpu-resource``)
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
#: the most node selectors or tolerations one session may give
MAX_SELECTORS = 64
#: what ``--cpus`` and ``--memory`` may ask of one pod (its machine must hold it): from a
#: thousandth of a CPU to 4096 CPUs, from 1 MiB to 64 TiB
QUANTITY_BOUNDS = {
    "--cpus": (Decimal("0.001"), Decimal(4096), "0.001 (1m) to 4096"),
    "--memory": (Decimal(2**20), Decimal(2**46), "1Mi to 64Ti"),
}
#: the longest quantity read (``4096``, ``0.125``, ``65536Gi``)
MAX_QUANTITY_CHARS = 24
_SUFFIXES: dict[str, Decimal | int] = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_QUANTITY = re.compile(r"(?:\d+(?:\.\d+)?|\.\d+)(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: a DNS subdomain (a PriorityClass's or scheduler's name), at most 253 characters
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: a LocalQueue's name that is also a label value (Kueue's label names it)
_QUEUE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
_IMAGE = re.compile(r"[^\s\x00-\x1f\x7f]{1,1024}")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):(?P<port>\d{1,5})")


@dataclass(frozen=True)
class K8sSpec:
    """How a session's nodes run as pods of one Kubernetes Job (``--k8s`` and its options).

    ``namespace``/``context``: where (None: the kubeconfig context's namespace, or the
    pod's own in-cluster, else ``default``); ``image``: the pods' image (None: the image of
    the notebook's own pod); ``cpus``/``memory``: each pod's requests and limits, as
    Kubernetes quantities (``"8"``, ``"500m"``, ``"32Gi"``); ``node_selector``:
    ``key=value`` labels the machines must have; ``tolerations``: ``key[=value]:Effect``;
    ``pod_template``: a YAML or JSON file whose pod spec is merged under what the flags
    set; ``callback``: ``HOST:PORT`` the pods dial (None: found in-cluster); ``timeout``:
    seconds to wait for the pods (None: the session's start timeout); ``deadline``:
    seconds the Job may live; ``grace``: seconds a pod keeps dialling a lost notebook.
    ``queue``: a Kueue LocalQueue of the namespace (the Job is made suspended, with
    Kueue's label, and waits ``queue_timeout`` seconds to be admitted); ``gang_timeout``:
    seconds for every pod to be bound to a machine, else all are released;
    ``priority_class``, ``scheduler``: the pods' ``priorityClassName`` and
    ``schedulerName``; ``gpu_resource``: the extended resource ``--gpus`` asks for.
    """

    namespace: str | None = None
    context: str | None = None
    image: str | None = None
    cpus: str | None = None
    memory: str | None = None
    node_selector: tuple[str, ...] = ()
    tolerations: tuple[str, ...] = ()
    pod_template: str | None = None
    callback: str | None = None
    timeout: float | None = None
    deadline: int = DEFAULT_DEADLINE_S
    grace: float = DEFAULT_GRACE_S
    queue: str | None = None
    queue_timeout: float = DEFAULT_QUEUE_S
    gang_timeout: float = DEFAULT_GANG_S
    priority_class: str | None = None
    scheduler: str | None = None
    gpu_resource: str = DEFAULT_GPU_RESOURCE

    def __post_init__(self) -> None:
        if self.namespace is not None:
            check_namespace(self.namespace)
        if self.context is not None and not (
            isinstance(self.context, str)
            and 0 < len(self.context) <= 253
            and self.context.isprintable()
        ):
            raise SpecError(f"--context {self.context!r}: expected a kubeconfig context's name")
        if self.image is not None and not (
            isinstance(self.image, str) and _IMAGE.fullmatch(self.image)
        ):
            raise SpecError(
                f"--image {self.image!r}: expected an image reference such as "
                "registry/team/image:tag (no spaces)"
            )
        for flag, value in (("--cpus", self.cpus), ("--memory", self.memory)):
            if value is not None:
                check_quantity(flag, value)
        if len(self.node_selector) > MAX_SELECTORS or len(self.tolerations) > MAX_SELECTORS:
            raise SpecError(
                f"--node-selector/--toleration: {len(self.node_selector)} and "
                f"{len(self.tolerations)} given; expected at most {MAX_SELECTORS} of each"
            )
        for item in self.node_selector:
            parse_selector(item)
        for item in self.tolerations:
            parse_toleration(item)
        if self.pod_template is not None and not (
            isinstance(self.pod_template, str) and self.pod_template.strip()
        ):
            raise SpecError(f"--pod-template {self.pod_template!r}: expected a file's path")
        if self.callback is not None:
            check_callback(self.callback)
        _check_seconds("--k8s-timeout", self.timeout, MAX_WAIT_S, optional=True)
        _check_seconds("--k8s-grace", self.grace, MAX_GRACE_S)
        _check_seconds("--k8s-queue-timeout", self.queue_timeout, MAX_WAIT_S)
        _check_seconds("--k8s-gang-timeout", self.gang_timeout, MAX_WAIT_S)
        if self.queue is not None:
            check_queue(self.queue)
        for flag, name in (
            ("--k8s-priority-class", self.priority_class),
            ("--k8s-scheduler", self.scheduler),
        ):
            if name is not None:
                check_object_name(flag, name)
        check_gpu_resource(self.gpu_resource)
        if (
            isinstance(self.deadline, bool)
            or not isinstance(self.deadline, int)
            or not 60 <= self.deadline <= MAX_DEADLINE_S
        ):
            raise SpecError(
                f"--k8s-deadline {self.deadline!r}: expected whole seconds, 60 to {MAX_DEADLINE_S}"
            )

    def selector_dict(self) -> dict[str, str]:
        return dict(parse_selector(item) for item in self.node_selector)

    def toleration_dicts(self) -> list[dict[str, str]]:
        return [parse_toleration(item) for item in self.tolerations]

    def to_json(self) -> K8sSpecJSON:
        data = dataclasses.asdict(self)
        data["node_selector"] = list(self.node_selector)
        data["tolerations"] = list(self.tolerations)
        return cast(K8sSpecJSON, data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> K8sSpec:
        """From `to_json` or a request's ``k8s`` object; unknown keys are refused."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(
                f"k8s: unknown field {unknown[0]!r}; expected {', '.join(sorted(known))}"
            )
        fields = dict(data)
        for key in ("node_selector", "tolerations"):
            value = fields.get(key, ())
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise SpecError(f"k8s.{key}: {str(value)[:80]!r}: expected a list of strings")
            fields[key] = tuple(value)
        return cls(**fields)


def _check_seconds(flag: str, value: object, most: float, optional: bool = False) -> None:
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= most
    ):
        raise SpecError(f"{flag} {value!r}: expected seconds, more than 0, at most {most:.0f}")


def check_namespace(value: str) -> str:
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise SpecError(
            f"--namespace {value!r}: expected a Kubernetes namespace (lower-case letters, "
            "digits and '-', at most 63, starting and ending with a letter or digit)"
        )
    return value


def _shown(value: object) -> str:
    """``value`` as a refusal repeats it: whole, or its start and length when long."""
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:40]!r}... ({len(value)} characters)"
    return repr(value)


def check_queue(value: str) -> str:
    """``--k8s-queue NAME``: a Kueue LocalQueue's name, which Kueue's label on the Job
    carries (so at most 63 characters)."""
    if not isinstance(value, str) or not _QUEUE_NAME.fullmatch(value):
        raise SpecError(
            f"--k8s-queue {_shown(value)}: expected the name of a Kueue LocalQueue in the "
            "session's namespace (lower-case letters, digits, '-' and '.', at most 63, "
            "starting and ending with a letter or digit), e.g. team-gpus"
        )
    return value


def check_object_name(flag: str, value: str) -> str:
    """A PriorityClass's or a scheduler's name: a DNS subdomain."""
    if not isinstance(value, str) or not _DNS_SUBDOMAIN.fullmatch(value):
        raise SpecError(
            f"{flag} {_shown(value)}: expected a Kubernetes name (lower-case letters, "
            "digits, '-' and '.', at most 253, starting and ending with a letter or digit), "
            "e.g. high-priority or volcano"
        )
    return value


def check_gpu_resource(value: str) -> str:
    """``--k8s-gpu-resource NAME``: an extended resource as Kubernetes takes one in a
    container's limits: ``DOMAIN/NAME``, its domain not Kubernetes' own (``nvidia.com/gpu``,
    ``nvidia.com/mig-1g.10gb``, ``amd.com/gpu``, ``gpu.intel.com/i915``)."""
    prefix, slash, name = value.partition("/") if isinstance(value, str) else ("", "", "")
    native = prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    if (
        not slash
        or native
        or "." not in prefix
        or not _DNS_SUBDOMAIN.fullmatch(prefix)
        or not _LABEL_NAME.fullmatch(name)
        # Kubernetes asks that "requests." + the name be a qualified name too
        or len(name) > 63 - len("requests.")
    ):
        raise SpecError(
            f"--k8s-gpu-resource {_shown(value)}: expected an extended resource name "
            "DOMAIN/NAME as the machines' device plugin offers it, e.g. nvidia.com/gpu, "
            "nvidia.com/mig-1g.10gb or amd.com/gpu"
            + ("; kubernetes.io names Kubernetes' own resources" if native else "")
        )
    return value


def check_quantity(flag: str, value: str) -> str:
    """A Kubernetes resource quantity (``8``, ``0.5``, ``500m``, ``32Gi``) within
    `QUANTITY_BOUNDS` of ``flag`` (more than 0 for a flag it does not name)."""
    low, high, words = QUANTITY_BOUNDS.get(flag, (Decimal(0), None, "more than 0"))
    shown = (
        repr(value)
        if not isinstance(value, str) or len(value) <= 40
        else (f"{value[:24]!r}... ({len(value)} characters)")
    )
    amount = _quantity(value)
    if amount is None:
        raise SpecError(
            f"{flag} {shown}: expected a Kubernetes quantity, {words}, such as 8, 500m, 16Gi"
        )
    if not (amount >= low and amount > 0) or (high is not None and amount > high):
        raise SpecError(f"{flag} {shown}: expected {words} (a Kubernetes quantity)")
    return value


def _quantity(value: object) -> Decimal | None:
    """``value``'s amount (CPUs, bytes), or None where it is no quantity we take."""
    if not isinstance(value, str) or len(value) > MAX_QUANTITY_CHARS:
        return None
    if not _QUANTITY.fullmatch(value):
        return None
    number = value.rstrip("mkMGTPEi")
    try:
        return Decimal(number) * Decimal(_SUFFIXES[value[len(number) :]])
    except (InvalidOperation, KeyError):
        return None


def check_label_key(flag: str, key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_NAME.fullmatch(name) or (slash and not _LABEL_PREFIX.fullmatch(prefix)):
        raise SpecError(
            f"{flag} {key!r}: expected a label key such as kubernetes.io/arch or "
            "gpu-type (an optional DNS prefix and '/', then at most 63 letters, digits, "
            "'-', '_', '.')"
        )
    return key


def parse_selector(item: str) -> tuple[str, str]:
    """``--node-selector key=value``."""
    key, eq, value = item.partition("=") if isinstance(item, str) else ("", "", "")
    if not eq:
        raise SpecError(
            f"--node-selector {item!r}: expected key=value, e.g. "
            "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
        )
    check_label_key("--node-selector", key)
    if value and not _LABEL_NAME.fullmatch(value):
        raise SpecError(
            f"--node-selector {item!r}: value {value!r}: expected at most 63 letters, digits, "
            "'-', '_', '.'"
        )
    return key, value


def parse_toleration(item: str) -> dict[str, str]:
    """``--toleration key[=value]:Effect`` (no value: the key exists with any value)."""
    rest, colon, effect = item.rpartition(":") if isinstance(item, str) else ("", "", "")
    if not colon or effect not in TOLERATION_EFFECTS or not rest:
        raise SpecError(
            f"--toleration {item!r}: expected key[=value]:Effect with Effect one of "
            f"{', '.join(TOLERATION_EFFECTS)}, e.g. nvidia.com/gpu:NoSchedule"
        )
    key, eq, value = rest.partition("=")
    check_label_key("--toleration", key)
    if eq:
        if value and not _LABEL_NAME.fullmatch(value):
            raise SpecError(f"--toleration {item!r}: value {value!r}: expected a label value")
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def check_callback(value: str) -> tuple[str, int]:
    """``--k8s-callback HOST:PORT``: where the pods dial (this side listens on PORT)."""
    match = _HOST_PORT.fullmatch(value) if isinstance(value, str) else None
    if match is None or not 0 < int(match["port"]) < 65536:
        raise SpecError(
            f"--k8s-callback {value!r}: expected HOST:PORT the pods can reach, with a port "
            "1-65535 (e.g. 10.0.3.7:7077 or notebook.team.svc:7077)"
        )
    return match["host"].strip("[]"), int(match["port"])


__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_GANG_S",
    "DEFAULT_GPU_RESOURCE",
    "DEFAULT_GRACE_S",
    "DEFAULT_QUEUE_S",
    "MAX_TEMPLATE_BYTES",
    "QUANTITY_BOUNDS",
    "K8sSpec",
    "check_callback",
    "check_gpu_resource",
    "check_namespace",
    "check_object_name",
    "check_quantity",
    "check_queue",
    "parse_selector",
    "parse_toleration",
    "read_pod_template",
]
