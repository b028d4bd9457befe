"""What happens during a cell, as values the notebook side renders.

The control plane turns Jupyter messages from rank kernels into these events, tagged by
rank, and hands them to whatever draws them (the text renderer now, widgets later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.errors import RankFailure


@dataclass(frozen=True)
class StreamOut:
    """Text a rank wrote to stdout or stderr."""

    rank: int
    name: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True)
class RichOut:
    """A display_data / execute_result / update_display_data from a rank."""

    rank: int
    msg_type: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    transient: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClearOut:
    rank: int
    wait: bool


@dataclass(frozen=True)
class RankFinished:
    """One rank is done with the cell: ``status`` is ok, error, died, timeout or interrupted."""

    rank: int
    status: str
    elapsed: float
    failure: RankFailure | None = None


@dataclass(frozen=True)
class Notice:
    """A line about the session itself (starting, restarting...)."""

    text: str


@dataclass(frozen=True)
class CellResult:
    """How a cell ended on every rank it ran on."""

    ranks: tuple[int, ...]
    failures: tuple[RankFailure, ...]
    elapsed: dict[int, float]
    timed_out: bool = False
    interrupted: bool = False


@dataclass(frozen=True)
class CellFinished:
    result: CellResult


@dataclass(frozen=True)
class CallDone:
    """A control-plane call finished (wakes the notebook thread at once)."""


CellEvent = StreamOut | RichOut | ClearOut | RankFinished | Notice | CellFinished | CallDone
