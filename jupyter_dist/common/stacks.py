"""Where each rank is: faulthandler's stack dumps, parsed, grouped and written for people.

A dump lists every thread, most recent call first. The rank's main thread (the one that
runs cells; its oldest frame is not ``threading``'s bootstrap) tells where the rank is.
Ranks stopped at the same place are grouped: ``ranks 0,1,3: in all_reduce
(distributed_c10d.py:2806), cell line 4``; a rank waiting for its next cell is "idle".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jupyter_dist.text import ranks_label, strip_ansi

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.IGNORECASE)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>\S+)')
_CELL_FILE = re.compile(r"(ipykernel_\d+/\d+\.py|<ipython-input-[^>]*>|<cell>)$")
#: where a kernel waits for its next message, or runs its event loop between cells (a
#: callback of C code has no frame of its own: the loop's ``Handle._run`` is the top one)
_IDLE_FILES = (
    "selectors.py",
    "base_events.py",
    "asyncio/events.py",
    "zmq/",
    "ioloop",
    "threading.py",
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    @property
    def in_cell(self) -> bool:
        return bool(_CELL_FILE.search(self.file))

    def short(self) -> str:
        return f"{self.func} ({os.path.basename(self.file)}:{self.line})"


def parse_dump(text: str) -> list[list[Frame]]:
    """Each thread's frames, most recent first, in the order the dump lists them."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    return threads


def main_thread(threads: list[list[Frame]]) -> list[Frame]:
    """The thread that runs cells: its oldest frame is not a thread bootstrap."""
    for frames in threads:
        if frames and frames[-1].func not in ("_bootstrap", "_bootstrap_inner"):
            return frames
    return threads[0] if threads else []


@dataclass(frozen=True)
class Place:
    """Where a rank is, as a grouping key and a sentence."""

    key: tuple[str, ...]
    text: str
    frames: tuple[Frame, ...]  # from the cell's frame to the innermost, oldest first


def place_of(dump: str) -> Place:
    frames = main_thread(parse_dump(dump))
    if not frames:
        return Place(("unknown",), "no stack dump (the process may be gone)", ())
    cell = next((f for f in frames if f.in_cell), None)
    top = frames[0]
    if cell is None:
        if any(part in top.file for part in _IDLE_FILES):
            return Place(("idle",), "idle (waiting for a cell)", ())
        return Place((top.file, str(top.line)), f"in {top.short()}", tuple(reversed(frames)))
    start = frames.index(cell)
    shown = tuple(reversed(frames[: start + 1]))
    where = f"cell line {cell.line}"
    if top is cell:
        return Place(("cell", str(cell.line)), f"at {where}", shown)
    return Place((top.file, str(top.line), str(cell.line)), f"in {top.short()}, {where}", shown)


def same_place(before: str, after: str) -> bool:
    """Whether two dumps of one rank have its main thread at the same innermost frame
    (inside one call: C code that did not return between them)."""
    one, two = main_thread(parse_dump(before)), main_thread(parse_dump(after))
    return bool(one) and bool(two) and one[0] == two[0]


def group_places(dumps: Mapping[int, str]) -> list[tuple[list[int], Place]]:
    """Ranks at the same place together, the biggest group first."""
    groups: dict[tuple[str, ...], tuple[list[int], Place]] = {}
    for rank in sorted(dumps):
        place = place_of(dumps[rank])
        groups.setdefault(place.key, ([], place))[0].append(rank)
    return sorted(groups.values(), key=lambda g: (-len(g[0]), g[0][0]))


def describe(dumps: Mapping[int, str], frames: bool = True) -> str:
    """``ranks 0,1,3: in all_reduce (...), cell line 4`` per group, with the frames."""
    lines = []
    for ranks, place in group_places(dumps):
        lines.append(f"{ranks_label(ranks)}: {place.text}")
        if frames:
            for frame in place.frames:
                lines.append(f'    File "{frame.file}", line {frame.line}, in {frame.func}')
    return "\n".join(lines)


def one_line(dumps: Mapping[int, str]) -> str:
    """All groups on one line: ``ranks 0,1: in all_reduce (...); rank 2: at cell line 7``."""
    return "; ".join(f"{ranks_label(r)}: {p.text}" for r, p in group_places(dumps))


# IPython's formatted frames, once the colours are stripped:
#   "Cell In[4], line 2"  and  "File /x/distributed_c10d.py:5356, in barrier(group, ...)"
_TB_CELL = re.compile(r"^\s*Cell In\[\d+\], line (?P<line>\d+)")
_TB_FRAME = re.compile(r"^\s*File (?P<file>.+?):(?P<line>\d+), in (?P<func>[\w.<>]+)")
_TB_ARROW = re.compile(r"^-+> ?\d+\s*(?P<code>.*)$")
#: the rank's SIGINT handler (`rank.interrupt_ack`): an interrupt's traceback ends in it,
#: but where the rank was is the frame it interrupted
_ACK_HANDLER_FILE = os.path.join("rank", "interrupt_ack.py")


def place_of_traceback(traceback: Sequence[str]) -> str:
    """Where a traceback IPython formatted (a rank's ``error`` reply) ended, in the words of
    `place_of`: ``at cell line 1: time.sleep(30)`` or ``in barrier
    (distributed_c10d.py:5356), cell line 2``; where no frame is the cell's, the innermost
    (``in do_execute (ipkernel.py:12), outside the cell's code``); "" when it names none."""
    cell_line: int | None = None
    code = ""
    inner: Frame | None = None
    outside: Frame | None = None  # the innermost frame when none is in the cell
    for entry in traceback:
        lines = strip_ansi(entry).splitlines()
        if not lines:
            continue
        cell = _TB_CELL.match(lines[0])
        frame = _TB_FRAME.match(lines[0])
        if cell:
            cell_line, inner = int(cell["line"]), None
            arrow = next((m for m in map(_TB_ARROW.match, lines[1:]) if m), None)
            code = arrow["code"].strip() if arrow else ""
        elif frame and not frame["file"].endswith(_ACK_HANDLER_FILE):
            here = Frame(frame["file"], int(frame["line"]), frame["func"])
            if cell_line is None:
                outside = here
            else:
                inner = here
    if cell_line is None:
        # the interrupt came before the cell's code began or after it ended
        return f"in {outside.short()}, outside the cell's code" if outside else ""
    if inner is None:
        return f"at cell line {cell_line}" + (f": {code}" if code else "")
    return f"in {inner.short()}, cell line {cell_line}"


def is_dump(text: str) -> bool:
    """Whether ``text`` holds a stack dump (at least one thread's header)."""
    return bool(parse_dump(text))
