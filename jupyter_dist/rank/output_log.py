"""What a rank showed, kept on its node: the rank's output log.

Everything a rank's cells show goes to the notebook over IOPub; the rank keeps a copy in
its output log too, so that the sidebar's "log" of a rank holds its printed output, the
tracebacks of its errors and its rich output as text, whoever ran the cell (a notebook,
a console) and whether or not a notebook still looks. Each cell begins with a line
naming it. The process log beside it (fds 1 and 2 of the process before ipykernel takes
them over, thread dumps, faulthandler) is the rank's diagnostics, kept apart.

The log is bounded: it is written in parts of at most `PART_BYTES`, each named after the
offset of its first byte in the whole log (``<base>.<offset>``), and only the last
`PARTS` are kept. Offsets thus stay meaningful while parts are dropped: a reader that
follows the log from an offset gets what follows it, or is told what was dropped
(`read_output`). The agent removes a rank's parts before it starts the rank again
(`remove_parts`), so a restarted rank's log starts at 0.

Writes come from several threads (the kernel's, ipykernel's IO thread reading fds 1 and
2, the user's threads) and go straight to the file, one ``write`` each, so that what a
stuck rank printed last is already there. A write that fails (a full disk) costs the
log only.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import threading
import time

#: the most bytes one part holds (a write bigger than that is a part of its own)
PART_BYTES = 1 << 20
#: the parts kept: the log holds about the last ``PARTS * PART_BYTES`` bytes
PARTS = 4
_PART = re.compile(r"\.(\d{1,15})$")


def parts(base: str) -> list[tuple[int, str]]:
    """The parts of the log at ``base``, as (offset of the first byte, path), in order."""
    found = []
    for path in glob.glob(glob.escape(base) + ".*"):
        match = _PART.search(path)
        if match and path[: match.start()] == base:
            found.append((int(match.group(1)), path))
    return sorted(found)


def remove_parts(base: str) -> None:
    """Remove the log at ``base`` (the rank starts again)."""
    for _start, path in parts(base):
        with contextlib.suppress(OSError):
            os.unlink(path)


class OutputLog:
    """The writer, in the rank."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._lock = threading.Lock()
        self._fd = -1
        self._start = 0
        self._size = 0
        found = parts(base)
        if found:  # appending after what is there (not the usual case: see remove_parts)
            self._start, path = found[-1]
            with contextlib.suppress(OSError):
                self._size = os.path.getsize(path)

    def write(self, text: str) -> None:
        if not text:
            return
        data = text.encode(errors="replace")
        with self._lock:
            try:
                if self._fd < 0 or (self._size and self._size + len(data) > PART_BYTES):
                    self._next_part()
                os.write(self._fd, data)
                self._size += len(data)
            except OSError:  # no space left: the notebook still has the output
                pass

    def cell(self, count: int | None) -> None:
        """The line that begins a cell's output."""
        when = time.strftime("%H:%M:%S")
        name = f"In [{count}]" if count else "a cell"
        self.write(f"\n--- {name}, {when} ---\n")

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _next_part(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._start += self._size
            self._size = 0
        path = f"{self.base}.{self._start}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        for _start, old in parts(self.base)[:-PARTS]:
            with contextlib.suppress(OSError):
                os.unlink(old)


def read_output(base: str, offset: int, limit: int) -> tuple[str, int, int]:
    """At most ``limit`` bytes of the log at ``base`` from ``offset``, cut at a line's end
    when there is one; returns (text, where it starts, the offset after it).

    An offset the log has dropped reads on from its oldest part, the text beginning with
    a line that says how much was dropped; an offset past the log's end (the rank was
    started again) reads from the beginning."""
    found = parts(base)
    sizes = []
    for start, path in found:
        try:
            sizes.append((start, path, os.path.getsize(path)))
        except OSError:  # dropped meanwhile
            continue
    if not sizes:
        return "", 0, 0
    end_of_log = sizes[-1][0] + sizes[-1][2]
    if offset > end_of_log:
        offset = 0
    note = ""
    if offset < sizes[0][0]:
        dropped = sizes[0][0] - offset
        note = (
            f"[{dropped:,} bytes of older output dropped: the log keeps about the last "
            f"{PARTS * PART_BYTES // (1 << 20)} MiB]\n"
        )
        offset = sizes[0][0]
    for start, path, size in sizes:
        if start <= offset < start + size:
            try:
                with open(path, "rb") as f:
                    f.seek(offset - start)
                    data = f.read(limit)
            except OSError:
                return note, offset, offset
            if len(data) == limit and b"\n" in data:
                data = data[: data.rindex(b"\n") + 1]
            return note + data.decode(errors="replace"), offset, offset + len(data)
    return note, offset, offset


#: the rank's output log, once `open_log` opened it (None in any other process)
current: OutputLog | None = None


def open_log(base: str) -> OutputLog:
    """Open the rank's output log at ``base``; `current` from now on."""
    global current
    current = OutputLog(base)
    return current
