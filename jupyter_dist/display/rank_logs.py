"""Each rank's full output in a cell, in a log file of the notebook's private folder.

``<tmp>/jupyter_dist-logs-<pid>-<x>/<session>/cell-<n>/rank-<r>.log``: the views and the
text renderer keep only the last lines of a rank and pass on only `output_limit` of it,
and say that the rest is in its log. A log holds everything its rank showed in the cell:
what it printed, its rich output as text (`rich_log_text`) and its traceback, without
colours; a cell that shows anything has a log for each of its ranks (`RankLogs.touch`),
so the view's "logs" link is always there to follow.

The logs are best effort. The temporary folder of a shared login node is small and often
full: a write that fails there (no space left, a quota, a read-only disk, any `OSError`)
costs the cell its logs, never its output or its result. The logs stop for that cell, and
``on_failure`` is told once, with a notice naming the folder, the error and what to do;
the next cell (a new `RankLogs`) tries again, as the disk may have been freed meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from jupyter_dist.common import process_folders
from jupyter_dist.common.temp_space import unwritable
from jupyter_dist.common.wire_names import LOGS_FOLDER_PREFIX
from jupyter_dist.display.rich_text import readable_text
from jupyter_dist.text import strip_ansi

LOGS_PREFIX = LOGS_FOLDER_PREFIX
#: what a view says instead of a log's path once the cell's logs are off
NOT_KEPT = "not kept (rank logs are off for this cell)"


class RankLogs:
    """Every line each rank printed in a cell, in ``<folder>/rank-N.log`` (0600 files in a
    0700 folder of this user's). The folder is made with the first line: a silent cell,
    most cells, leaves none. A failed write stops the logs of the cell and calls
    ``on_failure`` once with a notice (see the module docstring)."""

    def __init__(
        self,
        session: str,
        cell: int,
        base: str | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.on_failure = on_failure
        #: the notice, once a write failed and the logs of this cell stopped
        self.failure: str | None = None
        self._files: dict[int, TextIO] = {}
        self._begun: set[int] = set()  # ranks whose file was made: later opens append
        self._unmade: OSError | None = None  # the private folder could not be made
        try:
            root = Path(base) if base else _logs_root()
        except OSError as err:  # said at the first write: a silent cell needs no logs
            self._unmade = err
            root = Path(os.fspath(err.filename)) if err.filename else Path("<no temporary folder>")
        self.folder = root / session / f"cell-{cell}"

    @property
    def written(self) -> bool:
        """Whether any rank's output went into the folder."""
        return bool(self._begun)

    @property
    def kept(self) -> bool:
        """Whether the folder holds every rank's output so far (it was written, never
        failed)."""
        return self.written and self.failure is None

    def path(self, rank: int) -> Path:
        return self.folder / f"rank-{rank}.log"

    def hint(self, rank: int) -> str:
        """Where ``rank``'s full log is, as a view says it."""
        return NOT_KEPT if self.failure is not None else str(self.path(rank))

    def folder_hint(self) -> str:
        return NOT_KEPT if self.failure is not None else str(self.folder)

    def write(self, rank: int, text: str) -> None:
        """Append ``text`` to ``rank``'s log; nothing once the logs of the cell are off."""
        if self.failure is not None:
            return
        try:
            if self._unmade is not None:
                raise self._unmade
            f = self._files.get(rank)
            if f is None:
                f = self._open(rank)
            f.write(text)
        except OSError as err:
            self._fail(err)

    def touch(self, ranks: Iterable[int]) -> None:
        """Make the log of each of ``ranks`` that has none yet (empty: the rank showed
        nothing), so the folder the view names holds every rank's; nothing once the logs
        of the cell are off."""
        for rank in ranks:
            if rank not in self._begun:
                self.write(rank, "")

    def _open(self, rank: int) -> TextIO:
        if not self._begun:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        how = os.O_APPEND if rank in self._begun else os.O_TRUNC
        fd = os.open(self.path(rank), os.O_WRONLY | os.O_CREAT | how, 0o600)
        f = self._files[rank] = open(fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._begun.add(rank)
        return f

    def close(self) -> None:
        """Close the files (a later write opens them again, appending); what is still
        buffered is written now, and may fail as a write does."""
        failed: OSError | None = None
        for f in self._files.values():
            try:
                f.close()  # closes the file even when its last flush fails
            except OSError as err:
                failed = failed or err
        self._files.clear()
        if failed is not None and self.failure is None:
            self._fail(failed)

    def _fail(self, err: OSError) -> None:
        where = os.fspath(err.filename) if err.filename else self.folder
        self.failure = f"rank logs are off for this cell: {unwritable(where, err)}"
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()
        if self.on_failure is not None:
            self.on_failure(self.failure)


def rich_log_text(data: Mapping[str, Any]) -> str:
    """A rich output (a figure, a table, HTML) as its rank's log keeps it: its text."""
    text = strip_ansi(readable_text(data))
    return text if text.endswith("\n") else text + "\n"


_root: Path | None = None


def _logs_root() -> Path:
    """One private folder per notebook process for every cell's logs. The folders of
    processes that are gone are removed then: their logs outlive a crash until the next
    notebook process starts. OSError when it cannot be made (the next cell tries again)."""
    global _root
    if _root is None:
        _root = process_folders.make(Path(tempfile.gettempdir()), LOGS_PREFIX)
    return _root


def _prune(base: Path) -> None:
    process_folders.prune(base, LOGS_PREFIX)


__all__ = ["LOGS_PREFIX", "NOT_KEPT", "RankLogs", "rich_log_text"]
