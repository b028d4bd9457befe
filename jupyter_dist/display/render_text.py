"""Draw cell events as text: ``[rank N]`` prefixes, identical output folded.

Used wherever widgets cannot render (terminal IPython, nbconvert, nbclient) and for the
widget view's node and all-ranks views. Every line carries its rank: lines that every
still-running rank printed identically are shown once as ``[ranks 0-3] line``; a line waits
at most `HOLD_S` for its twins. A rank that raised or died shows its traceback (on stderr,
after what it printed), identical tracebacks of several ranks once with their rank list (a
traceback waits at most `FAILURE_HOLD_S` for its twins while other ranks still run);
the error the cell raises then only names it (`failure_text`).

Each rank's output in a cell is passed on up to a limit (`output_limit`,
``JUPYTER_DIST_OUTPUT_LIMIT``); past it, a marker names the rank's full log, where all of
it goes, and the cell ends with a line saying how much was left out. A rank printing a
gigabyte then costs the notebook a file write per chunk, not a gigabyte of frontend.
"""

from __future__ import annotations

import collections
import itertools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jupyter_dist.common.events import (
    CellEvent,
    CellFinished,
    InputAsked,
    InputEnded,
    Notice,
    RankFinished,
    RichOut,
    StreamOut,
    WidgetComm,
)
from jupyter_dist.display.failure_text import (
    failed_of_its_own,
    failure_lines,
    failure_log_text,
)
from jupyter_dist.display.live_displays import (
    WIDGET_MIME,
    LiveFold,
    LiveMark,
    is_live,
    marked_row,
)
from jupyter_dist.display.output_store import format_size, output_limit
from jupyter_dist.display.output_widgets import Captured, OutputWidgets
from jupyter_dist.display.rank_logs import RankLogs, rich_log_text
from jupyter_dist.display.rich_text import is_bare_repr, printed_text, readable_text
from jupyter_dist.display.status_chips import (
    STATE_OF_FINISH,
    RankStatus,
    cell_summary,
    input_line,
    input_state,
)
from jupyter_dist.display.status_lines import StatusLines
from jupyter_dist.errors import RankFailure, group_failures
from jupyter_dist.settings import OUTPUT_LIMIT_VAR
from jupyter_dist.text import ranks_label

HOLD_S = 0.5
#: a traceback waits this long for its twins while other ranks still run: on a loaded
#: machine the same error reaches the ranks seconds apart, and the wind-down's notice has
#: already said which rank failed and why (the others are interrupted 3 s after it)
FAILURE_HOLD_S = 5.0
#: cells at least this long always end with a summary line of per-rank times
SUMMARY_AFTER_S = 1.0
STREAMS = ("stdout", "stderr")

DisplayFn = Callable[[dict[str, Any], dict[str, Any]], None]
#: shows a display under an id (data, metadata, display id, update: in place of it)
UpdateFn = Callable[[dict[str, Any], dict[str, Any], str, bool], None]
#: a queued line: printed text, or where a live display goes (`display.live_displays`)
Line = str | LiveMark
#: numbers the log folders of renderers that were given none
_cells = itertools.count(1)
_DIGITS = re.compile(r"\d+(\.\d+)?")


class TextSink(Protocol):
    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class _Flushed:
    """A text sink flushed only when something was written since its last flush: a flush
    of ipykernel's stdout from this thread waits on its IOPub thread, a thread hand-off
    each way that a cell printing nothing should not pay."""

    def __init__(self, sink: TextSink) -> None:
        self.sink = sink
        self.dirty = False

    def write(self, text: str, /) -> int:
        self.dirty = True
        return self.sink.write(text)

    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            self.sink.flush()


class TextRenderer:
    """Turns `CellEvent` values into prefixed text on ``out`` / ``err``.

    ``limit``: characters of each rank's output passed on (default `output_limit()`; 0:
    all). ``logs``: where each rank's full output is, written there unless ``write_logs``
    is false (someone else writes it); by default a `RankLogs` made at the first output,
    whose failure (a full disk) is one notice in the cell's output. Live displays
    (`display.live_displays`): the first rank's are shown where they came among its
    lines, through ``update_display`` where the view can update them in place (the cell
    view's all-ranks and node views), else their first and last states; ``own_views``:
    each rank has a view of its own, where the others' are.
    """

    def __init__(
        self,
        ranks: Sequence[int],
        out: TextSink,
        err: TextSink,
        display: DisplayFn | None = None,
        fold: bool = True,
        summary: bool = False,
        limit: int | None = None,
        logs: RankLogs | None = None,
        write_logs: bool = True,
        status: StatusLines | None = None,
        update_display: UpdateFn | None = None,
        own_views: bool = False,
    ) -> None:
        self.ranks = sorted(ranks)
        #: where a notice with a line name updates its line (None: said once, printed)
        self.status = status
        self.files = {"stdout": _Flushed(out), "stderr": _Flushed(err)}
        self.display = display
        self.fold = fold and len(self.ranks) > 1
        self.running = set(self.ranks)
        self.asking: dict[int, str] = {}  # ranks waiting for input: their chip state
        self.partial: dict[tuple[str, int], str] = {}
        #: each rank's whole lines not written yet (a rank's queue is made when it prints)
        self.pending: dict[str, dict[int, collections.deque[tuple[float, Line]]]] = {
            name: {} for name in STREAMS
        }
        self.results: list[RichOut] = []
        self.update_display = update_display
        #: live displays: the first rank's shown, the others' folded; where the view cannot
        #: update it in place, the first rank's display's last state is shown when the
        #: cell ends: a progress table updated a thousand times is one table, not a thousand
        self.live = LiveFold(self.ranks, own_views, in_place=update_display is not None)
        self._marked = False  # a `LiveMark` was queued in this cell
        #: the ranks' Output widgets (a text view draws no widgets: their content is
        #: shown as a display), and those changed since shown
        self.output_widgets = OutputWidgets()
        self._captured: dict[str, Captured] = {}
        self.results_shown = 0
        self._last_transient = ""
        self.lines_written = 0
        self.summary = summary
        #: each rank's outcome, for the summary line (kept only with ``summary``)
        self.finished: dict[int, RankStatus] = {}
        self.limit = output_limit() if limit is None else limit
        self.logs = logs
        self.write_logs = write_logs
        self.taken: dict[int, int] = {}  # characters of each rank's output passed on
        self.dropped: dict[int, int] = {}  # ... and past the limit, left out
        #: failures of ranks that raised or died, not shown yet (twins wait `FAILURE_HOLD_S`)
        self.failures: list[tuple[float, RankFailure]] = []

    # -- events -----------------------------------------------------------------------
    def handle(self, event: CellEvent) -> None:
        if isinstance(event, WidgetComm):
            self.output_widgets.watch(event)
        elif (model := self.output_widgets.capture(event)) is not None:
            if isinstance(event, StreamOut) and self.write_logs:
                self._logs().write(event.rank, event.text)
            self._captured[model.comm_id] = model
        elif isinstance(event, StreamOut):
            self._stream(event)
        elif isinstance(event, RichOut):
            self._rich(event)
        elif isinstance(event, RankFinished):
            self._end_partial(event.rank)
            self.running.discard(event.rank)
            failure = event.failure
            if failure is not None:
                if self.write_logs:
                    self._logs().write(event.rank, failure_log_text(failure))
                if failed_of_its_own(failure):
                    self.failures.append((time.monotonic(), failure))
            if self.summary:  # what the summary line is made of
                state = STATE_OF_FINISH.get(event.status, "error")
                self.finished[event.rank] = RankStatus(
                    event.rank, "", 0, state, elapsed=event.elapsed
                )
        elif isinstance(event, Notice) and event.line and self.status is not None:
            self.flush(final=True, hold_failures=True)
            self.status.set(event.line, event.text)
        elif isinstance(event, Notice):
            if not event.text:
                return  # a line taken away, which was printed: it stays
            if event.transient:  # a ticking notice ("... (running 8 s)") is said once
                gist = _DIGITS.sub("#", event.text)
                if gist == self._last_transient:
                    return
                self._last_transient = gist
            self.flush(final=True, hold_failures=True)
            self.files["stdout"].write(f"[jupyter_dist] {event.text}\n")
        elif isinstance(event, InputAsked | InputEnded):
            self._input(event)
        elif isinstance(event, CellFinished):
            self.finish()
        else:  # ClearOut, CallDone: clearing the cell would erase every other rank's output
            pass  # clearing the notebook cell would erase every other rank's output

    def tick(self) -> None:
        self._show_captured()
        self.flush(final=False)

    def _input(self, event: InputAsked | InputEnded) -> None:
        """A rank asks for input: what it printed before shows above the prompt (no
        line waits for its twins), and the status line says who waits on whom."""
        if isinstance(event, InputAsked):
            self.flush(final=True, hold_failures=True)
            self.asking[event.rank] = input_state(event.prompt)
        else:
            self.asking.pop(event.rank, None)
        if self.status is not None:
            running = sorted(self.running)
            self.status.set("input", input_line(self.asking, running))

    def finish(self) -> None:
        if self.status is not None:  # news while the cell ran: its outcome says it again
            self.status.clear()
        for rank in sorted({rank for _name, rank in self.partial}):  # ranks mid-line
            self._end_partial(rank)
        self.running.clear()
        self._show_captured()
        self.flush(final=True)
        groups, differ, line = self.live.at_end()
        for ranks, event in groups:
            self._show_rich(sorted(ranks), event)
        self._show_grouped(differ)
        if line:
            self.files["stdout"].write(line + "\n")
        self._show_results()
        for rank, dropped in sorted(self.dropped.items()):
            self.files["stdout"].write(
                f"[jupyter_dist] rank {rank}: {format_size(dropped)} more output not shown "
                f"({OUTPUT_LIMIT_VAR} is {format_size(self.limit)}); full log: "
                f"{self._log_path(rank)}\n"
            )
        self.dropped.clear()
        if self.logs is not None and self.write_logs:
            self.logs.close()
        if self.summary and self.finished and self._summary_worth_it():
            self.files["stdout"].write(
                f"[jupyter_dist] {cell_summary(list(self.finished.values()))}\n"
            )
        self.finished.clear()
        for f in self.files.values():
            f.flush()

    def _summary_worth_it(self) -> bool:
        """A silent cell that was quick and ran fine gets no summary line: it would be the
        cell's only output, and one more message costs a quick cell a third of its time."""
        statuses = self.finished.values()
        slow = max(s.seconds(0.0) for s in statuses) >= SUMMARY_AFTER_S
        failed = any(s.state != "done" for s in statuses)
        return slow or failed or self.lines_written > 0 or bool(self.results_shown)

    # -- streams ------------------------------------------------------------------------
    def _stream(self, event: StreamOut) -> None:
        name = event.name if event.name in STREAMS else "stdout"
        rank = event.rank
        text = event.text
        if self.write_logs and text:
            self._logs().write(rank, text)
        marker = ""
        if self.limit:
            taken = self.taken.get(rank, 0)
            room = max(self.limit - taken, 0)
            if len(text) > room:
                first = rank not in self.dropped
                self.dropped[rank] = self.dropped.get(rank, 0) + len(text) - room
                if not first:
                    return
                text = text[:room]
                marker = (
                    f"... more than {format_size(self.limit)} of output in this cell; the rest "
                    f"is only in the full log: {self._log_path(rank)}"
                )
            self.taken[rank] = taken + len(text)
        key = (name, rank)
        text = self.partial.pop(key, "") + text
        *lines, rest = text.split("\n")
        if marker:  # the line cut short ends here
            lines += [rest, marker] if rest else [marker]
        elif rest:
            self.partial[key] = rest
        if lines:
            now = time.monotonic()
            queue = self.pending[name].setdefault(rank, collections.deque())
            queue.extend((now, line) for line in lines)

    def _logs(self) -> RankLogs:
        if self.logs is None:
            self.logs = RankLogs("text", next(_cells), on_failure=self._logs_failed)
        return self.logs

    def _logs_failed(self, notice: str) -> None:
        """The cell's logs stopped (a full disk): said once, the output goes on."""
        self.handle(Notice(notice))

    def _log_path(self, rank: int) -> str:
        if self.logs is None and not self.write_logs:
            return "not kept"
        return self._logs().hint(rank)

    def _end_partial(self, rank: int) -> None:
        if not self.partial:  # no rank is mid-line (a quiet cell's every rank)
            return
        for name in STREAMS:
            rest = self.partial.pop((name, rank), None)
            if rest:
                self.pending[name].setdefault(rank, collections.deque()).append(
                    (time.monotonic(), rest)
                )

    def flush(self, final: bool = False, hold_failures: bool = False) -> None:
        """Write what is due; `final`: every pending line, and the tracebacks unless
        `hold_failures` (a notice goes after the lines printed before it, but a traceback
        still waits for its twins: the wind-down's notice comes as the first rank fails)."""
        now = time.monotonic()
        failures_due = bool(self.failures) and (
            (final and not hold_failures)
            or not self.running
            or now - self.failures[0][0] >= FAILURE_HOLD_S
        )
        wrote = ""
        for name in self._oldest_first():
            # a rank's traceback comes after everything it printed
            chunks = self._drain(self.pending[name], now, final or failures_due)
            if chunks:
                if wrote:  # what one stream printed first is shown first
                    self.files[wrote].flush()
                self._write(name, chunks)
                wrote = name
        if failures_due:
            self._show_failures()
        self._fold_line(now)
        if final:
            for f in self.files.values():
                f.flush()

    def _oldest_first(self) -> list[str]:
        """The streams, the one whose first pending line came first before the other (a
        notice a rank wrote on stderr before the cell's prints stays above them)."""

        def first_at(name: str) -> float:
            heads = [queue[0][0] for queue in self.pending[name].values() if queue]
            return min(heads, default=float("inf"))

        return sorted(STREAMS, key=first_at)

    def _write(self, name: str, chunks: list[Line]) -> None:
        """Pending lines to their stream; a live display where its mark is."""
        if not self._marked:
            self.files[name].write("".join(chunks))  # type: ignore[arg-type]  # no marks
            self.lines_written += len(chunks)
            return
        text: list[str] = []
        for chunk in chunks:
            if isinstance(chunk, str):
                text.append(chunk)
                continue
            if text:
                self.files[name].write("".join(text))
                self.lines_written += len(text)
                text = []
            if chunk.event is not None:
                self._show_lead(chunk.event)
        if text:
            self.files[name].write("".join(text))
            self.lines_written += len(text)

    def _drain(
        self, queues: dict[int, collections.deque[tuple[float, Line]]], now: float, final: bool
    ) -> list[Line]:
        """Emit pending lines row by row: one line per rank, identical lines of a row folded.

        Ranks usually print the same number of lines, some per-rank ("rank 3 of 8") and
        some shared ("loss 0.25"); taking them in rows keeps the ranks aligned, so the
        shared rows fold even after a per-rank one. A rank that has not printed its line
        of the row yet is waited for at most `HOLD_S`.
        """
        chunks: list[Line] = []
        while True:
            ranks = sorted(r for r, q in queues.items() if q)
            if not ranks:
                return chunks
            # ranks that could still print their line of this row
            complete = self.running <= set(ranks)
            if not complete and self.fold and not final:
                oldest = min(queues[r][0][0] for r in ranks)
                if now - oldest < HOLD_S:
                    return chunks
            # whole rows every rank has printed can go in one batch; a partial row alone
            rows = min(len(queues[r]) for r in ranks) if complete else 1
            columns = [[queues[r].popleft()[1] for _ in range(rows)] for r in ranks]
            if not self.fold:
                for r, column in zip(ranks, columns, strict=True):
                    chunks.extend(
                        f"[rank {r}] {line}\n" if isinstance(line, str) else line for line in column
                    )
                continue
            everyone = f"[{ranks_label(ranks)}] "
            alone = [f"[rank {r}] " for r in ranks]
            for row in zip(*columns, strict=True):
                if self._marked and not all(isinstance(line, str) for line in row):
                    chunks.extend(marked_row(ranks, row))
                    continue
                first = row[0]
                if row.count(first) == len(row):
                    chunks.append(everyone + first + "\n")
                    continue
                if len(set(row)) == len(row):
                    chunks.extend(p + line + "\n" for p, line in zip(alone, row, strict=True))
                    continue
                groups: dict[str, list[int]] = {}
                for r, line in zip(ranks, row, strict=True):
                    groups.setdefault(line, []).append(r)
                chunks.extend(f"[{ranks_label(rs)}] {text}\n" for text, rs in groups.items())

    def _show_failures(self) -> None:
        """The tracebacks of the ranks that raised or died, on stderr, each rank's line
        prefixed as its output is; identical ones (but for cell counters and addresses) of
        several ranks once, root cause first."""
        failures = [failure for _at, failure in self.failures]
        self.failures.clear()
        groups = (
            group_failures(failures)
            if self.fold
            else [g for f in failures for g in group_failures([f])]
        )
        chunks: list[str] = []
        for group in groups:
            prefix = f"[{ranks_label(group.ranks)}] "
            chunks.extend(prefix + line + "\n" for line in failure_lines(group.first))
        self.files["stderr"].write("".join(chunks))
        self.lines_written += len(chunks)

    # -- rich output ----------------------------------------------------------------------
    def _rich(self, event: RichOut) -> None:
        if event.msg_type == "display_data" and not is_live(event):
            printed = printed_text(event.data)
            if printed is not None:  # rich's console printing: lines, folded as any
                if printed.strip():  # (a live display ends with a bare newline)
                    self._stream(StreamOut(event.rank, "stdout", printed))
                return
        if self.write_logs and event.msg_type != "update_display_data":
            self._logs().write(event.rank, rich_log_text(event.data))
        view = event.data.get(WIDGET_MIME)
        if isinstance(view, dict) and self.output_widgets.is_output_model(
            str(view.get("model_id", ""))
        ):
            return  # an Output widget: what it holds is shown as a display (`_show_captured`)
        if is_live(event):
            self._live(event)
        elif event.msg_type == "execute_result":
            self.results.append(event)
        else:
            self.flush(final=True)
            self._show_rich([event.rank], event)

    def _live(self, event: RichOut) -> None:
        """A live display: the first rank's shown where it came among its lines (updated in
        place where it can be), the other ranks' folded (`display.live_displays`)."""
        taken = self.live.take(event)
        if isinstance(taken, LiveMark):
            self._marked = True
            queue = self.pending["stdout"].setdefault(event.rank, collections.deque())
            queue.append((time.monotonic(), taken))
        elif taken is not None and self.update_display is not None:
            key, update = taken
            self.update_display(update.data, update.metadata, key, True)

    def _show_lead(self, event: RichOut) -> None:
        """The first rank's live display, where its mark was, in its latest state."""
        latest, key = self.live.to_show(event)
        self._show_rich([event.rank], latest, key)
        self._fold_line(time.monotonic())  # right under it

    def _fold_line(self, now: float) -> None:
        """The line that folds the other ranks' live displays, shown or changed."""
        text = self.live.line_due(now) if self.update_display is not None else None
        if text is not None and self.update_display is not None:
            self.update_display({"text/plain": text}, {}, self.live.fold_id, bool(self.live.line))
            self.live.line = text

    def _show_captured(self) -> None:
        """The ranks' Output widgets that changed, as displays updated in place."""
        captured = list(self._captured.values())
        self._captured.clear()
        for model in captured:
            event = self.output_widgets.as_display(model)
            if event is not None:
                self._live(event)

    def _show_rich(self, ranks: list[int], event: RichOut, shown_as: str | None = None) -> None:
        data = event.data
        label = ranks_label(ranks)
        out = self.files["stdout"]
        in_place = shown_as is not None and self.update_display is not None
        if not in_place and (set(data) <= {"text/plain"} or self.display is None):
            text = readable_text(data)
            prefix = f"[{label}] Out: " if event.msg_type == "execute_result" else f"[{label}] "
            out.write(prefix + text.replace("\n", "\n" + " " * len(prefix)) + "\n")
            return
        out.write(f"[{label}]\n")
        out.flush()
        if is_bare_repr(str(data.get("text/plain", ""))):  # what a text-only frontend shows
            data = {**data, "text/plain": readable_text(data)}
        if shown_as is not None and self.update_display is not None:
            self.update_display(data, event.metadata, shown_as, False)
        elif self.display is not None:
            self.display(data, event.metadata)

    def _show_results(self) -> None:
        self.results_shown += self._show_grouped(self.results)
        self.results.clear()

    def _show_grouped(self, events: Sequence[RichOut]) -> int:
        """Show ``events``, identical ones of several ranks once (when folding); how many
        were shown."""
        groups: dict[str, tuple[list[int], RichOut]] = {}
        for event in sorted(events, key=lambda e: e.rank):
            key = repr(sorted(event.data.items()))
            ranks, _ = groups.setdefault(key if self.fold else str(event.rank), ([], event))
            ranks.append(event.rank)
        for ranks, event in groups.values():
            self._show_rich(ranks, event)
        return len(groups)
