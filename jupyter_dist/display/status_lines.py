"""Lines of a text cell's output that update in place: what the cell waits for.

A waiting cell is told each second what it waits for ("waiting for a cell from
train.ipynb (running 8 s)"). Printed, that is a new line a second; here it is one output
(a display with an id) that each news replaces, and that is emptied when the wait ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: shows a bundle: IPython's ``display(bundle, raw=True, display_id=True)`` by default
DisplayWithId = Callable[[dict[str, Any]], Any]


def _display(bundle: dict[str, Any]) -> Any:
    from IPython.display import display

    return display(bundle, raw=True, display_id=True)  # type: ignore[no-untyped-call]


class StatusLines:
    """One output per line name, made at its first text and updated after."""

    def __init__(self, show: DisplayWithId = _display) -> None:
        self.show = show
        self.handles: dict[str, Any] = {}
        self.texts: dict[str, str] = {}

    def set(self, line: str, text: str) -> None:
        """Show ``text`` on ``line`` (an empty text empties it)."""
        if self.texts.get(line, "") == text:
            return
        self.texts[line] = text
        bundle = {"text/plain": f"[jupyter_dist] {text}" if text else ""}
        handle = self.handles.get(line)
        if handle is None:
            if text:
                self.handles[line] = self.show(bundle)
            return
        handle.update(bundle, raw=True)

    def clear(self) -> None:
        """Empty every line (the cell ended)."""
        for line in list(self.handles):
            self.set(line, "")
