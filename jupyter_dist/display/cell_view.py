"""The widget view of one ``%%distributed`` cell: status chips, a view per rank, node and
all ranks, live metric charts, a "stacks" button (where every rank is, answered while the
cell runs) and a footer with the cell's summary and log folder.

It is a `Renderer` like the text one: the notebook thread feeds it `CellEvent` values
and calls `tick` between them. Kernel-side changes are coalesced: the widgets are
redrawn at most every `RENDER_INTERVAL_S`, and only the views that changed, so a flood of
output does not freeze the browser. A rank that has printed more than the output limit
(``JUPYTER_DIST_OUTPUT_LIMIT``) in the cell is flooding: its view is redrawn at most every
`FLOOD_RENDER_INTERVAL_S`, and the node and all-ranks views show a marker naming its log
instead of the rest of its output. Switching views happens in the browser (the selector
is linked to the view stack there), so it works while the cell still runs. Rank 0's
live displays (progress bars, tables updated in place) are live in the all-ranks view,
where a cell opens, the other ranks' one line there (`display.live_displays`); what a
rank shows inside one of its ipywidgets Output widgets (rich's live display: Lightning's
default progress bar) is put in the widget here, as a browser would
(`display.output_widgets`).

The live widgets are for the running cell, and only for one still running after
`LIVE_AFTER_S`: a cell that ends sooner (most cells of an interactive session) shows its
snapshot at once, without some thirty widgets made, sent to the browser and closed again
within a few milliseconds, which cost the notebook kernel about four times a whole text
cell. When a cell ends, its display is replaced by a
snapshot (`display.snapshot`): self-contained HTML with the chips, each rank's output, the
charts as inline SVG and the summary, plus the folded, rank-prefixed text as text/plain.
A saved notebook, a restarted kernel, nbconvert, nbviewer and GitHub all show that,
where a widget would say "model not found"; and the view's widgets are closed, so the
notebook kernel's memory does not grow with every cell it runs. `LIVE_VIEWS` bounds the
views left live by cells that never finished.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from jupyter_dist.common.events import (
    CellEvent,
    CellFinished,
    ClearOut,
    InputAsked,
    InputEnded,
    MetricsOut,
    Notice,
    RankFinished,
    RankStarted,
    RichOut,
    StreamOut,
    WidgetComm,
)
from jupyter_dist.display.failure_text import failure_log_text
from jupyter_dist.display.live_displays import WIDGET_MIME
from jupyter_dist.display.metrics_charts import MetricsView
from jupyter_dist.display.output_store import LineWriter, ViewOutput, output_limit
from jupyter_dist.display.output_widgets import Captured, OutputWidgets, output_text
from jupyter_dist.display.rank_logs import RankLogs, rich_log_text
from jupyter_dist.display.render_text import TextRenderer
from jupyter_dist.display.snapshot import snapshot_html, widget_text
from jupyter_dist.display.stacks_panel import StacksPanel
from jupyter_dist.display.status_chips import (
    STATE_OF_FINISH,
    RankStatus,
    cell_summary,
    chips_html,
    input_line,
    input_state,
)
from jupyter_dist.display.widget_relay import WidgetRelay
from jupyter_dist.text import ranks_label

#: at most this many redraws a second
RENDER_INTERVAL_S = 0.1
#: ... and a flooding rank's view at most this often
FLOOD_RENDER_INTERVAL_S = 1.0
#: more ranks than this: a dropdown instead of a row of buttons
BUTTONS_UP_TO = 8
#: how many cell views stay live widgets; older ones are retired to a static copy
LIVE_VIEWS = 30
#: a cell still running after this many seconds gets its live widgets; one that ends
#: sooner is shown as its snapshot only
LIVE_AFTER_S = 0.25

DisplayFn = Callable[..., Any]


def _set_line(lines: list[tuple[str, str]], line: str, text: str) -> list[tuple[str, str]]:
    """``lines`` with ``text`` under the name ``line`` (in its place if it is there; none
    if ``text`` is empty); a notice without a name is added."""
    if not line:
        return [*lines, (line, text)] if text else lines
    if any(name == line for name, _ in lines):
        return [
            (name, text if name == line else old) for name, old in lines if name != line or text
        ]
    return [*lines, (line, text)] if text else lines


class View:
    """One entry of the selector: its kept output and the widget showing it."""

    def __init__(self, label: str, log_hint: Callable[[], str]) -> None:
        self.label = label
        self.log_hint = log_hint
        self._output: ViewOutput | None = None  # made with its first use: most stay empty
        self.widget: widgets.Output | None = None  # made when the cell view goes live
        self.drawn = -1
        self.drawn_at = 0.0
        self.interval = 0.0  # at least this long between redraws (a flooding rank's view)

    @property
    def output(self) -> ViewOutput:
        if self._output is None:
            self._output = ViewOutput()
        return self._output

    @property
    def version(self) -> int:
        """Its output's version: 0 while nothing was put in it."""
        return 0 if self._output is None else self._output.version

    def build(self) -> widgets.Output:
        self.widget = widgets.Output(layout=widgets.Layout(max_height="480px", overflow="auto"))
        self.widget.add_class("jd-view")
        return self.widget

    def render(self, now: float = 0.0, final: bool = True) -> None:
        if self.widget is None or self.version == self.drawn:
            return
        if not final and now - self.drawn_at < self.interval:
            return
        self.drawn = self.output.version
        self.drawn_at = now
        outputs = self.output.as_outputs()
        if self.output.hidden:
            marker = {
                "output_type": "stream",
                "name": "stdout",
                "text": f"... {self.output.hidden} earlier lines hidden; full log: "
                f"{self.log_hint()}\n",
            }
            outputs.insert(0, marker)
        self.widget.outputs = tuple(outputs)


@dataclass
class LiveParts:
    """The widgets of a cell view that went live."""

    header: widgets.HTML
    selector: widgets.ToggleButtons | widgets.Dropdown
    link: widgets.Link
    footer: widgets.HTML
    stacks: StacksPanel | None
    root: widgets.VBox


class CellView:
    """Renders one cell's events into ipywidgets (once the cell has run `live_after`
    seconds), and into its snapshot when it ends."""

    def __init__(
        self,
        session: str,
        cell: int,
        places: dict[int, tuple[str, int]],  # rank -> (host, node rank)
        relay: WidgetRelay | None = None,
        display: DisplayFn | None = None,
        read_stacks: Callable[[], str] | None = None,
        log_url: Callable[[Path], str | None] | None = None,
        live_after: float = LIVE_AFTER_S,
    ) -> None:
        self.ranks = sorted(places)
        self.statuses = {r: RankStatus(r, places[r][0], places[r][1]) for r in self.ranks}
        self.logs = RankLogs(session, cell, on_failure=self._notice)  # a full disk: a notice
        self.log_url = log_url(self.logs.folder) if log_url is not None else None
        self.limit = output_limit()
        self.printed = dict.fromkeys(self.ranks, 0)  # characters each rank printed
        self.relay = relay
        self.notices: list[str] = []
        #: notices the cell's outcome supersedes, with their line's name ("": their own)
        self.transient: list[tuple[str, str]] = []
        self.metrics = MetricsView(self.ranks)
        self.finished = False
        self._last_render = 0.0

        self.rank_views = {r: View(f"rank {r}", self._rank_log(r)) for r in self.ranks}
        #: (rank, stream) -> what splits its output into the rank's view, once it printed
        self._rank_writers: dict[tuple[int, str], LineWriter] = {}
        nodes = sorted({node for _host, node in places.values()})
        self.node_views: dict[int, View] = {}
        self._node_text: dict[int, TextRenderer] = {}
        if len(nodes) > 1:
            for node in nodes:
                members = [r for r in self.ranks if places[r][1] == node]
                host = places[members[0]][0]
                view = self.node_views[node] = View(f"node {node} ({host})", self._log_folder)
                self._node_text[node] = _text_into(view, members, self.logs, self.limit)
        #: the ranks' Output widgets, filled here as the browser would (a rank's output
        #: inside ``with out:``), and those changed since sent
        self._outputs = OutputWidgets()
        self._changed: dict[str, Captured] = {}
        self.all_view = View("all ranks", self._log_folder)
        self._all_text = _text_into(self.all_view, self.ranks, self.logs, self.limit)
        self.views = [
            *self.rank_views.values(),
            *self.node_views.values(),
            *([self.all_view] if len(self.ranks) > 1 else []),
        ]

        # the view shown (the selector's index once live): every rank's output, each line
        # with its rank, as in text output; one rank's own view for a cell on one rank
        self.selected = self.views.index(self.all_view) if len(self.ranks) > 1 else 0
        self.footer_html = ""
        self._read_stacks = read_stacks
        self.live_after = live_after
        self.live: LiveParts | None = None
        self._display = display
        self._shown_at: float | None = None
        self._handle: Any = None
        self._text = ""  # the text/plain copy, once the cell ended
        self.snapshot = ""  # the HTML that replaces the view once the cell ended
        self.retired = False
        self.quiet = False  # ended with nothing to show, and shown nothing
        self._culprit_shown = False

    # -- showing ----------------------------------------------------------------------
    def show(self) -> None:
        """Start showing the cell (once, before the first event): its live widgets once it
        has run `live_after` seconds (at once if that is 0), else its snapshot when it
        ends."""
        self._shown_at = time.monotonic()
        if self.live_after <= 0:
            self._go_live()

    def _go_live(self) -> None:
        """Make the widgets, put them in the cell's output, and draw what came so far."""
        header = widgets.HTML(chips_html(list(self.statuses.values())))
        header.add_class("jd-status")
        stack = widgets.Stack([v.build() for v in self.views], selected_index=self.selected)
        labels = [v.label for v in self.views]
        selector: widgets.ToggleButtons | widgets.Dropdown
        if len(self.ranks) <= BUTTONS_UP_TO:
            selector = widgets.ToggleButtons(
                options=labels, index=self.selected, style={"button_width": "auto"}
            )
        else:
            selector = widgets.Dropdown(options=labels, index=self.selected, description="show")
        selector.add_class("jd-select")
        link = widgets.jslink((selector, "index"), (stack, "selected_index"))
        footer = widgets.HTML(self.footer_html)
        footer.add_class("jd-footer")
        read = self._read_stacks
        stacks = StacksPanel.where_answerable(read) if read is not None else None
        tools: list[widgets.Widget] = [selector] if len(self.views) > 1 else []
        if stacks is not None:
            tools.append(stacks.button)
        parts: list[widgets.Widget] = [header]
        if tools:
            parts.append(widgets.HBox(tools) if len(tools) > 1 else tools[0])
        if stacks is not None:
            parts.append(stacks.text)
        parts += [stack, self.metrics.build(), footer]
        root = widgets.VBox(parts)
        root.add_class("jd-cell-view")
        self.live = LiveParts(header, selector, link, footer, stacks, root)
        self.render(final=False)
        bundle = {
            WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": root.model_id},
            "text/plain": f"[jupyter_dist] running on {ranks_label(self.ranks)}",
        }
        self._handle = self._show(bundle, display_id=True)
        _live.append(self)
        while len(_live) > LIVE_VIEWS:
            _live.popleft().retire()

    # -- events ---------------------------------------------------------------------------
    def handle(self, event: CellEvent) -> None:
        if self.relay is not None and (model := self._outputs.capture(event)) is not None:
            if isinstance(event, StreamOut):  # a display's frames are not logged: its last is
                self.logs.write(event.rank, event.text)
            self._changed[model.comm_id] = model
        elif isinstance(event, StreamOut):
            self.logs.write(event.rank, event.text)
            printed = self.printed[event.rank] = self.printed[event.rank] + len(event.text)
            if self.limit and printed > self.limit:
                self.rank_views[event.rank].interval = FLOOD_RENDER_INTERVAL_S
            name = "stderr" if event.name == "stderr" else "stdout"
            writer = self._rank_writers.get((event.rank, name))
            if writer is None:
                writer = LineWriter(self.rank_views[event.rank].output, name)
                self._rank_writers[(event.rank, name)] = writer
            writer.write(event.text)
            self._to_text(event)
        elif isinstance(event, RichOut):
            self._rich(event)
        elif isinstance(event, ClearOut):
            self.rank_views[event.rank].output.clear()
        elif isinstance(event, InputAsked | InputEnded):
            self._input(event)
        elif isinstance(event, RankStarted):
            status = self.statuses[event.rank]
            if status.started is None:
                status.started = time.monotonic()
                status.state = "running"
        elif isinstance(event, RankFinished):
            self._rank_finished(event)
            self._to_text(event)
        elif isinstance(event, MetricsOut):
            self.metrics.add(event.rank, event.points)
            if event.process:
                self.statuses[event.rank].process = event.process
        elif isinstance(event, WidgetComm):
            note = self._relay(event)
            if note:
                self._notice(note)
        elif isinstance(event, Notice):
            self._notice(event.text, event.transient, event.line)
        elif isinstance(event, CellFinished):
            self.finish()

    def _rich(self, event: RichOut) -> None:
        """Into the rank's view (a display with an id updated in place), and the views
        gathering ranks."""
        if event.msg_type != "update_display_data":
            self.logs.write(event.rank, rich_log_text(event.data))
        output: dict[str, Any] = {
            "output_type": "display_data",
            "data": event.data,
            "metadata": event.metadata,
        }
        if event.msg_type == "execute_result":
            output = {**output, "output_type": "execute_result", "execution_count": None}
        display_id = event.transient.get("display_id")
        shown_as = display_id if isinstance(display_id, str) else None
        if event.msg_type != "update_display_data":
            self.rank_views[event.rank].output.add_rich(output, shown_as)
        elif shown_as is not None:  # a library's progress table, step after step
            self.rank_views[event.rank].output.update_rich(shown_as, event.data, event.metadata)
        self._to_text(event)

    def _to_text(self, event: CellEvent) -> None:
        """Into the views that gather ranks (all ranks, nodes), where the first rank's
        live displays are live and the others' folded (`display.live_displays`)."""
        self._all_text.handle(event)
        rank = getattr(event, "rank", None)
        for node, renderer in self._node_text.items():
            if rank is None or self.statuses[rank].node == node:
                renderer.handle(event)

    def _relay(self, event: WidgetComm) -> str | None:
        """A rank's widget message to the browser (what its Output widgets hold first,
        before one closes)."""
        if self.relay is None or self._outputs.watch(event):
            return None
        if event.msg_type == "comm_close":
            self._send_outputs()
        return self.relay.relay(event)

    def _send_outputs(self) -> None:
        """The Output widgets that took output since last sent, to the browser."""
        if self.relay is None or not self._changed:
            return
        changed = list(self._changed.values())
        self._changed.clear()
        for model in changed:
            self.relay.update(model.comm_id, {"outputs": list(model.outputs)})

    def _notice(self, text: str, transient: bool = False, line: str = "") -> None:
        """Notes about the cell (a straggler, a relay's warning) go in the footer, where
        they are seen whichever view is shown, once (not in the all-ranks view too, which
        is the view a cell opens on). A transient one
        ("interrupting rank 0") is shown in the footer only while the cell runs: the cell's
        outcome says it again, and each fact is said once. A notice with a ``line`` name
        replaces the one shown under that name (one line that updates: what the cell
        waits for), and an empty one takes it away."""
        if transient or line:
            self.transient = _set_line(self.transient, line, text)
        else:
            self.notices.append(text)
        self._set_footer(self._notes_html(self.notices + [t for _, t in self.transient]))

    def _set_footer(self, html: str) -> None:
        self.footer_html = html
        if self.live is not None:
            self.live.footer.value = html

    @staticmethod
    def _notes_html(notes: list[str]) -> str:
        return "".join(f"<pre style='margin:0'>{_escape(n)}</pre>" for n in notes)

    def _input(self, event: InputAsked | InputEnded) -> None:
        """A rank waits for the person (its chip says ``input`` or ``debugging``, the
        footer which ranks wait on it), or no longer does."""
        status = self.statuses.get(event.rank)
        if status is None:
            return
        if isinstance(event, InputAsked):
            status.state = input_state(event.prompt)
        elif status.state in ("input", "debugging"):
            status.state = "running"
        asking = {r: s.state for r, s in self.statuses.items() if s.state in ("input", "debugging")}
        running = [r for r, s in self.statuses.items() if s.state in ("running", "queued")]
        self._notice(input_line(asking, running), transient=True, line="input")

    def _rank_finished(self, event: RankFinished) -> None:
        status = self.statuses[event.rank]
        status.state = STATE_OF_FINISH.get(event.status, "error")
        status.elapsed = event.elapsed
        failure = event.failure
        if failure is None:
            return
        self.logs.write(event.rank, failure_log_text(failure))
        if failure.kind in ("error", "died") and not self._culprit_shown:
            # the view turns to the first rank that failed of its own: the root cause, not
            # the ranks left waiting for it
            self._culprit_shown = True
            self.selected = self.views.index(self.rank_views[event.rank])
            if self.live is not None:
                self.live.selector.index = self.selected
        for name in ("stdout", "stderr"):
            if (writer := self._rank_writers.get((event.rank, name))) is not None:
                writer.flush()
        view = self.rank_views[event.rank].output
        if failure.traceback and failure.kind != "died":
            view.add_rich(
                {
                    "output_type": "error",
                    "ename": failure.ename,
                    "evalue": failure.evalue,
                    "traceback": list(failure.traceback),
                }
            )
        else:
            view.add_line("stderr", f"{failure.ename}: {failure.evalue}")
            for line in failure.traceback:
                view.add_line("stderr", line)

    # -- drawing ----------------------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        if self._due_live(now):
            self._go_live()
        if now - self._last_render >= RENDER_INTERVAL_S:
            self._all_text.tick()
            for renderer in self._node_text.values():
                renderer.tick()
            self.render(now, final=False)

    def _due_live(self, now: float) -> bool:
        """A shown view of a cell still running after `live_after` seconds, not live yet."""
        started = self._shown_at
        if self.live is not None or self.finished or started is None:
            return False
        return now - started >= self.live_after

    def render(self, now: float | None = None, final: bool = True) -> None:
        now = time.monotonic() if now is None else now
        self._last_render = now
        self._send_outputs()
        live = self.live
        if live is None:
            return
        with live.root.hold_sync():
            live.header.value = chips_html(list(self.statuses.values()), now)
            self._label_selector(live.selector)
            for view in self.views:
                view.render(now, final)
            self.metrics.render()

    def _logs_html(self) -> str:
        """``logs: <folder>``, a link that opens it where a Jupyter server serves it."""
        folder = _escape(str(self.logs.folder))
        if self.log_url is None:
            return f"logs: {folder}"
        return (
            f'logs: <a class="jd-logs" href="{_escape(self.log_url)}" target="_blank" '
            f'rel="noopener" title="each rank\'s full output in this cell">{folder}</a>'
        )

    def _label_selector(self, selector: widgets.ToggleButtons | widgets.Dropdown) -> None:
        """The selector's buttons say each rank's state in their tooltips (read aloud by
        screen readers): the chips' news, for keyboard users, who pick views there."""
        if not isinstance(selector, widgets.ToggleButtons):
            return
        tips = [f"{view.label}: {self.statuses[r].state}" for r, view in self.rank_views.items()]
        tips += [view.label for view in self.views[len(tips) :]]
        if list(selector.tooltips) != tips:
            selector.tooltips = tips

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        for writer in self._rank_writers.values():
            writer.flush()
        for model in self._outputs.models.values():  # what an Output widget showed last
            last = [output_text(o) for o in model.outputs if o["output_type"] != "stream"]
            if any(last):
                self.logs.write(model.rank, "".join(t.rstrip("\n") + "\n" for t in last))
        self._all_text.finish()
        for renderer in self._node_text.values():
            renderer.finish()
        for status in self.statuses.values():
            if status.state in ("queued", "running"):
                status.state = "error"
        quiet = self._quiet()
        if not quiet:  # the footer's logs link leads to a log for every rank
            self.logs.touch(self.ranks)
        self.logs.close()
        summary = cell_summary(list(self.statuses.values()))
        lines = [_escape(line) for line in (summary, *self.metrics.summary())]
        if self.logs.kept:  # a silent cell has no logs to point to, nor one whose logs failed
            lines.append(self._logs_html())
        footer = self._notes_html(self.notices) + "<br>".join(lines)
        self._set_footer(footer)
        self.render()
        several = len(self.ranks) > 1
        view = self.all_view if several else self.rank_views[self.ranks[0]]
        shown = view.output.plain_text(self._widget_text)
        self._text = "\n".join([shown, f"[jupyter_dist] {summary}"])
        self.quiet = quiet
        if self.quiet:
            self.retire()
            return
        self.snapshot = snapshot_html(
            [self.statuses[r] for r in self.ranks],
            {r: v.output for r, v in self.rank_views.items()},
            shown if several else None,  # the all-ranks text, once
            self.metrics.series,
            self.footer_html,
            {r: v.log_hint() for r, v in self.rank_views.items()},
            time.monotonic(),
            self.relay.states if self.relay is not None else {},
        )
        self.retire()

    def _widget_text(self, output: dict[str, Any]) -> str | None:
        """A widget's last state as text, for the cell's text copy (None: not a widget)."""
        view = output.get("data", {}).get(WIDGET_MIME)
        if not isinstance(view, dict) or self.relay is None:
            return None
        return widget_text(str(view.get("model_id", "")), self.relay.states)

    def _show(self, bundle: dict[str, Any], display_id: bool = False) -> Any:
        """Put ``bundle`` in the cell's output (IPython's display unless one was given)."""
        from IPython.display import display

        return (self._display or display)(bundle, raw=True, display_id=display_id)

    def _log_folder(self) -> str:
        return self.logs.folder_hint()

    def _rank_log(self, rank: int) -> Callable[[], str]:
        """Where ``rank``'s log is, said only where it is shown (few cells need it)."""
        return lambda: self.logs.hint(rank)

    def _quiet(self) -> bool:
        """A cell that never went live, ran fine on every rank and had nothing to show (no
        output, chart, widget or note) shows nothing, as a plain cell would and as in text
        output: its snapshot would be its only output, a message that costs a quick cell
        a tenth of its time."""
        return (
            self.live is None
            and all(s.state == "done" for s in self.statuses.values())
            and not self.notices
            and not self.metrics.series
            and all(v.version == 0 for v in self.views)
        )

    def retire(self) -> None:
        """Replace the live view in the notebook by its snapshot (self-contained HTML that
        a saved notebook, nbconvert, nbviewer and GitHub show without a kernel), and close
        its widgets; a view that never went live shows its snapshot now. A view retires
        when its cell ends."""
        if self.retired:
            return
        self.finish()
        self.retired = True
        final = {"text/plain": self._text, "text/html": self.snapshot}
        if self._handle is not None:
            self._handle.update(final, raw=True)
        elif self._shown_at is not None and not self.quiet:
            self._show(final)
        if self.live is not None:
            for widget in [self.live.link, *_widget_tree(self.live.root)]:
                widget.close()
        with contextlib.suppress(ValueError):
            _live.remove(self)

    def state(self) -> dict[str, Any]:
        """What the view shows, as plain data (for tests and debugging)."""
        return {
            "chips": {r: s.state for r, s in self.statuses.items()},
            "views": [v.label for v in self.views],
            "live": self.live is not None,
            "quiet": self.quiet,
            "shown": self.views[self._selected()].label,
            "lines": {r: v.output.plain_text() for r, v in self.rank_views.items()},
            "hidden": {r: v.output.hidden for r, v in self.rank_views.items()},
            "rich": {
                r: [sorted(e[1].get("data", {})) for e in v.output.entries if e[0] == "rich"]
                for r, v in self.rank_views.items()
            },
            "all": self.all_view.output.plain_text(),
            "all_rich": [
                sorted(e[1].get("data", {})) for e in self.all_view.output.entries if e[0] == "rich"
            ],
            "widgets": {
                v.label: [
                    e[1]["data"][WIDGET_MIME]["model_id"]
                    for e in v.output.entries
                    if e[0] == "rich" and WIDGET_MIME in e[1].get("data", {})
                ]
                for v in self.views
            },
            "metrics": self.metrics.state(),
            "notices": list(self.notices),
            "logs": str(self.logs.folder),
            "footer": self.footer_html,
            "stacks": stacks.text.value if (stacks := self._stacks()) is not None else None,
        }

    def _selected(self) -> int:
        """The view shown: the selector's (which the browser sets) once live."""
        return (self.live.selector.index or 0) if self.live is not None else self.selected

    def _stacks(self) -> StacksPanel | None:
        return self.live.stacks if self.live is not None else None


#: the views still live, oldest first
_live: collections.deque[CellView] = collections.deque()


def _widget_tree(root: widgets.Widget) -> Iterator[widgets.Widget]:
    """``root`` and every widget it holds, through any trait (children, layout, style,
    a chart's marks, axes and scales), each once."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, widgets.Widget):
            if id(value) in seen:
                continue
            seen.add(id(value))
            yield value
            stack.extend(getattr(value, name, None) for name in value.keys)
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())


def _text_into(view: View, ranks: Sequence[int], logs: RankLogs, limit: int) -> TextRenderer:
    """A text renderer (prefixes, folding) writing into ``view``; past ``limit``, a rank's
    output is left to its log (which the cell view writes)."""

    def rich(data: dict[str, Any], metadata: dict[str, Any]) -> None:
        view.output.add_rich({"output_type": "display_data", "data": data, "metadata": metadata})

    def live(data: dict[str, Any], metadata: dict[str, Any], shown_as: str, update: bool) -> None:
        if update:
            view.output.update_rich(shown_as, data, metadata)
        else:
            output = {"output_type": "display_data", "data": data, "metadata": metadata}
            view.output.add_rich(output, shown_as)

    return TextRenderer(
        ranks,
        LineWriter(view.output, "stdout"),
        LineWriter(view.output, "stderr"),
        rich,
        limit=limit,
        logs=logs,
        write_logs=False,
        update_display=live,
        own_views=True,
    )


def _escape(text: str) -> str:
    import html

    return html.escape(text)
