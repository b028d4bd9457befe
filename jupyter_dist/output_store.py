"""Bounded output of one view of a cell: the last lines kept, the rest counted.

A view (one rank, one node, or every rank interleaved) keeps at most `LINE_LIMIT` lines
plus its rich outputs, in the order they came; older ones are dropped and counted, so the
notebook's memory stays bounded however much a rank prints. Each rank's full output also
goes to a log file (`RankLogs`) whose path the view shows.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

LINE_LIMIT = 400
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class ViewOutput:
    """The kept entries of one view: ``("stdout"|"stderr", line)`` or ``("rich", output)``."""

    limit: int = LINE_LIMIT
    entries: collections.deque[tuple[str, Any]] = field(default_factory=collections.deque)
    hidden: int = 0
    version: int = 0  # bumped on every change, so a view redraws only when it moved

    def add_line(self, stream: str, line: str) -> None:
        self.entries.append((stream, line))
        self._trim()

    def add_rich(self, output: dict[str, Any]) -> None:
        self.entries.append(("rich", output))
        self._trim()

    def _trim(self) -> None:
        while len(self.entries) > self.limit:
            self.entries.popleft()
            self.hidden += 1
        self.version += 1

    def as_outputs(self) -> list[dict[str, Any]]:
        """Jupyter output dicts (an Output widget's ``outputs``): runs of lines of one stream
        become one stream output; rich outputs stay where they came."""
        outputs: list[dict[str, Any]] = []
        run: list[str] = []
        run_name = ""
        for kind, value in self.entries:
            if kind == "rich":
                if run:
                    outputs.append(_stream(run_name, run))
                    run = []
                outputs.append(value)
                continue
            if run and kind != run_name:
                outputs.append(_stream(run_name, run))
                run = []
            run_name = kind
            run.append(value)
        if run:
            outputs.append(_stream(run_name, run))
        return outputs

    def plain_text(self) -> str:
        lines = [v if k != "rich" else _rich_text(v) for k, v in self.entries]
        return "\n".join(_ANSI.sub("", line) for line in lines)


class LineWriter:
    """A text file that feeds complete lines of one stream into a `ViewOutput`."""

    def __init__(self, view: ViewOutput, stream: str) -> None:
        self.view = view
        self.stream = stream
        self._partial = ""

    def write(self, text: str) -> int:
        text = self._partial + text
        *lines, self._partial = text.split("\n")
        for line in lines:
            self.view.add_line(self.stream, line)
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self.view.add_line(self.stream, self._partial)
            self._partial = ""


class RankLogs:
    """Every line each rank printed in a cell, in ``<folder>/rank-N.log`` (0600 files in a
    0700 folder of this user's)."""

    def __init__(self, session: str, cell: int, base: str | None = None) -> None:
        root = Path(base or _logs_root()) / session / f"cell-{cell}"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.folder = root
        self._files: dict[int, TextIO] = {}

    def path(self, rank: int) -> Path:
        return self.folder / f"rank-{rank}.log"

    def write(self, rank: int, text: str) -> None:
        f = self._files.get(rank)
        if f is None:
            fd = os.open(self.path(rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            f = self._files[rank] = open(fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        f.write(text)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


_root: str | None = None


LOGS_PREFIX = "jupyter_dist-logs-"


def _logs_root() -> str:
    """One private folder per notebook process for every cell's logs. The folders of
    processes that are gone are removed then: their logs outlive a crash until the next
    notebook process starts."""
    global _root
    if _root is None:
        _prune(Path(tempfile.gettempdir()))
        _root = tempfile.mkdtemp(prefix=f"{LOGS_PREFIX}{os.getpid()}-")
    return _root


def _prune(base: Path) -> None:
    for folder in base.glob(f"{LOGS_PREFIX}*-*"):
        pid = folder.name.removeprefix(LOGS_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or folder.owner() != _me():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            continue


def _me() -> str:
    import getpass

    return getpass.getuser()


def _stream(name: str, lines: list[str]) -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": "\n".join(lines) + "\n"}


def _rich_text(output: dict[str, Any]) -> str:
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return str(output.get("data", {}).get("text/plain", "[rich output]"))
