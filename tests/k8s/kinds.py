"""The Kubernetes resources the emulated cluster serves, their API paths, and selectors.

Shared by the API server (discovery, label and field selectors), the control loops and the
test fixture, so all three spell a resource's URL the same way. Only the kinds a notebook
launcher and its kubelet touch are here; anything else answers 404 as an unknown resource.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "KINDS",
    "Kind",
    "field_value",
    "kind_of",
    "matches_field_selector",
    "matches_label_selector",
    "path",
]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One served resource: ``plural`` in API group ``group`` at ``version``."""

    plural: str
    group: str
    version: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """kmock's spelling of the resource (``batch/v1/jobs``, ``v1/pods``)."""
        return f"{self.api_version}/{self.plural}"

    @property
    def qualified(self) -> str:
        """The name the API server uses in its messages (``jobs.batch``, ``pods``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


KINDS: dict[str, Kind] = {
    k.plural: k
    for k in (
        Kind("pods", "", "v1", "Pod", True, ("po",), ("status", "log")),
        Kind("secrets", "", "v1", "Secret", True),
        Kind("configmaps", "", "v1", "ConfigMap", True, ("cm",)),
        Kind("services", "", "v1", "Service", True, ("svc",), ("status",)),
        Kind("events", "", "v1", "Event", True, ("ev",)),
        Kind("serviceaccounts", "", "v1", "ServiceAccount", True, ("sa",)),
        Kind("nodes", "", "v1", "Node", False, ("no",), ("status",)),
        Kind("jobs", "batch", "v1", "Job", True, (), ("status",)),
    )
}


def kind_of(resource: str) -> Kind:
    """The served resource named by its plural (``jobs``), kind (``Job``) or short name."""
    for k in KINDS.values():
        if resource in (k.plural, k.kind, k.kind.lower(), *k.short_names):
            return k
    raise ValueError(
        f"resource {resource!r}: the emulated cluster serves only {', '.join(sorted(KINDS))}"
    )


def path(resource: str, name: str | None = None, namespace: str | None = "default") -> str:
    """The API path of a collection (``name`` None) or of one object; ``namespace`` None for
    the collection across all namespaces (ignored for cluster-scoped kinds)."""
    k = kind_of(resource)
    base = f"/apis/{k.group}/{k.version}" if k.group else f"/api/{k.version}"
    if k.namespaced and namespace is not None:
        base += f"/namespaces/{namespace}"
    base += f"/{k.plural}"
    return base if name is None else f"{base}/{name}"


def _split_top_level(selector: str) -> list[str]:
    """``a=b,c in (x,y)`` -> ``["a=b", "c in (x,y)"]``: commas inside parentheses stay."""
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$")
_EQ_RE = re.compile(r"^([^\s!=]+)\s*(==|=|!=)\s*(\S*)$")


def matches_label_selector(labels: Mapping[str, str], selector: str) -> bool:
    """Whether ``labels`` satisfy a Kubernetes label selector string (equality- and set-based
    requirements, ``key`` and ``!key``). A malformed requirement raises ValueError."""
    for requirement in _split_top_level(selector):
        if m := _SET_RE.match(requirement):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            ok = labels.get(key) in values if op == "in" else labels.get(key) not in values
        elif m := _EQ_RE.match(requirement):
            key, op, value = m[1], m[2], m[3]
            ok = labels.get(key) == value if op != "!=" else labels.get(key) != value
        elif requirement.startswith("!"):
            ok = requirement[1:].strip() not in labels
        elif re.fullmatch(r"[^\s!=(),]+", requirement):
            ok = requirement in labels
        else:
            raise ValueError(
                f"label selector {selector!r}: cannot parse {requirement!r}, expected key=value,"
                " key!=value, key in (a,b), key notin (a,b), key or !key"
            )
        if not ok:
            return False
    return True


def field_value(obj: Mapping[str, Any], dotted: str) -> str:
    """The value at a field path (``status.phase``) as a field selector compares it."""
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def matches_field_selector(obj: Mapping[str, Any], selector: str) -> bool:
    """Whether ``obj`` satisfies a field selector (``metadata.name=x,status.phase!=Running``)."""
    for requirement in _split_top_level(selector):
        m = _EQ_RE.match(requirement)
        if m is None:
            raise ValueError(
                f"field selector {selector!r}: cannot parse {requirement!r},"
                " expected field=value or field!=value"
            )
        equal = field_value(obj, m[1]) == m[3]
        if equal != (m[2] != "!="):
            return False
    return True
