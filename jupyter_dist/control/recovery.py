"""A session's life and its faults: a state machine that loses only what a fault touched.

::

    STARTING ──(every rank bootstrapped)──> READY ──(a rank died, was stuck, or its node
        │                                    ^ │     was lost)──> DEGRADED
        │ (start failed)             (healed)│ │ (resize, heal)      │ (heal: automatic
        v                                    │ v                     │  before the next
     STOPPED <── (shutdown, from any state)  HEALING <───────────────┘  cell, or asked)
                                               │ (a heal that failed)
        RESTARTING <──(restart)── READY,       v
        DEGRADED, BROKEN; ──> READY or BROKEN  BROKEN ──(heal, restart)──> ...

A fault is recorded per rank (`Fault`): it died (its process exited), it was stuck (it
did not take an interrupt and its stack was outside Python), or it was lost (its node is
out of reach). Healing replaces exactly those ranks with fresh rank kernels of the same
rank numbers (a lost node is started again: the same host once it answers, or a spare),
and then every rank, survivors too, joins a new process group: the `generation` counts
groups. Survivors keep their namespace; what was built on the old group in them is named
(`rank.regroup`). A resize is the same move with ranks added after the survivors or the
highest ones removed.

A restart starts every rank afresh. It keeps the agents while every one of them runs;
once one is gone (its node lost, its agent stopped, or never started by a restart that
failed) every agent is stopped and started afresh, and a cluster places the session anew
(`RestartPlan`). A restart that fails has stopped every rank: the session is BROKEN with
nothing to heal, and only a restart brings it back; its words name the nodes that must
be started again before one can work (`FailedRestart`).

Which faults heal on their own: a rank that died or was stuck on a node still reachable
is replaced before the next cell; a lost node needs ``%dist heal`` (or the session's
``--heal``), because starting a node again is the user's decision (the host may be gone
for good, and a spare is a choice). Until then the session is DEGRADED: its survivors
answer ``%dist pull``, ``%dist stacks`` and ``%dist status``.

This module decides; `control.session.Session` carries the moves out (spawning, killing,
regrouping) through its launchers, which only start and stop nodes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from jupyter_dist.common.wire_names import REBUILT
from jupyter_dist.errors import SessionError
from jupyter_dist.text import ranks_label

FaultKind = Literal["died", "stuck", "lost"]


class SessionState(str, enum.Enum):
    """Where a session is in its life (see the module's diagram). `Session` moves it; an
    `AttachedSession` takes the state the server reports."""

    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    HEALING = "healing"
    BROKEN = "broken"
    RESTARTING = "restarting"
    STOPPED = "stopped"


#: the moves the machine allows; anything else is a bug, named by `check_move`
MOVES: Mapping[SessionState, frozenset[SessionState]] = {
    SessionState.STARTING: frozenset(
        {SessionState.READY, SessionState.BROKEN, SessionState.STOPPED}
    ),
    SessionState.READY: frozenset(
        {
            SessionState.DEGRADED,
            SessionState.HEALING,
            SessionState.RESTARTING,
            SessionState.BROKEN,
            SessionState.STOPPED,
        }
    ),
    SessionState.DEGRADED: frozenset(
        {SessionState.HEALING, SessionState.RESTARTING, SessionState.STOPPED}
    ),
    SessionState.HEALING: frozenset(
        {
            SessionState.READY,
            SessionState.DEGRADED,
            SessionState.BROKEN,
            SessionState.STOPPED,
        }
    ),
    SessionState.RESTARTING: frozenset(
        {SessionState.READY, SessionState.BROKEN, SessionState.STOPPED}
    ),
    SessionState.BROKEN: frozenset(
        {SessionState.RESTARTING, SessionState.HEALING, SessionState.STOPPED}
    ),
    SessionState.STOPPED: frozenset(),
}


def check_move(name: str, old: SessionState, new: SessionState) -> None:
    if new != old and new not in MOVES[old]:
        raise SessionError(f"session {name!r}: no move from {old.value} to {new.value}")


@dataclass(frozen=True)
class Fault:
    """What happened to one rank."""

    rank: int
    kind: FaultKind
    why: str  # in words: "killed by signal 9 (SIGKILL)", "its node is out of reach: ..."
    node: int  # its node's index

    def sentence(self) -> str:
        verb = {"died": "died", "stuck": "could not be stopped", "lost": "was lost"}[self.kind]
        return f"rank {self.rank} {verb} ({self.why})"


@dataclass(frozen=True)
class HealPlan:
    """What a heal does: the ranks it replaces and the nodes it starts again."""

    replace: tuple[int, ...]
    nodes: tuple[int, ...]  # node indexes whose agent is started again
    faults: tuple[Fault, ...]


@dataclass(frozen=True)
class RestartPlan:
    """What a restart does before it starts every rank afresh: with ``gone`` nodes (their
    agent lost, stopped, or never started), every node's agent is stopped and started
    afresh, and a cluster's placement made anew; with none, the agents stay (their warm
    imports too) and only their ranks are stopped."""

    gone: tuple[int, ...]

    @property
    def fresh_agents(self) -> bool:
        return bool(self.gone)


@dataclass(frozen=True)
class FailedRestart:
    """A restart that failed, having stopped every rank: the session has nothing left to
    heal, and only a restart brings it back.

    ``unreachable``: the nodes whose agent it could not start or lost, each with why in
    a line (a restart cannot work until they can be started); ``cluster``: the cluster
    that places the session's nodes, by name ("" for listed hosts), which the next
    restart asks for them again."""

    unreachable: tuple[tuple[str, str], ...] = ()
    cluster: str = ""

    def advice(self, name: str) -> str:
        """What to do now, in sentences."""
        restart = f"`%dist restart --session {name}`"
        shutdown = f"`%dist shutdown --session {name}` ends the session."
        nodes = "; ".join(
            f"{host!r} ({_without_name(host, why)})" for host, why in self.unreachable
        )
        many = len(self.unreachable) > 1
        if self.cluster and self.unreachable:  # the cluster places them anew
            return (
                f"{'Nodes' if many else 'Node'} {nodes} could not be started: {restart} asks "
                f"{self.cluster} for the session's nodes again and starts every rank afresh; "
                f"{shutdown}"
            )
        if self.unreachable:
            return (
                f"A restart cannot work until {'nodes' if many else 'node'} {nodes} can be "
                f"started again: then {restart} starts the session's agents afresh, and every "
                f"rank; {shutdown}"
            )
        return f"{restart} tries again, starting every rank afresh; {shutdown}"


def _without_name(host: str, why: str) -> str:
    """``why`` less the node's name it starts with ("node 'a': ...", "node 'a' ...")."""
    for prefix in (f"node {host!r}: ", f"node {host!r} "):
        if why.startswith(prefix):
            return why[len(prefix) :]
    return why


@dataclass
class Recovery:
    """A session's faults since its last group, and its group's generation."""

    generation: int = 0
    faults: dict[int, Fault] = field(default_factory=dict)
    #: heal before the next cell without being asked, lost nodes too (``--heal``)
    auto_heal: bool = False
    #: the ranks the last heal or resize started empty: where ``%dist sync`` copies to
    replaced: tuple[int, ...] = ()
    #: the restart that failed, while the session is BROKEN by it (None: it is not)
    failed_restart: FailedRestart | None = None

    def record(self, fault: Fault) -> None:
        """A rank's fault; the first kept (a rank that was stuck and then killed stays
        stuck: that is why it died)."""
        self.faults.setdefault(fault.rank, fault)

    def heals_itself(self) -> bool:
        """Whether the next cell heals the session without being asked: every fault is a
        rank of a node still reachable, or the session heals lost nodes too."""
        return bool(self.faults) and (
            self.auto_heal or all(f.kind != "lost" for f in self.faults.values())
        )

    def plan_restart(self, running: Sequence[bool]) -> RestartPlan:
        """A restart of nodes whose agents run or not (``running``, by node index)."""
        return RestartPlan(tuple(n for n, up in enumerate(running) if not up))

    def restart_failed(
        self, unreachable: Sequence[tuple[str, str]] = (), cluster: str = ""
    ) -> FailedRestart:
        """A restart failed: remembered until the next one works."""
        self.failed_restart = FailedRestart(tuple(unreachable), cluster)
        return self.failed_restart

    def restarted(self) -> None:
        """Every rank is fresh: no fault, no failed restart left."""
        self.faults.clear()
        self.failed_restart = None

    def plan(self, lost_nodes: Iterable[int], also: Sequence[int] = ()) -> HealPlan:
        """Replace the faulty ranks and ``also`` (ranks given up on by a cell); start the
        ``lost_nodes`` again."""
        replace = sorted(set(self.faults) | set(also))
        faults = tuple(self.faults[r] for r in sorted(self.faults))
        return HealPlan(tuple(replace), tuple(sorted(set(lost_nodes))), faults)

    def healed(
        self, plan: HealPlan, rebuild: Mapping[int, Sequence[str]], new_group: str = ""
    ) -> str:
        """The group is new: forget the faults, count the generation, and return what the
        next cell says (``rebuild``: per survivor, what was built on the old group;
        ``new_group``: why the group was made anew besides the replaced ranks)."""
        self.generation += 1
        self.faults.clear()
        self.replaced = plan.replace
        return heal_report(plan, self.generation, rebuild, new_group)


def heal_report(
    plan: HealPlan, generation: int, rebuild: Mapping[int, Sequence[str]], new_group: str = ""
) -> str:
    """What a heal did, in the words the next cell shows."""
    names = sorted({name for found in rebuild.values() for name in found})
    done = [n[: -len(REBUILT)] + ")" for n in names if n.endswith(REBUILT)]
    left = [n for n in names if not n.endswith(REBUILT)]
    rebuilt = " ".join(
        [
            f"Rebuilt on the new group in place: {', '.join(done)}." if done else "",
            f"Built on the old group, rebuild on every rank: {', '.join(left)}." if left else "",
        ]
    ).strip()
    freed = f"{new_group[:1].upper()}{new_group[1:]}." if new_group else ""
    if not plan.replace:  # a new group alone: nothing was lost
        lines = [
            freed,
            "Every rank kept its variables and all joined a new process group "
            f"(generation {generation}).",
            rebuilt,
        ]
        return " ".join(line for line in lines if line)
    whys = "; ".join(f.sentence() for f in plan.faults)
    replaced = ranks_label(list(plan.replace))
    nodes = f" (node {', '.join(map(str, plan.nodes))} started again)" if plan.nodes else ""
    many = len(plan.replace) > 1
    kernels = "fresh rank kernels" if many else "a fresh rank kernel"
    lines = [
        f"{replaced} replaced by {kernels}{nodes}"
        + (f": {whys}" if whys else "")
        + f". {'They start' if many else 'It starts'} empty; every other "
        f"rank kept its variables. All ranks joined a new process group (generation "
        f"{generation}).",
        freed,
        rebuilt,
    ]
    lines.append(
        f"`%dist sync NAME[,NAME...] --from RANK` copies variables from a survivor to {replaced}."
    )
    return " ".join(line for line in lines if line)


def resize_report(added: Sequence[int], removed: Sequence[int], world: int, generation: int) -> str:
    """What a resize did, in words."""
    parts = []
    if added:
        parts.append(f"{ranks_label(list(added))} added (empty)")
    if removed:
        parts.append(f"{ranks_label(list(removed))} removed")
    what = " and ".join(parts) or "nothing changed"
    return (
        f"session resized: {what}; world size {world}; every other rank kept its "
        f"variables and all joined a new process group (generation {generation}). "
        "`%dist sync NAME --from RANK` copies variables to the new ranks."
    )


__all__ = [
    "MOVES",
    "FailedRestart",
    "Fault",
    "FaultKind",
    "HealPlan",
    "Recovery",
    "RestartPlan",
    "SessionState",
    "check_move",
    "heal_report",
    "resize_report",
]
