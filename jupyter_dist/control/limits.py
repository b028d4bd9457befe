"""How much one owner of sessions (a Jupyter server, or a notebook kernel) runs at once.

Two limits, checked by `check_room` when a session is about to start, before anything of
it runs: how many sessions the owner holds, and how many ranks all of them together put
on one node. A node is known by its host name (`node_of`): this machine's sessions, and
those that reach it as ``localhost`` or by its own name, count together; two aliases of
one machine in an ssh config count apart. Sessions still starting count as running, so
that two requests at once cannot both take the last room.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.errors import LimitError
from jupyter_dist.settings import MAX_RANKS_VAR

#: names that always mean the machine the owner runs on
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class SessionLimits:
    """The owner's limits, and how a refusal tells the user to raise them."""

    max_sessions: int | None = None  # None: any number
    #: ranks of all sessions together on one node; None: no cap across sessions (each
    #: session alone is held to `SessionDefaults.max_ranks_per_node`)
    max_node_ranks: int | None = None
    owner: str = "this process"  # who holds the sessions, as a refusal names it
    sessions_setting: str = "max_sessions"  # what raises `max_sessions`
    node_ranks_setting: str = MAX_RANKS_VAR  # what raises the ranks a node takes

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_node_ranks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"SessionLimits.{name} {value}: expected None or at least 1")


def node_of(host: HostSpec | None, here: str) -> str:
    """The node a session's host is, by name; ``None`` (no host) and the names of this
    machine are ``here``."""
    if host is None:
        return here
    name = host.name.lower()
    if name in LOOPBACK_NAMES or name in (here.lower(), here.split(".", 1)[0].lower()):
        return here
    return host.name


def ranks_by_node(spec: SessionSpec, here: str) -> Counter[str]:
    """How many ranks ``spec`` runs on each node (two of its hosts that are one machine
    count together)."""
    found: Counter[str] = Counter()
    for index, count in enumerate(spec.counts):
        if spec.remote and not spec.hosts:  # placed by a cluster manager: not known here
            found[f"{spec.launcher} node {index} of session {spec.name}"] += count
            continue
        found[node_of(spec.hosts[index] if spec.hosts else None, here)] += count
    return found


def check_room(
    spec: SessionSpec,
    running: Mapping[str, SessionSpec],
    starting: Mapping[str, SessionSpec],
    limits: SessionLimits,
    node_max: int,
    here: str,
) -> None:
    """Raise `LimitError` if session ``spec`` would pass ``limits`` beside the sessions
    ``running`` and ``starting`` (by name; neither holds ``spec``'s own); ``node_max``:
    unused when ``limits.max_node_ranks`` is None (no cap across sessions)."""
    held = {**running, **starting}
    if limits.max_sessions is not None and len(held) >= limits.max_sessions:
        setting = limits.sessions_setting
        raise LimitError(
            f"session {spec.name!r}: {limits.owner} runs {len(held)} session"
            f"{'s' if len(held) != 1 else ''} already ({_names(held, starting)}), the most it "
            f"may ({setting} = {limits.max_sessions}); shut one down (`%dist shutdown "
            f"--session NAME`) or raise {setting}"
        )
    if limits.max_node_ranks is None:  # no cap across sessions: each has its own
        return
    most = limits.max_node_ranks
    usage = {name: ranks_by_node(other, here) for name, other in held.items()}
    for node, count in sorted(ranks_by_node(spec, here).items()):
        holders = {name: ranks[node] for name, ranks in usage.items() if ranks[node]}
        there = sum(holders.values())
        if there + count <= most:
            continue
        setting = limits.node_ranks_setting
        who = ", ".join(
            f"{name!r}: {ranks}{' (starting)' if name in starting else ''}"
            for name, ranks in sorted(holders.items())
        )
        raise LimitError(
            f"session {spec.name!r}: {count} rank{'s' if count != 1 else ''} on node "
            f"{node!r} would make {there + count} there, more than the {most} that "
            f"{limits.owner}'s sessions may run on one node together ({setting} = {most}); "
            f"{there} run there already ({who or 'none'}): shut a session down "
            f"(`%dist shutdown --session NAME`), ask for fewer ranks, or raise {setting}"
        )


def _names(held: Mapping[str, SessionSpec], starting: Mapping[str, SessionSpec]) -> str:
    return ", ".join(f"{n!r}{' (starting)' if n in starting else ''}" for n in sorted(held))
