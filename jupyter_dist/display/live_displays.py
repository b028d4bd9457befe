"""Live displays of ranks (progress bars, tables updated in place) in a view that gathers
several ranks: the first rank's live, the others' folded into one line.

A progress UI in a rank is a live display: a widget (tqdm.auto / tqdm.notebook's bar,
Lightning's progress bars, an ipywidgets bar, rich's live display in its Output widget)
or an output shown with a display id and then updated step after step (transformers'
notebook progress table). Every rank of a data-parallel loop shows the same one. The views
that gather ranks (all ranks, where a cell view opens; a node; the text view) show the
lead rank's (the view's first) where it came among the lines the ranks printed (a
`LiveMark` holds its place in the rows of folded lines, and every other rank's holds
theirs), live: its widgets drawn there too (one model, two places on the page), its
display updated in place where the view can (the cell view; a text view shows its first
and its last state). The other ranks' are one line,
``[ranks 1-3] live progress: in each rank's own view (this view shows rank 0's)``, which
changes as ranks join it. A text view has no rank views: there, what the other ranks'
displays last showed is given when the cell ends, on one line for those like the lead's
(the same but for their numbers: times, rates), shown for those that differ.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.common.events import RichOut
from jupyter_dist.text import ranks_label

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: a view without its lead's display waits this long before it says where the others are
HOLD_S = 0.5
_DIGITS = re.compile(r"\d+(\.\d+)?")


def is_live(event: RichOut) -> bool:
    """A display the rank's view shows live: a widget (shown, or a cell's result), or one
    shown with a display id."""
    if WIDGET_MIME in event.data:
        return True
    shown = event.msg_type != "execute_result"
    return shown and isinstance(event.transient.get("display_id"), str)


def display_id(event: RichOut) -> str | None:
    found = event.transient.get("display_id")
    return found if isinstance(found, str) and WIDGET_MIME not in event.data else None


def alike(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two displays that differ only in their numbers (a progress table's times)."""
    return _DIGITS.sub("#", repr(sorted(a.items()))) == _DIGITS.sub("#", repr(sorted(b.items())))


@dataclass(frozen=True, eq=False)
class LiveMark:
    """A live display's place among its rank's printed lines: the lead rank's display is
    shown there; another rank's holds its row, so that the ranks' lines stay aligned and
    the lines printed around the display still fold."""

    event: RichOut | None = None  # the lead's display; None: another rank's


@dataclass
class LiveFold:
    """What one gathering view did with its ranks' live displays (`TextRenderer` asks)."""

    ranks: Sequence[int]
    #: each rank has a view of its own (the cell view): the line points there
    own_views: bool
    lead: int = field(init=False)
    #: the view updates a display in place (else the lead's last states wait for the end)
    in_place: bool = False
    #: the lead's displays (display id -> their last data), those shown (-> the data
    #: shown), and their updates a view that cannot update in place shows at the end
    lead_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    displayed: dict[str, dict[str, Any]] = field(default_factory=dict)
    updates: dict[str, RichOut] = field(default_factory=dict)
    lead_shown: bool = False
    #: other ranks whose live displays are folded, and when the first came
    folded: list[int] = field(default_factory=list)
    first_folded_at: float | None = None
    #: the fold line's text as shown ("": not shown)
    line: str = ""
    #: text views: each other rank's display's last state (rank, display id) -> event
    latest: dict[tuple[int, str], RichOut] = field(default_factory=dict)
    #: display ids are the notebook's: an update reaches every output of its id, in any
    #: cell, so this view's are its own
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        self.lead = min(self.ranks) if self.ranks else 0

    def lead_id(self, shown_as: str) -> str:
        """The display id the view shows the lead's display ``shown_as`` under."""
        return f"jd-live-{self.token}-{shown_as}"

    @property
    def fold_id(self) -> str:
        return f"jd-live-{self.token}-fold"

    def take(self, event: RichOut) -> LiveMark | tuple[str, RichOut] | None:
        """What a live display becomes: a `LiveMark` to queue among its rank's lines (a
        new display), an update of the lead's display shown, to make in place now (its id
        and the event), or nothing (kept: the mark still queued shows the latest state, a
        text view shows its last at the end)."""
        update = event.msg_type == "update_display_data"
        if event.rank != self.lead:
            self.fold(event)
            return None if update else LiveMark()
        shown_as = display_id(event)
        if shown_as is None:
            return LiveMark(event)
        key = self.lead_id(shown_as)
        known = key in self.lead_states
        self.lead_states[key] = event.data
        if not update or not known:  # (an update of what an earlier cell showed: anew)
            return LiveMark(event)
        if key not in self.displayed:
            return None
        if self.in_place:
            return key, event
        self.updates[key] = event
        return None

    def to_show(self, event: RichOut) -> tuple[RichOut, str | None]:
        """The lead's display where its mark came, in its latest state, and the id to
        show it under (None: a widget, or a view that updates nothing in place)."""
        self.lead_shown = True
        shown_as = display_id(event)
        if shown_as is None:
            return event, None
        key = self.lead_id(shown_as)
        data = self.lead_states.get(key, event.data)
        self.displayed[key] = data
        latest = dataclasses.replace(event, msg_type="display_data", data=data)
        return latest, key if self.in_place else None

    def fold(self, event: RichOut) -> None:
        """Another rank's live display: folded (and kept for a text view's end)."""
        if event.rank not in self.folded:
            self.folded.append(event.rank)
            self.folded.sort()
        if self.first_folded_at is None:
            self.first_folded_at = time.monotonic()
        shown_as = display_id(event)
        if shown_as is not None and not self.own_views:
            self.latest[(event.rank, shown_as)] = event

    def line_due(self, now: float) -> str | None:
        """The fold line's text when it should be shown or changed now, else None. In a
        view with rank views of their own: under the lead's display once it came, or on
        its own after `HOLD_S` without it."""
        if not self.own_views or not self.folded:
            return None
        waited = self.first_folded_at is not None and now - self.first_folded_at >= HOLD_S
        if not (self.lead_shown or waited):
            return None
        label = ranks_label(self.folded)
        where = f"{label}'s own view" if len(self.folded) == 1 else "each rank's own view"
        text = f"[{label}] live progress: in {where}"
        if self.lead_shown:
            text += f" (this view shows rank {self.lead}'s)"
        return None if text == self.line else text

    def at_end(self) -> tuple[list[tuple[list[int], RichOut]], list[RichOut], str]:
        """A text view's end: the lead's last states not shown yet, to show with the other
        ranks whose last state is the same; the other ranks' states that differ (to show);
        one line for the ranks whose displays were like the lead's ("" when none)."""
        due = [u for key, u in self.updates.items() if u.data != self.displayed.get(key)]
        self.updates.clear()
        groups = [([event.rank], event) for event in due]
        differ: list[RichOut] = []
        same: set[int] = set()
        for (rank, _shown_as), event in sorted(self.latest.items()):
            group = next((g for g in groups if g[1].data == event.data), None)
            if group is not None:
                group[0].append(rank)
                same.add(rank)
            elif not any(alike(event.data, lead) for lead in self.lead_states.values()):
                differ.append(event)
        self.latest.clear()
        apart = same | {event.rank for event in differ}
        ranks = [rank for rank in self.folded if rank not in apart]
        if not ranks or self.own_views:  # there the line was shown as the cell ran
            return groups, differ, ""
        if self.lead_shown:
            line = f"[{ranks_label(ranks)}] live progress like rank {self.lead}'s above"
        else:
            line = f"[{ranks_label(ranks)}] live progress (widgets, which text does not draw)"
        return groups, differ, line


def marked_row(ranks: Sequence[int], row: Sequence[str | LiveMark]) -> list[str | LiveMark]:
    """A row of the ranks' queued lines with live displays' marks: its lines folded (as
    ``[ranks 0-1] line``), then the lead's display."""
    groups: dict[str, list[int]] = {}
    for rank, line in zip(ranks, row, strict=True):
        if isinstance(line, str):
            groups.setdefault(line, []).append(rank)
    shown: list[str | LiveMark] = [f"[{ranks_label(rs)}] {text}\n" for text, rs in groups.items()]
    shown.extend(line for line in row if isinstance(line, LiveMark) and line.event is not None)
    return shown
