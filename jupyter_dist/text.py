"""Plain text helpers every role uses: terminal colour codes and rank lists.

Part of the base: it imports nothing of jupyter_dist, so errors, the control plane and the
display all strip colours and name ranks the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: a terminal colour (SGR) or cursor code, as IPython tracebacks and rank output carry
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (IPython tracebacks carry them)."""
    return ANSI.sub("", text)


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: the same syntax ``--ranks`` accepts."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def ranks_label(ranks: Sequence[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-3"``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
