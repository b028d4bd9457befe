"""Every exception jupyter_dist raises, in one place.

Hierarchy::

    DistError                      base of everything raised by jupyter_dist
    ├── SpecError (ValueError)     bad magic arguments / session shape; raised before anything runs
    ├── NoGPUError (SpecError)     --gpus asked for more CUDA devices than a node has
    ├── SessionError               a session cannot do what was asked (stopped, broken, busy)
    │   ├── UnknownSession         no session has that name
    │   └── ShapeMismatchError     a cell asks for another shape than the running session
    ├── AgentError                 a node agent failed to start or stopped answering
    ├── PushError                  an object could not be sent to / received from ranks
    ├── NotInRankError             a rank-side helper was called outside a rank
    └── RanksFailed                one cell failed on one or more ranks (raised in the cell)
        └── CellTimeout            the cell ran past --timeout

`RanksFailed` renders itself for IPython through `_render_traceback_`: the root cause
first (rank, host, exception, traceback), identical tracebacks merged with their rank
list, then "... and N more".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

# the text helpers lived here first: still importable from here (see __all__)
from jupyter_dist.text import format_ranks, ranks_label, strip_ansi

# execution counters ("In[12]") and object addresses differ between ranks
_NOISE = re.compile(r"(?<=In\[)\d+(?=\])|0x[0-9a-f]{6,}")

#: the closed set of `RankFailure.kind`
FailureKind = Literal["error", "died", "timeout", "stuck", "interrupted"]
#: kinds of a rank that did not fail of its own: interrupted or stuck after another failed
CASUALTY_KINDS: tuple[FailureKind, ...] = ("interrupted", "stuck")


class DistError(Exception):
    """Base class of every error raised by jupyter_dist.

    IPython shows it as one clear message, without jupyter_dist's own stack frames.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


class SpecError(DistError, ValueError):
    """Bad arguments: names the bad value and the expected form."""


class NoGPUError(SpecError):
    """``--gpus`` asked for more CUDA devices than the node has."""


class SessionError(DistError):
    """The session cannot do what was asked."""


class UnknownSession(SessionError, LookupError):
    """No session has that name."""


class ShapeMismatchError(SessionError):
    """A cell asks for a different shape than the running session has."""


class AgentError(DistError):
    """A node agent could not be started or stopped answering."""


class PushError(DistError):
    """An object could not be sent to, or received from, the ranks."""


class NotInRankError(DistError, RuntimeError):
    """A rank-side helper was called outside a rank kernel."""


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank during one cell.

    ``kind`` is ``"error"`` (the cell raised), ``"died"`` (the rank process exited),
    ``"timeout"`` (still running at the deadline), ``"stuck"`` (blocked after another
    rank failed, deaf to an interrupt: typically inside a collective) or ``"interrupted"``.
    """

    rank: int
    host: str
    local_rank: int
    kind: FailureKind
    ename: str
    evalue: str
    traceback: tuple[str, ...] = ()
    exit_code: int | None = None
    order: float = 0.0

    def headline(self) -> str:
        return f"{self.ename}: {self.evalue}" if self.evalue else self.ename

    def group_key(self) -> tuple[str, str, str, str]:
        """Equal for failures that differ only in per-rank noise (cell counters, addresses)."""
        body = _NOISE.sub("#", strip_ansi("\n".join(self.traceback)))
        return (self.kind, self.ename, _NOISE.sub("#", self.evalue), body)


@dataclass
class FailureGroup:
    """Failures with identical tracebacks, shown once with their rank list."""

    first: RankFailure
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)

    def where(self) -> str:
        """``host a, local rank 1`` for one rank; ``host a`` / ``hosts a, b`` for several."""
        if len(self.ranks) == 1:
            return f"host {self.first.host}, local rank {self.first.local_rank}"
        hosts = list(dict.fromkeys(self.hosts or [self.first.host]))
        return f"host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)}"


def group_failures(failures: Sequence[RankFailure]) -> list[FailureGroup]:
    """Merge identical failures, root cause first.

    A rank that died comes before ranks that raised (their errors are usually the
    consequence: a collective that lost its peer); within a kind, the earliest first.
    """
    priority: dict[FailureKind, int] = {
        "died": 0,
        "error": 1,
        "timeout": 2,
        "stuck": 3,
        "interrupted": 4,
    }
    ordered = sorted(failures, key=lambda f: (priority.get(f.kind, 9), f.order, f.rank))
    groups: dict[tuple[str, str, str, str], FailureGroup] = {}
    for failure in ordered:
        group = groups.setdefault(failure.group_key(), FailureGroup(first=failure))
        group.ranks.append(failure.rank)
        group.hosts.append(failure.host)
    for group in groups.values():
        group.ranks.sort()
    return list(groups.values())


class RanksFailed(DistError):
    """A cell failed on one or more ranks.

    ``failures`` holds one `RankFailure` per failed rank; ``groups`` the same merged by
    identical traceback, root cause first. ``note`` says what happened to the session
    afterwards when that matters (it was restarted and the ranks' variables are gone).
    """

    shown_groups = 3

    def __init__(
        self,
        session: str,
        world_size: int,
        failures: Sequence[RankFailure],
        note: str = "",
    ):
        self.session = session
        self.world_size = world_size
        self.failures = list(failures)
        self.groups = group_failures(self.failures)
        self.note = note
        super().__init__(str(self))

    @property
    def failed_ranks(self) -> list[int]:
        return sorted(f.rank for f in self.failures)

    def _summary(self) -> str:
        """Ranks that failed of their own (raised, died, timed out) are counted as failed;
        ranks only interrupted or stuck because of them are named apart, not blamed."""
        if not self.groups:
            return f"cell failed in session {self.session!r}"
        root = self.groups[0].first
        culprits = sorted(f.rank for f in self.failures if f.kind not in CASUALTY_KINDS)
        casualties = sorted(f.rank for f in self.failures if f.kind in CASUALTY_KINDS)
        if not culprits:  # nothing failed of its own: the ranks were stopped
            how = "stuck" if all(f.kind == "stuck" for f in self.failures) else "interrupted"
            return f"{how} on {ranks_label(casualties)} in session {self.session!r}"
        n = len(culprits)
        where = f"{n} of {self.world_size} ranks" if n > 1 else f"rank {root.rank}"
        after = f" ({ranks_label(casualties)} stopped after it)" if casualties else ""
        return (
            f"{where} failed in session {self.session!r}{after}; root cause on rank "
            f"{root.rank} ({root.host}): {root.headline()}"
        )

    def _render_traceback_(self) -> list[str]:
        red, bold, reset = "\x1b[31m", "\x1b[1m", "\x1b[0m"
        lines = [f"{red}{bold}{type(self).__name__}{reset}: {self._summary()}"]
        for group in self.groups[: self.shown_groups]:
            first = group.first
            label = ranks_label(group.ranks)
            lines.append("")
            lines.append(f"{bold}--- {label} ({group.where()}): {first.headline()}{reset}")
            lines.extend(first.traceback or ())
        rest = self.groups[self.shown_groups :]
        if rest:
            more = sum(len(g.ranks) for g in rest)
            ranks = ranks_label([r for g in rest for r in g.ranks])
            kinds = "; ".join(sorted({g.first.headline() for g in rest}))
            lines.append("")
            lines.append(f"... and {more} more ({ranks}): {kinds}")
        if self.note:
            lines += ["", f"{bold}{self.note}{reset}"]
        return lines

    def __str__(self) -> str:
        return f"{self._summary()}\n{self.note}" if self.note else self._summary()


class CellTimeout(RanksFailed):
    """The cell ran longer than ``--timeout``; the ranks were interrupted."""


__all__ = [
    "CASUALTY_KINDS",
    "AgentError",
    "CellTimeout",
    "DistError",
    "FailureGroup",
    "FailureKind",
    "NoGPUError",
    "NotInRankError",
    "PushError",
    "RankFailure",
    "RanksFailed",
    "SessionError",
    "ShapeMismatchError",
    "SpecError",
    "UnknownSession",
    "format_ranks",
    "group_failures",
    "ranks_label",
    "strip_ansi",
]
