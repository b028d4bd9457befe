"""What happens during a cell, as values the notebook side renders.

The control plane turns Jupyter messages from rank kernels into these events, tagged by
rank, and hands them to whatever draws them: the text renderer
(`display.render_text`) or the widget view (`display.cell_view`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from jupyter_dist.errors import FailureKind, RankFailure

#: how a rank ended a cell: ``ok``, or the kind of its failure
RankOutcome = Literal["ok"] | FailureKind
#: the stream a rank wrote to
StreamName = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class StreamOut:
    """Text a rank wrote to stdout or stderr."""

    rank: int
    name: StreamName
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
class MetricsOut:
    """Scalars a rank logged (``jupyter_dist.log``) and/or a sample of its process."""

    rank: int
    points: tuple[tuple[str, float, float], ...]  # (metric, step, value)
    process: dict[str, float] = field(default_factory=dict)  # cpu_percent, rss_mb, gpu_...


@dataclass(frozen=True)
class WidgetComm:
    """A widget message from a rank (``comm_open``/``comm_msg``/``comm_close``), relayed."""

    rank: int
    msg_type: str
    content: dict[str, Any]
    buffers: tuple[bytes, ...] = ()
    #: the message's metadata: ``comm_open`` carries the widget protocol ``version`` there,
    #: without which the browser refuses the model
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RankStarted:
    """A rank began running the cell (its kernel said busy)."""

    rank: int


@dataclass(frozen=True)
class RankFinished:
    """One rank is done with the cell: ``status`` is ok, error, died, timeout, stuck or
    interrupted."""

    rank: int
    status: RankOutcome
    elapsed: float
    failure: RankFailure | None = None


@dataclass(frozen=True)
class InputAsked:
    """A rank waits for input: ``input()``, ``getpass()`` (``password``) or a debugger's
    prompt, answered through the notebook's own input box (`notebook.rank_input`)."""

    rank: int
    prompt: str
    password: bool = False


@dataclass(frozen=True)
class InputEnded:
    """The rank's input prompt closed: answered, or withdrawn (the rank ended first)."""

    rank: int
    #: the prompts still waiting, in the order they are served
    waiting: tuple[int, ...] = ()


@dataclass(frozen=True)
class Notice:
    """A line about the session itself (starting, restarting...). A ``transient`` one is
    news while the cell runs ("interrupting rank 0") that the cell's outcome says again:
    a finished cell view drops it."""

    text: str
    transient: bool = False
    #: a notice with a ``line`` replaces the one shown before under the same name: one
    #: line that updates ("waiting for a cell from train.ipynb (running 8 s)")
    line: str = ""


@dataclass(frozen=True)
class CellResult:
    """How a cell ended on every rank it ran on."""

    ranks: tuple[int, ...]
    failures: tuple[RankFailure, ...]
    elapsed: dict[int, float]
    timed_out: bool = False
    timeout_s: float | None = None  # the --timeout it ran past
    interrupted: bool = False
    #: ranks given up on while still running (they did not take an interrupt, blocked
    #: outside Python): they are replaced, and every rank joins a new process group
    stuck: tuple[int, ...] = ()
    #: ranks freed from a collective of their process group (its connections shut, which
    #: ends the group for all): every rank joins a new group, none is replaced
    freed: tuple[int, ...] = ()
    #: stopped by its sender while it waited for its turn: it never ran
    withdrawn: bool = False
    #: who else stopped it, in words ("session 's' was restarted from eval.ipynb; ...")
    stopped_by: str = ""
    #: what became of the session after the cell, in words (which ranks were replaced,
    #: why, and that they start empty)
    note: str = ""


@dataclass(frozen=True)
class CellFinished:
    result: CellResult


@dataclass(frozen=True)
class CallDone:
    """A control-plane call finished (wakes the notebook thread at once)."""


CellEvent = (
    StreamOut
    | RichOut
    | ClearOut
    | MetricsOut
    | WidgetComm
    | RankStarted
    | RankFinished
    | InputAsked
    | InputEnded
    | Notice
    | CellFinished
    | CallDone
)
