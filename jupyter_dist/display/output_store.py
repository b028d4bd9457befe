"""Bounded output of one view of a cell: the last lines kept, the rest counted.

A view (one rank, one node, or every rank interleaved) keeps at most `LINE_LIMIT` lines
(and `CHAR_LIMIT` characters of them) plus its rich outputs, in the order they came; older
ones are dropped and counted, and a line longer than `LINE_CHARS` is cut, so the
notebook's memory stays bounded however much a rank prints, in lines or in one line that
never ends. Each rank's full output also goes to a log file (`display.rank_logs`) whose
path the view shows. `output_limit` is how much of each rank's output a cell passes on as text
(``JUPYTER_DIST_OUTPUT_LIMIT``); the rest is only in the log.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.display.rich_text import readable_text
from jupyter_dist.errors import SpecError
from jupyter_dist.settings import OUTPUT_LIMIT_VAR
from jupyter_dist.text import strip_ansi

LINE_LIMIT = 400
#: a view keeps at most this many characters of lines (for 1 KiB lines, the last 100)
CHAR_LIMIT = 100_000
#: a longer line is cut in the views (the log has it whole)
LINE_CHARS = 10_000
#: characters of each rank's output a cell passes on as text, unless the variable says
DEFAULT_OUTPUT_LIMIT = 2 * 1024 * 1024
_SIZE = re.compile(r"(\d+)\s*([kmg]?)(i?b)?", re.IGNORECASE)


def output_limit(environ: Mapping[str, str] | None = None) -> int:
    """``JUPYTER_DIST_OUTPUT_LIMIT``: how many characters of each rank's output one cell
    passes on as text (``2M`` by default; ``k``, ``M``, ``G`` suffixes; ``0``: no limit)."""
    raw = (os.environ if environ is None else environ).get(OUTPUT_LIMIT_VAR, "").strip()
    if not raw:
        return DEFAULT_OUTPUT_LIMIT
    match = _SIZE.fullmatch(raw)
    if match is None:
        raise SpecError(
            f"{OUTPUT_LIMIT_VAR}={raw!r}: expected a size such as 2M, 500k or 0 (no limit)"
        )
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match.group(2).lower()]
    return int(match.group(1)) * scale


def format_size(chars: int) -> str:
    """``1.0 GiB``, ``2.0 MiB``, ``512 KiB``, ``30 B`` (characters, read as bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if chars >= scale:
            return f"{chars / scale:.1f} {unit}"
    return f"{chars >> 10} KiB" if chars >= 1 << 10 else f"{chars} B"


def cut_line(line: str, extra: int = 0) -> str:
    """``line`` cut to `LINE_CHARS`, saying how much more there was (``extra`` characters
    of it were never kept)."""
    if len(line) + extra <= LINE_CHARS:
        return line
    over = len(line) + extra - LINE_CHARS
    return f"{line[:LINE_CHARS]} ... [{over} more characters in the full log]"


@dataclass
class ViewOutput:
    """The kept entries of one view: ``("stdout"|"stderr", line)`` or ``("rich", output)``."""

    limit: int = LINE_LIMIT
    entries: collections.deque[tuple[str, Any]] = field(default_factory=collections.deque)
    hidden: int = 0
    version: int = 0  # bumped on every change, so a view redraws only when it moved
    char_limit: int = CHAR_LIMIT
    chars: int = 0  # characters of the kept lines
    #: display id -> its kept output (``display(..., display_id=True)``, updated later)
    displays: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_line(self, stream: str, line: str) -> None:
        self.entries.append((stream, line))
        self.chars += len(line)
        self._trim()

    def add_lines(self, stream: str, lines: list[str], skipped: int = 0) -> None:
        """Several lines at once, after ``skipped`` earlier ones that were never added
        (counted as hidden)."""
        self.hidden += skipped
        self.entries.extend((stream, line) for line in lines)
        self.chars += sum(map(len, lines))
        self._trim()

    def add_rich(self, output: dict[str, Any], display_id: str | None = None) -> None:
        """Keep a rich output; one with a ``display_id`` may be updated later."""
        self.entries.append(("rich", output))
        if display_id:
            self.displays.pop(display_id, None)
            self.displays[display_id] = output
            while len(self.displays) > self.limit:  # the oldest have been trimmed anyway
                del self.displays[next(iter(self.displays))]
        self._trim()

    def update_rich(self, display_id: str, data: dict[str, Any], metadata: dict[str, Any]) -> bool:
        """Show ``data`` in place of the kept output of display ``display_id`` (a progress
        table updated step after step); False when no kept output has that id."""
        shown = self.displays.get(display_id)
        if shown is None:
            return False
        for n, (kind, value) in enumerate(self.entries):
            if kind == "rich" and value is shown:
                updated = {**value, "data": data, "metadata": metadata}
                self.entries[n] = ("rich", updated)
                self.displays[display_id] = updated
                self.version += 1
                return True
        return False

    def clear(self) -> None:
        self.entries.clear()
        self.displays.clear()
        self.chars = 0
        self.version += 1

    def _trim(self) -> None:
        entries = self.entries
        while len(entries) > self.limit or (self.chars > self.char_limit and len(entries) > 1):
            kind, value = entries.popleft()
            if kind != "rich":
                self.chars -= len(value)
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

    def plain_text(self, text_of: Callable[[dict[str, Any]], str | None] | None = None) -> str:
        """The view as text; ``text_of`` may give a rich output's text first (a widget's
        last state)."""
        lines = [
            v if k != "rich" else (text_of(v) if text_of is not None else None) or _rich_text(v)
            for k, v in self.entries
        ]
        return "\n".join(strip_ansi(line) for line in lines)


class LineWriter:
    """A text file that feeds complete lines of one stream into a `ViewOutput`.

    However much comes in one write, only the lines the view can keep are split out (the
    others are counted), and a line that goes on and on is held only up to `LINE_CHARS`.
    """

    def __init__(self, view: ViewOutput, stream: str) -> None:
        self.view = view
        self.stream = stream
        self._partial = ""  # the line begun, at most LINE_CHARS of it
        self._extra = 0  # characters of that line past LINE_CHARS, not held

    def write(self, text: str) -> int:
        last = text.rfind("\n")
        if last < 0:
            self._hold(text)
            return len(text)
        first = text.find("\n")
        self._hold(text[:first])
        self.view.add_line(self.stream, self._take())
        if first < last:
            start = first + 1
            count = text.count("\n", start, last) + 1  # lines between the two
            keep = min(count, self.view.limit)
            begin = start
            if count > keep:  # only the last `keep` of them can stay in the view
                begin = last
                for _ in range(keep):
                    begin = text.rfind("\n", start, begin)
                begin += 1
            lines = [cut_line(line) for line in text[begin:last].split("\n")]
            self.view.add_lines(self.stream, lines, skipped=count - keep)
        self._hold(text[last + 1 :])
        return len(text)

    def _hold(self, text: str) -> None:
        room = LINE_CHARS - len(self._partial)
        if room > 0:
            self._partial += text[:room]
        self._extra += max(0, len(text) - max(room, 0))

    def _take(self) -> str:
        line = cut_line(self._partial, self._extra)
        self._partial, self._extra = "", 0
        return line

    def flush(self) -> None:
        if self._partial or self._extra:
            self.view.add_line(self.stream, self._take())


def _stream(name: str, lines: list[str]) -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": "\n".join(lines) + "\n"}


def _rich_text(output: dict[str, Any]) -> str:
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    data = output.get("data")
    return readable_text(data) if isinstance(data, Mapping) and data else "[rich output]"
