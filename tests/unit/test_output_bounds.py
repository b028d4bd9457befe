"""Bounds on what a cell keeps and passes on, however much a rank prints: lines kept per
view, characters per line and per view, characters per rank per cell in text, live views."""

from __future__ import annotations

import collections
import io
import time
from pathlib import Path
from typing import Any

import pytest
from ipywidgets.widgets.widget import _instances

from jupyter_dist.common.events import CellFinished, CellResult, Notice, RankFinished, StreamOut
from jupyter_dist.display import cell_view
from jupyter_dist.display.cell_view import WIDGET_MIME, CellView
from jupyter_dist.display.output_store import (
    DEFAULT_OUTPUT_LIMIT,
    LINE_CHARS,
    LineWriter,
    ViewOutput,
    output_limit,
)
from jupyter_dist.display.rank_logs import RankLogs
from jupyter_dist.display.render_text import TextRenderer
from jupyter_dist.errors import SpecError


def test_one_big_write_keeps_only_the_lines_a_view_can_hold() -> None:
    view = ViewOutput(limit=400)
    writer = LineWriter(view, "stdout")
    writer.write("begun ")
    writer.write("".join(f"{i}\n" for i in range(10_000)) + "tail")
    writer.flush()
    kept = [line for _kind, line in view.entries]
    assert kept[-1] == "tail" and kept[-2] == "9999"
    assert len(kept) == 400
    assert view.hidden == 10_001 - 400  # "begun 0" and the lines up to 9600


def test_an_endless_line_is_held_only_up_to_line_chars() -> None:
    view = ViewOutput()
    writer = LineWriter(view, "stderr")
    for _ in range(30):
        writer.write("y" * 1000)
    assert len(writer._partial) == LINE_CHARS
    writer.write("\nnext\n")
    (_, first), (_, second) = view.entries
    assert first == "y" * LINE_CHARS + " ... [20000 more characters in the full log]"
    assert second == "next"


def test_a_view_keeps_at_most_char_limit_characters() -> None:
    view = ViewOutput(char_limit=10_000)
    LineWriter(view, "stdout").write(("z" * 999 + "\n") * 50)
    assert view.chars <= 10_000 and len(view.entries) == 10
    assert view.hidden == 40
    view.clear()
    assert view.chars == 0 and not view.entries


def test_text_past_the_limit_goes_only_to_the_log(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    logs = RankLogs("s", 1, base=str(tmp_path))
    r = TextRenderer([0, 1], out, err, limit=100, logs=logs)
    r.handle(StreamOut(1, "stdout", "hi\n"))
    for _ in range(100):
        r.handle(StreamOut(0, "stdout", "123456789\n"))
    for rank in (0, 1):
        r.handle(RankFinished(rank, "ok", 0.1))
    r.handle(CellFinished(CellResult((0, 1), (), {})))
    text = out.getvalue()
    assert text.count("123456789") == 10
    log = logs.path(0)
    marker = "more than 100 B of output in this cell; the rest is only in the full log"
    assert f"[rank 0] ... {marker}: {log}" in text
    assert "[jupyter_dist] rank 0: 900 B more output not shown" in text
    assert "[rank 1] hi" in text
    assert log.read_text() == "123456789\n" * 100


def test_logs_opened_again_append(tmp_path: Path) -> None:
    logs = RankLogs("s", 2, base=str(tmp_path))
    logs.write(0, "a\n")
    logs.close()
    logs.write(0, "b\n")
    logs.close()
    assert logs.path(0).read_text() == "a\nb\n"


def test_output_limit_sizes() -> None:
    assert output_limit({}) == DEFAULT_OUTPUT_LIMIT
    assert output_limit({"JUPYTER_DIST_OUTPUT_LIMIT": "500k"}) == 500 * 1024
    assert output_limit({"JUPYTER_DIST_OUTPUT_LIMIT": "2MiB"}) == 2 << 20
    assert output_limit({"JUPYTER_DIST_OUTPUT_LIMIT": "1G"}) == 1 << 30
    assert output_limit({"JUPYTER_DIST_OUTPUT_LIMIT": "0"}) == 0
    with pytest.raises(SpecError, match="JUPYTER_DIST_OUTPUT_LIMIT='lots'"):
        output_limit({"JUPYTER_DIST_OUTPUT_LIMIT": "lots"})


class Handle:
    def __init__(self, bundle: dict[str, Any]) -> None:
        self.bundles = [bundle]

    def update(self, bundle: dict[str, Any], raw: bool = False) -> None:
        self.bundles.append(bundle)


def recording_display() -> tuple[list[Handle], Any]:
    """A display function for a cell view, and the handles of what it showed."""
    handles: list[Handle] = []

    def display(bundle: dict[str, Any], raw: bool = False, display_id: bool = False) -> Handle:
        handles.append(Handle(bundle))
        return handles[-1]

    return handles, display


def test_a_finished_view_becomes_its_snapshot_and_frees_its_widgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When a cell ends, its display is replaced by self-contained HTML (what a reopened
    notebook or nbconvert shows) and its widgets are closed; until then it is live."""
    monkeypatch.setattr(cell_view, "_live", collections.deque())
    handles, display = recording_display()
    view = CellView("s", 0, {0: ("h", 0), 1: ("h", 0)}, display=display, live_after=0)
    view.show()
    assert view.live is not None
    ids = [w.model_id for w in cell_view._widget_tree(view.live.root)]
    assert len(ids) > 10  # the box, its parts, their layouts and styles
    view.handle(StreamOut(0, "stdout", "cell 0\n"))
    view.handle(StreamOut(1, "stderr", "<oops> & more\n"))
    assert WIDGET_MIME in handles[0].bundles[-1] and not view.retired  # live while it runs
    view.finish()
    assert view.retired and not any(i in _instances for i in ids)
    static = handles[0].bundles[-1]
    assert WIDGET_MIME not in static and "[rank 0] cell 0" in static["text/plain"]
    page = static["text/html"]
    assert 'data-rank="0"' in page and 'data-rank="1"' in page and "cell 0" in page
    assert "&lt;oops&gt; &amp; more" in page and "<oops>" not in page  # rank text is escaped
    assert not cell_view._live


def test_a_cell_that_ends_before_the_view_goes_live_shows_only_its_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Most cells end within milliseconds: they make no widgets at all, and their output
    is the snapshot, shown once."""
    monkeypatch.setattr(cell_view, "_live", collections.deque())
    shown: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def display(bundle: dict[str, Any], **kwargs: Any) -> Handle:
        shown.append((bundle, kwargs))
        return Handle(bundle)

    before = len(_instances)
    view = CellView("s", 0, {0: ("h", 0), 1: ("h", 0)}, display=display, live_after=60)
    view.show()
    view.handle(StreamOut(0, "stdout", "quick\n"))
    view.tick()
    view.finish()
    assert view.live is None and view.retired and len(_instances) == before
    assert len(shown) == 1 and WIDGET_MIME not in shown[0][0]
    assert "[rank 0] quick" in shown[0][0]["text/plain"] and "quick" in shown[0][0]["text/html"]
    assert not cell_view._live


def test_a_cell_still_running_goes_live_with_what_it_printed_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cell_view, "_live", collections.deque())
    handles, display = recording_display()
    view = CellView("s", 0, {0: ("h", 0), 1: ("h", 0)}, display=display, live_after=0.05)
    view.show()
    view.handle(StreamOut(1, "stdout", "early\n"))
    view.tick()
    assert view.live is None and not handles  # not yet
    time.sleep(0.06)
    view.tick()
    assert view.live is not None and WIDGET_MIME in handles[0].bundles[0]
    drawn = view.rank_views[1].widget
    assert drawn is not None and "early" in str(drawn.outputs)
    view.finish()
    assert WIDGET_MIME not in handles[0].bundles[-1] and len(handles) == 1


def test_a_quick_cell_that_ran_fine_and_showed_nothing_shows_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As a plain cell, and as in text output; a chart, a note, a line or a failure is
    something to show."""
    from jupyter_dist.common.events import MetricsOut, RankStarted

    monkeypatch.setattr(cell_view, "_live", collections.deque())

    def quick(*events: Any) -> list[dict[str, Any]]:
        shown: list[dict[str, Any]] = []
        view = CellView("s", 0, {0: ("h", 0), 1: ("h", 0)}, display=lambda b, **k: shown.append(b))
        view.show()
        for rank in (0, 1):
            view.handle(RankStarted(rank))
        for event in events:
            view.handle(event)
        for rank in (0, 1):
            view.handle(RankFinished(rank, "ok", 0.01))
        view.finish()
        assert view.retired and view.live is None and view.quiet is (not shown)
        return shown

    assert quick() == []
    assert len(quick(StreamOut(1, "stdout", "a line\n"))) == 1
    assert len(quick(MetricsOut(0, (("loss", 0.0, 1.0),)))) == 1
    assert len(quick(Notice("rank 1 was slow"))) == 1
