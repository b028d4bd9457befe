"""A ``--pod-template`` merged under the pod that a ``--k8s`` session's flags make
(`k8s_manifests.job_manifest`): the template fills in, ours wins.

The template was read and checked by `common.pod_template.read_pod_template` (bounds, no
command for the node's container, the keys' volumes its own); here the node container's
command and args are ours alone whatever the template says.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_template(
    template: Mapping[str, Any], meta: dict[str, Any], spec: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``template`` (a PodTemplateSpec, `common.k8s_options.read_pod_template`) under what
    the flags set: its fields fill in what ours leave out; lists of named things (volumes,
    env, mounts, tolerations, init containers) are joined, ours winning a name both have
    and coming after theirs (our init container runs last); its one container, if any, is
    merged into the node's, whose command and args are ours alone."""
    out_meta = copy.deepcopy(dict(template.get("metadata") or {}))
    for key in ("labels", "annotations"):
        merged = {**(out_meta.get(key) or {}), **(meta.get(key) or {})}
        if merged:
            out_meta[key] = merged
    theirs = copy.deepcopy(dict(template.get("spec") or {}))
    their_containers = theirs.pop("containers", None) or []
    out_spec = {**theirs}
    for key, value in spec.items():
        if key == "containers":
            continue
        if isinstance(value, list) and isinstance(out_spec.get(key), list):
            out_spec[key] = _join_named(out_spec[key], value)
        else:
            out_spec[key] = value
    ours = copy.deepcopy(spec["containers"][0])
    if their_containers:
        base = dict(their_containers[0])
        for key, value in ours.items():
            if key in ("command", "args"):  # ours alone (a template's are refused)
                base[key] = value
            elif isinstance(value, list) and isinstance(base.get(key), list):
                base[key] = _join_named(base[key], value)
            elif isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = _deep_merge(base[key], value)
            else:
                base[key] = value
        ours = base
    out_spec["containers"] = [ours]
    return out_meta, out_spec


def _join_named(theirs: list[Any], ours: list[Any]) -> list[Any]:
    """Both lists; an entry of theirs whose ``name`` (or ``key``) one of ours has is
    dropped."""

    def ident(item: Any) -> Any:
        return item.get("name", item.get("key")) if isinstance(item, dict) else None

    taken = {ident(x) for x in ours} - {None}
    return [x for x in theirs if ident(x) not in taken] + list(ours)


def _deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


__all__ = ["merge_template"]
