"""What a session's Ray driver asks the cluster for and what the cluster has, in words, and
the names the session's things take there.

Part of the session's driver process (``ray_driver``): Ray is imported inside its
functions. `infeasible` says why no placement could ever hold a request on the cluster's
nodes, before anything is asked; `cluster_text` and `ask_text` are what the driver's
progress and errors say. Every name is under ``jupyter_dist/OWNER/`` in the
`NAMESPACE` namespace (`owner_prefix`, `group_name`, `actor_name`); `remove_named`
removes what a prefix names, and nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

#: the Ray namespace of every session's actors and placement groups
NAMESPACE = "jupyter_dist"
#: the first word of every name this project gives on a cluster
NAME_PREFIX = "jupyter_dist/"


# -- what is asked and what the cluster has ------------------------------------------------
def bundle_text(bundle: Mapping[str, float]) -> str:
    """``{"GPU": 4, "CPU": 1}`` -> ``"4 GPUs, 1 CPU"``."""
    parts = []
    for key in ("GPU", "CPU"):
        count = bundle.get(key, 0)
        if count:
            parts.append(f"{_num(count)} {key}{'s' if count != 1 else ''}")
    parts += [f"{_num(v)} {k}" for k, v in bundle.items() if k not in ("GPU", "CPU") and v]
    return ", ".join(parts) or "nothing"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def ask_text(bundles: Sequence[Mapping[str, float]], strategy: str) -> str:
    """``"2 bundles of 4 GPUs, 1 CPU (STRICT_SPREAD: one machine each)"``."""
    texts = [bundle_text(b) for b in bundles]
    if len(set(texts)) == 1:
        what = f"{len(bundles)} bundle{'s' if len(bundles) != 1 else ''} of {texts[0]}"
    else:
        what = "bundles of " + "; ".join(texts)
    how = {"STRICT_SPREAD": "one machine each", "PACK": "as few machines as fit"}
    return f"{what} ({strategy}{': ' + how[strategy] if strategy in how else ''})"


def node_text(node: Mapping[str, Any], key: str = "Resources") -> str:
    resources = node.get(key) or {}
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU")}
    return f"{node.get('NodeManagerAddress', '?')} ({bundle_text(shown)})"


def cluster_text(nodes: Sequence[Mapping[str, Any]]) -> str:
    alive = [n for n in nodes if n.get("Alive")]
    listed = "; ".join(node_text(n) for n in alive[:16])
    more = f"; and {len(alive) - 16} more" if len(alive) > 16 else ""
    return f"the cluster has {len(alive)} node{'s' if len(alive) != 1 else ''}: {listed}{more}"


def fits(bundle: Mapping[str, float], resources: Mapping[str, float]) -> bool:
    return all(resources.get(k, 0) >= v for k, v in bundle.items() if v)


def infeasible(
    bundles: Sequence[Mapping[str, float]], strategy: str, nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no placement could ever hold the bundles on these nodes (their totals), or None."""
    totals = [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive")]
    for index, bundle in enumerate(bundles):
        if not any(fits(bundle, t) for t in totals):
            return f"no node can hold bundle {index} ({bundle_text(bundle)})"
    if strategy == "STRICT_SPREAD":
        # one machine each: match the largest bundles first, each to a free node it fits
        free = list(range(len(totals)))
        order = sorted(range(len(bundles)), key=lambda i: -sum(bundles[i].values()))
        for index in order:
            home = next((n for n in free if fits(bundles[index], totals[n])), None)
            if home is None:
                holding = sum(1 for t in totals if fits(bundles[index], t))
                return (
                    f"{len(bundles)} bundles need {len(bundles)} machines, and "
                    f"{holding} can hold one"
                )
            free.remove(home)
        return None
    for key in {k for b in bundles for k in b}:
        want = sum(b.get(key, 0) for b in bundles)
        have = sum(t.get(key, 0) for t in totals)
        if want > have:
            return f"{_num(want)} {key} asked in all, {_num(have)} in the cluster"
    return None


def free_nodes(bundles: Sequence[Mapping[str, float]], nodes: Sequence[Mapping[str, Any]]) -> int:
    """How many alive nodes could take one more bundle now (from what Ray says is free)."""
    from ray._private.state import available_resources_per_node

    available: dict[str, dict[str, float]] = available_resources_per_node()  # type: ignore[no-untyped-call]
    count = 0
    for node in nodes:
        if not node.get("Alive"):
            continue
        free = available.get(str(node.get("NodeID")), {})
        if any(fits(b, free) for b in bundles):
            count += 1
    return count


def cluster_nodes() -> list[dict[str, Any]]:
    """Ray's list of the cluster's nodes (``Alive``, ``Resources``, ``NodeManagerAddress``)."""
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def node_ip() -> str:
    """This process's address as Ray sees it."""
    import ray

    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return ip


# -- names ---------------------------------------------------------------------------------
def owner_prefix(owner: str) -> str:
    """The prefix of every name ``owner`` gives on a cluster: ``jupyter_dist/OWNER/``."""
    return f"{NAME_PREFIX}{owner}/"


def group_name(owner: str, session: str) -> str:
    return f"{owner_prefix(owner)}{session}"


def actor_name(owner: str, session: str, node: int) -> str:
    return f"{group_name(owner, session)}/{node}"


def remove_named(prefix: str, exact_group: str | None = None) -> list[str]:
    """Kill this namespace's actors named under ``prefix`` and remove its placement groups
    named ``exact_group`` or under ``prefix``; what was removed, by name."""
    import ray
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    removed = []
    for name in ray.util.list_named_actors(all_namespaces=False):
        if not name.startswith(prefix):
            continue
        with contextlib.suppress(ValueError):  # gone in between
            ray.kill(ray.get_actor(name), no_restart=True)
            removed.append(name)
    for pg_id, info in placement_group_table().items():
        name = str(info.get("name", ""))
        wanted = name == exact_group or name.startswith(prefix)
        if wanted and info.get("state") not in ("REMOVED",):
            pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id)))
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
                removed.append(name)
    return removed
