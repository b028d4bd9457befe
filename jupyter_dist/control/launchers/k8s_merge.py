"""A ``--pod-template`` merged with the pod that a ``--k8s`` session's flags make
(`k8s_manifests.job_manifest`): nothing the template sets is dropped.

The template was read and checked by `common.pod_template.read_pod_template` (bounds, no
command for the node's container, the keys' volumes its own). Here, field by field:

* mappings are merged key by key, at every depth (``affinity``, ``nodeSelector``,
  ``resources``, labels, ...);
* lists are joined: entries with a ``name`` by name (volumes, env, mounts, init
  containers: one of ours and one of theirs of the same name are merged as mappings, ours
  after theirs: our init container runs last), other entries (tolerations, affinity
  terms) one after the other, an entry both have once;
* a value both set: what a flag or jupyter_dist's Job needs wins (``--cpus``,
  ``--image``, ``--node-selector``...); but the fields in `NEEDED` are refused by name when
  the template sets them otherwise, and so is a field whose type differs from ours (a
  mapping against a list): merging either would drop one side;
* the template's one container, if any, is merged into the node's, whose command and args
  are ours alone; its name, if it gives one, is kept (nothing needs ours, ``node``).

What jupyter_dist sets only as a default (`k8s_policy`: the security context, the mesh
sidecars' labels, ``/dev/shm``, the service-account token) is filled in afterwards, where
neither the template nor a flag said anything.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from jupyter_dist.errors import SpecError

#: where the template may not differ from what jupyter_dist's Job needs, and why
NEEDED = {
    "spec.restartPolicy": "a lost node is healed with a new pod of its index, never restarted "
    "in place; remove it",
    "metadata.labels": "jupyter_dist finds the session's pods by its labels; use another key",
}


def merge_template(
    template: Mapping[str, Any], meta: dict[str, Any], spec: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``template`` (a PodTemplateSpec, `common.pod_template.read_pod_template`) merged
    with ours (``meta`` and ``spec``, what the flags and the Job need); a `SpecError`
    naming the template's field that cannot be merged (see the module's docstring)."""
    out_meta = merge(template.get("metadata") or {}, meta, "metadata")
    theirs = copy.deepcopy(dict(template.get("spec") or {}))
    their_containers = theirs.pop("containers", None) or []
    ours = {k: v for k, v in spec.items() if k != "containers"}
    out_spec = merge(theirs, ours, "spec")
    mine = spec["containers"][0]
    node = copy.deepcopy(mine)
    if their_containers:
        node = merge(their_containers[0], mine, "spec.containers[0]")
        for key in ("command", "args"):  # ours alone (a template's are refused when read)
            node[key] = copy.deepcopy(mine[key])
        if their_containers[0].get("name"):  # a name of theirs is kept: nothing needs ours
            node["name"] = their_containers[0]["name"]
    out_spec["containers"] = [node]
    return out_meta, out_spec


def merge(theirs: Any, ours: Any, where: str) -> Any:
    """``theirs`` and ``ours`` as one (see the module's docstring); ``where`` is the
    field's path, for the error."""
    if isinstance(theirs, Mapping) and isinstance(ours, Mapping):
        out = copy.deepcopy(dict(theirs))
        for key, value in ours.items():
            out[key] = merge(out[key], value, f"{where}.{key}") if key in out else value
        return out
    if isinstance(theirs, list) and isinstance(ours, list):
        return _join(theirs, ours, where)
    if _kind(theirs) != _kind(ours) and theirs is not None:
        raise SpecError(
            f"--pod-template: {where}: {_kind(theirs)} {_short(theirs)}, where jupyter_dist "
            f"sets {_kind(ours)} {_short(ours)}; expected {_kind(ours)} (the two cannot be merged)"
        )
    need = next((why for path, why in NEEDED.items() if where.startswith(path)), None)
    if need is not None and theirs != ours:
        raise SpecError(
            f"--pod-template: {where}: {_short(theirs)}, where jupyter_dist sets "
            f"{_short(ours)}: {need}"
        )
    return copy.deepcopy(ours)


def _join(theirs: list[Any], ours: list[Any], where: str) -> list[Any]:
    named = {_name(x): n for n, x in enumerate(ours) if _name(x) is not None}
    out: list[Any] = []
    for item in theirs:
        name = _name(item)
        if name is not None and name in named:
            continue  # merged where ours is
        if item not in ours:
            out.append(copy.deepcopy(item))
    for item in ours:
        name = _name(item)
        mine = next((x for x in theirs if name is not None and _name(x) == name), None)
        out.append(merge(mine, item, f"{where}[{name}]") if mine is not None else item)
    return out


def _name(item: Any) -> str | None:
    return item.get("name") if isinstance(item, Mapping) else None


def _kind(value: Any) -> str:
    """A mapping, a list or a value (text, a number, true/false: ``cpu: 8`` and ``"8"``
    are one quantity, so values of different types still merge, ours winning)."""
    if isinstance(value, Mapping):
        return "a mapping"
    return "a list" if isinstance(value, list) else "a value"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["NEEDED", "merge", "merge_template"]
