"""A rank's failure as the text its output shows: the traceback it raised, or what became
of it (``RankDied: ...`` with its exit status).

The views and the text output show a failed rank's traceback with the rest of its output,
and its log keeps it too; the error the cell raises then only names it (`RanksFailed`
with ``shown``), so each traceback is shown once.
"""

from __future__ import annotations

from jupyter_dist.errors import STOPPED_KINDS, RankFailure
from jupyter_dist.text import strip_ansi


def failure_lines(failure: RankFailure) -> list[str]:
    """The lines ``failure`` shows in its rank's output (with their colours): the
    traceback of a rank that raised, else its headline and whatever traceback it has."""
    traceback = "\n".join(failure.traceback).rstrip()
    lines = traceback.split("\n") if traceback else []
    if failure.traceback and failure.kind != "died":
        return lines
    return [failure.headline(), *lines]


def failure_log_text(failure: RankFailure) -> str:
    """What a rank's log keeps of ``failure``: its lines without colours."""
    return "".join(strip_ansi(line) + "\n" for line in failure_lines(failure))


def failed_of_its_own(failure: RankFailure) -> bool:
    """Whether ``failure`` is the rank's own (it raised or died), not a stop jupyter_dist
    or the user made (whose KeyboardInterrupt the cell's error sums up as a place)."""
    return failure.kind not in STOPPED_KINDS


__all__ = ["failed_of_its_own", "failure_lines", "failure_log_text"]
