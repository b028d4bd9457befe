"""Every exception jupyter_dist raises, in one place.

Hierarchy::

    DistError                      base of everything raised by jupyter_dist
    ├── SpecError (ValueError)     bad magic arguments / session shape; raised before anything runs
    ├── NoGPUError (SpecError)     --gpus asked for more CUDA devices than a node has
    ├── SessionError               a session cannot do what was asked (stopped, broken, busy)
    │   ├── UnknownSession         no session has that name
    │   ├── ShapeMismatchError     a cell asks for another shape than the running session
    │   └── LimitError             a new session would pass its owner's limits
    ├── AgentError                 a node agent failed to start or stopped answering
    ├── PushError                  an object could not be sent to the ranks (``--push``)
    │   └── PullError              an object could not be received from them (``%dist pull``)
    ├── NotInRankError             a rank-side helper was called outside a rank
    └── RanksFailed                one cell failed on one or more ranks (raised in the cell)
        ├── CellTimeout            the cell ran past --timeout
        └── CellInterrupted        the user stopped the cell (also a KeyboardInterrupt)

`RanksFailed` renders itself for IPython through `_render_traceback_`: the root cause
first (rank, host, exception, traceback), identical tracebacks merged with their rank
list, then "... and N more". A traceback the cell's output already shows, with the rest of
its rank's output (`RanksFailed.shown`), is named there, not printed again. Ranks that were
stopped rather than failed of their own (timed out, interrupted, stuck behind a failed
rank) get one line each group, saying where they were, without the traceback of the
KeyboardInterrupt jupyter_dist itself sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
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
#: kinds of a rank that was stopped (by a timeout, the user, or a failed peer): shown as
#: where it was, not as a traceback
STOPPED_KINDS: tuple[FailureKind, ...] = ("timeout", "interrupted", "stuck")


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


class LimitError(SessionError):
    """A new session would pass a limit of whoever owns the sessions (how many sessions,
    how many ranks all of them run on one node); refused before anything starts."""


class AgentError(DistError):
    """A node agent could not be started or stopped answering."""


class PushError(DistError):
    """An object could not be sent to the ranks."""


class PullError(PushError):
    """An object could not be received from the ranks (``%dist pull``); a `PushError` as
    well, for code that caught both as one."""


class NotInRankError(DistError, RuntimeError):
    """A rank-side helper was called outside a rank kernel."""


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank during one cell.

    ``kind`` is ``"error"`` (the cell raised), ``"died"`` (the rank process exited),
    ``"timeout"`` (still running at the deadline), ``"stuck"`` (it did not stop when
    interrupted, after another rank failed or someone stopped the cell: typically blocked
    inside a collective) or ``"interrupted"``.
    ``place`` is where a stopped rank was (``in barrier (distributed_c10d.py:5356), cell
    line 2``), when known.
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
    place: str = ""

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
    ``shown``: the ranks whose traceback the cell's output already shows (`shown_above`);
    the rendering names their failure and leaves the traceback where it is.
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
        self.shown: frozenset[int] = frozenset()
        super().__init__(str(self))

    def shown_above(self, ranks: Iterable[int]) -> RanksFailed:
        """Say that the cell's output shows the tracebacks of ``ranks`` (with the rest of
        their output): the rendering points there instead of printing them again."""
        self.shown = frozenset(ranks)
        return self

    @property
    def failed_ranks(self) -> list[int]:
        return sorted(f.rank for f in self.failures)

    def _summary(self) -> str:
        """Ranks that failed of their own (raised, died) are counted as failed; ranks only
        stopped (timed out, interrupted, stuck because of them) are named apart, not blamed."""
        if not self.groups:
            return f"cell failed in session {self.session!r}"
        culprits = [f for f in self.failures if f.kind not in STOPPED_KINDS]
        stopped = sorted(f.rank for f in self.failures if f.kind in STOPPED_KINDS)
        if not culprits:  # nothing failed of its own: the ranks were stopped
            return f"{self._stopped_how()} on {ranks_label(stopped)} in session {self.session!r}"
        root = self.groups[0].first
        n = len(culprits)
        where = f"{n} of {self.world_size} ranks" if n > 1 else f"rank {root.rank}"
        after = f" ({ranks_label(stopped)} stopped after it)" if stopped else ""
        return (
            f"{where} failed in session {self.session!r}{after}; root cause on rank "
            f"{root.rank} ({root.host}): {root.headline()}"
        )

    def _stopped_how(self) -> str:
        """What happened to ranks that were all stopped, none failing of its own."""
        if all(f.kind == "stuck" for f in self.failures):
            return "stuck"
        return "interrupted"

    def _render_traceback_(self) -> list[str]:
        red, bold, reset = "\x1b[31m", "\x1b[1m", "\x1b[0m"
        lines = [f"{red}{bold}{type(self).__name__}{reset}: {self._summary()}"]
        own = [g for g in self.groups if g.first.kind not in STOPPED_KINDS]
        above = [g for g in own if set(g.ranks) <= self.shown]
        for group in own[: self.shown_groups]:
            first = group.first
            if group in above and len(own) == 1:
                break  # the summary line named it; the traceback is in the output above
            label = ranks_label(group.ranks)
            lines.append("")
            lines.append(f"{bold}--- {label} ({group.where()}): {first.headline()}{reset}")
            if group not in above:
                lines.extend(first.traceback or ())
        rest = own[self.shown_groups :]
        if rest:
            more = sum(len(g.ranks) for g in rest)
            ranks = ranks_label([r for g in rest for r in g.ranks])
            kinds = "; ".join(sorted({g.first.headline() for g in rest}))
            lines.append("")
            lines.append(f"... and {more} more ({ranks}): {kinds}")
        stops = self.stopped_places()
        if stops:
            lines.append("")
            lines.append("where the stopped ranks were:" if own else "where each rank was:")
            lines.extend(f"  {line}" for line in stops)
        if above:
            lines.append(_where_shown(above))
        if self.note:
            lines += ["", f"{bold}{self.note}{reset}"]
        return lines

    def stopped_places(self) -> list[str]:
        """One line per group of stopped ranks at the same place: ``ranks 0-1: at cell
        line 1: time.sleep(30)``; ``rank 1 (did not stop when interrupted): in barrier
        (distributed_c10d.py:5356), cell line 2``."""
        places: dict[tuple[str, str], list[int]] = {}
        for failure in sorted(self.failures, key=lambda f: f.rank):
            if failure.kind in STOPPED_KINDS:
                key = (_STOP_WORDS.get(failure.kind, ""), failure.place or failure.evalue)
                places.setdefault(key, []).append(failure.rank)
        if len({how for how, _ in places}) == 1 and not self._mixed():
            places = {("", where): ranks for (_how, where), ranks in places.items()}
        return [
            f"{ranks_label(ranks)}{f' ({how})' if how else ''}: {where or NO_PLACE}"
            for (how, where), ranks in places.items()
        ]

    def _mixed(self) -> bool:
        """Whether the failures are of more than one kind (then each line says its kind)."""
        return len({f.kind for f in self.failures}) > 1

    def __str__(self) -> str:
        return f"{self._summary()}\n{self.note}" if self.note else self._summary()


#: a stopped rank whose traceback names no frame (the interrupt found it between two
#: statements of the kernel's own, or it sent no traceback)
NO_PLACE = "not in the cell's code (its traceback names no line)"


def _where_shown(groups: Sequence[FailureGroup]) -> str:
    """Where the tracebacks the rendering leaves out are: in the cell's output, above."""
    ranks = sorted(r for g in groups for r in g.ranks)
    if len(groups) == 1:
        whose = f"{ranks_label(ranks)}'s output" if len(ranks) == 1 else "the ranks' output"
        return f"(the traceback is above, in {whose})"
    return f"(the tracebacks of {ranks_label(ranks)} are above, in the ranks' output)"


_STOP_WORDS: dict[str, str] = {
    "timeout": "timed out",
    "interrupted": "interrupted",
    "stuck": "did not stop when interrupted",
}


class CellTimeout(RanksFailed):
    """The cell ran longer than ``--timeout``; the ranks were interrupted."""

    def __init__(
        self,
        session: str,
        world_size: int,
        failures: Sequence[RankFailure],
        note: str = "",
        timeout: float | None = None,
    ):
        self.timeout = timeout
        super().__init__(session, world_size, failures, note)

    def _stopped_how(self) -> str:
        after = f" after {self.timeout:g} s" if self.timeout is not None else ""
        return f"timed out{after}"

    def _summary(self) -> str:
        if any(f.kind not in STOPPED_KINDS for f in self.failures):
            return super()._summary()
        timed_out = sorted(f.rank for f in self.failures)
        return f"{self._stopped_how()} on {ranks_label(timed_out)} in session {self.session!r}"


class CellInterrupted(RanksFailed, KeyboardInterrupt):
    """The user stopped the cell (the stop button, ``%dist interrupt``); the ranks were
    interrupted. A KeyboardInterrupt too, so code that stops on one stops on this."""

    def __init__(
        self,
        session: str,
        world_size: int,
        failures: Sequence[RankFailure],
        note: str = "",
        still_running: Sequence[int] = (),
        finished: Sequence[int] = (),
    ):
        self.still_running = list(still_running)
        self.finished = sorted(finished)  # ranks that had finished the cell, fine
        super().__init__(session, world_size, failures, note)

    def _summary(self) -> str:
        if any(f.kind not in STOPPED_KINDS for f in self.failures):
            return super()._summary()
        stopped = sorted(f.rank for f in self.failures)
        stuck = sorted(f.rank for f in self.failures if f.kind == "stuck")
        said = f"interrupted in session {self.session!r}"
        if stuck and stuck == stopped:
            said += f": {ranks_label(stuck)} did not stop"
        elif stopped:
            said = f"interrupted on {ranks_label(stopped)} in session {self.session!r}"
            if stuck:
                said += f"; {ranks_label(stuck)} did not stop"
        if self.finished and stopped:
            said += f"; {ranks_label(self.finished)} had finished"
        if self.still_running:
            said += (
                f"; {ranks_label(self.still_running)} not stopped yet when this notebook "
                "stopped waiting (ranks that do not stop are restarted; the next cell waits "
                f"for that; `%dist stacks --session {self.session}` shows where they are)"
            )
        return said


__all__ = [
    "CASUALTY_KINDS",
    "STOPPED_KINDS",
    "AgentError",
    "CellInterrupted",
    "CellTimeout",
    "DistError",
    "FailureGroup",
    "FailureKind",
    "LimitError",
    "NoGPUError",
    "NotInRankError",
    "PullError",
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
