"""Each rank's lines of a cell's text output, however the lines were folded.

Identical lines of several ranks are shown once (``[ranks 0-1] line``) only when they
arrive close together; on a loaded machine they may come as ``[rank 0] line`` and
``[rank 1] line``. Tests read what each rank printed, not how it was folded.
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^\[ranks? ([0-9,\-]+)\] ?(.*)$")


def _ranks(label: str) -> list[int]:
    found: list[int] = []
    for part in label.split(","):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


def by_rank(text: str) -> dict[int, list[str]]:
    """Rank -> the lines it printed, in order."""
    lines: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = _PREFIX.match(line)
        if match:
            for rank in _ranks(match.group(1)):
                lines.setdefault(rank, []).append(match.group(2))
    return lines


def with_start(text: str, start: str) -> dict[int, list[str]]:
    """Rank -> its lines that begin with ``start``."""
    return {r: [x for x in xs if x.startswith(start)] for r, xs in by_rank(text).items()}
