"""Live displays of a rank (progress bars, tables updated in place) shown once, in that
rank's own view.

A progress UI in a rank is a live display: a widget (tqdm.auto / tqdm.notebook's bar,
Lightning's progress bar, rich's live panel) or an output shown with a display id and
then updated step after step (transformers' notebook progress table). The cell view shows
it in the rank's view, where it advances. The views that gather several ranks' output
(all ranks, a node) would show it again: a widget model drawn a second time, and every
rank's first, soon stale, state of its table, one per rank. So `LiveDisplays` turns what
such a view is given: a live display becomes one line saying where it is (once a rank
and cell, the same words on every rank, so that ranks fold into one line), and a
display's latest state is kept for the cell's end, when the text renderer shows each
rank's last state once (identical ones folded), as the saved notebook's text keeps it.
"""

from __future__ import annotations

import dataclasses

from jupyter_dist.common.events import CellEvent, RichOut, StreamOut

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: the line a gathering view shows for a rank's live display
NOTE = "(a live display: see the rank's own view)\n"


def is_live(event: RichOut) -> bool:
    """A display the rank's view shows live: a widget (shown, or a cell's result), or one
    shown with a display id."""
    if WIDGET_MIME in event.data:
        return True
    shown = event.msg_type != "execute_result"
    return shown and isinstance(event.transient.get("display_id"), str)


class LiveDisplays:
    """What the views gathering several ranks get for one cell's rank events."""

    def __init__(self) -> None:
        self._noted: set[int] = set()

    def for_gathered(self, event: CellEvent) -> list[CellEvent]:
        """``event`` as a gathering view shows it: unchanged unless a live display."""
        if not isinstance(event, RichOut) or not is_live(event):
            return [event]
        shown: list[CellEvent] = []
        if event.msg_type != "update_display_data" and event.rank not in self._noted:
            self._noted.add(event.rank)
            shown.append(StreamOut(event.rank, "stdout", NOTE))
        if WIDGET_MIME not in event.data:
            # kept as the display's latest state: shown once, as it ends, at the cell's end
            shown.append(dataclasses.replace(event, msg_type="update_display_data"))
        return shown
