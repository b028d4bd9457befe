"""Live displays in the views gathering ranks: the first rank's shown where it came among
its lines and kept up to date, the other ranks' folded into one line; a rank's Output
widget filled as a browser fills it; rich's printed text read as lines."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from jupyter_dist.common.events import (
    CellFinished,
    CellResult,
    ClearOut,
    RankFinished,
    RichOut,
    StreamOut,
    WidgetComm,
)
from jupyter_dist.display import live_displays
from jupyter_dist.display.live_displays import WIDGET_MIME, is_live
from jupyter_dist.display.output_widgets import OutputWidgets
from jupyter_dist.display.render_text import TextRenderer
from jupyter_dist.display.rich_text import printed_text

RICH_PRE = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">"
)


def bar(rank: int) -> RichOut:
    return RichOut(rank, "display_data", {WIDGET_MIME: {"model_id": f"bar{rank}"}}, {})


def table(rank: int, step: int, kind: str = "display_data", took: int = 1) -> RichOut:
    data = {"text/html": f"<p>step {step}/3, {took} s</p>", "text/plain": "HTML"}
    return RichOut(rank, kind, data, {}, {"display_id": f"t{rank}"})


class Page:
    """A view's output as the cell view keeps it: lines, and displays updated by id."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.ids: dict[str, int] = {}

    def write(self, text: str) -> int:
        self.items.extend(line for line in text.splitlines())
        return len(text)

    def flush(self) -> None:
        pass

    def show(self, data: dict[str, Any], _metadata: dict[str, Any]) -> None:
        self.items.append(data)

    def live(
        self, data: dict[str, Any], _meta: dict[str, Any], shown_as: str, update: bool
    ) -> None:
        item: Any = data["text/plain"] if set(data) == {"text/plain"} else data  # a line
        if update:
            self.items[self.ids[shown_as]] = item
        else:
            self.ids[shown_as] = len(self.items)
            self.items.append(item)


def gathered(ranks: list[int]) -> tuple[TextRenderer, Page]:
    page = Page()
    view = TextRenderer(ranks, page, page, page.show, update_display=page.live, own_views=True)
    return view, page


def end(view: TextRenderer, ranks: list[int]) -> None:
    for rank in ranks:
        view.handle(RankFinished(rank, "ok", 0.1))
    view.handle(CellFinished(CellResult(tuple(ranks), (), {})))


def test_rank_0s_bar_is_shown_where_it_came_and_the_others_fold_into_one_line() -> None:
    view, page = gathered([0, 1, 2])
    for rank in (0, 1, 2):
        view.handle(StreamOut(rank, "stdout", "start\n"))
    for rank in (2, 1, 0):  # the others' bars may come first
        view.handle(bar(rank))
    for rank in (0, 1, 2):
        view.handle(StreamOut(rank, "stdout", "end\n"))
    view.tick()  # every rank's row came: written at once, without waiting for twins
    assert page.items == [
        "[ranks 0-2] start",
        "[rank 0]",
        {WIDGET_MIME: {"model_id": "bar0"}},
        "[ranks 1-2] live progress: in each rank's own view (this view shows rank 0's)",
        "[ranks 0-2] end",
    ]
    end(view, [0, 1, 2])
    assert len(page.items) == 5  # nothing more when the cell ends


def test_without_rank_0s_display_the_line_says_where_the_others_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view, page = gathered([0, 1])
    view.handle(bar(1))
    view.tick()
    assert page.items == []  # a while for rank 0's
    now = time.monotonic
    monkeypatch.setattr(live_displays.time, "monotonic", lambda: now() + 1)
    view.tick()
    assert page.items == ["[rank 1] live progress: in rank 1's own view"]
    view.handle(bar(0))
    end(view, [0, 1])
    assert page.items == [
        "[rank 1] live progress: in rank 1's own view (this view shows rank 0's)",
        "[rank 0]",
        {WIDGET_MIME: {"model_id": "bar0"}},
    ]


def test_rank_0s_table_is_updated_in_place_and_the_others_never_shown() -> None:
    view, page = gathered([0, 1])
    for rank in (0, 1):
        view.handle(table(rank, 0))
    view.handle(table(0, 1, "update_display_data"))  # before its row was written
    view.tick()
    shown = [item for item in page.items if isinstance(item, dict)]
    assert shown == [table(0, 1).data]  # its latest state where it came
    for step in (2, 3):
        for rank in (0, 1):
            view.handle(table(rank, step, "update_display_data", took=rank + 1))
    end(view, [0, 1])
    assert [item for item in page.items if isinstance(item, dict)] == [table(0, 3).data]
    assert "step" not in " ".join(item for item in page.items if isinstance(item, str))


def test_a_text_view_shows_rank_0s_table_and_folds_those_like_it_at_the_end() -> None:
    """No rank views, no update in place (a terminal): rank 0's table as it came, and at
    the end the last states: rank 1's, the same but for its times, on one line; rank 2's,
    different, shown."""
    out, err = io.StringIO(), io.StringIO()
    shown: list[dict[str, Any]] = []
    view = TextRenderer([0, 1, 2], out, err, lambda data, _meta: shown.append(data))
    for rank in (0, 1, 2):
        view.handle(table(rank, 0))
    view.flush(final=True)
    for rank in (0, 1):
        view.handle(table(rank, 3, "update_display_data", took=rank + 1))
    other = {"text/html": "<p>evaluating</p>", "text/plain": "HTML"}
    view.handle(RichOut(2, "update_display_data", other, {}, {"display_id": "t2"}))
    end(view, [0, 1, 2])
    assert shown == [table(0, 0).data, table(0, 3).data, other], shown
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[rank 0]", "[rank 0]"] and lines[2] == "[rank 2]", lines
    assert lines[-1] == "[rank 1] live progress like rank 0's above", lines


def test_an_output_widget_takes_its_ranks_output_as_a_browser_would() -> None:
    """rich's live display: ``with out:`` (msg_id set), ``clear_output(wait=True)`` and a
    display each refresh; streams of one name run together; a display update and another
    rank's output are not taken."""
    widgets = OutputWidgets()
    opened = {"comm_id": "o", "data": {"state": {"_model_name": "OutputModel", "msg_id": ""}}}
    widgets.watch(WidgetComm(0, "comm_open", opened))

    def msg_id(value: str) -> bool:
        update = {"comm_id": "o", "data": {"method": "update", "state": {"msg_id": value}}}
        return widgets.watch(WidgetComm(0, "comm_msg", update))

    assert widgets.capture(StreamOut(0, "stdout", "before\n")) is None
    assert msg_id("cell")  # only the capture moved: the browser need not hear it
    for frame in ("1/4", "2/4"):
        assert widgets.capture(ClearOut(0, wait=True)) is not None
        model = widgets.capture(RichOut(0, "display_data", {"text/plain": frame}, {}))
        assert model is not None and model.comm_id == "o"
    assert [o["data"] for o in model.outputs] == [{"text/plain": "2/4"}]
    widgets.capture(StreamOut(0, "stdout", "a"))
    widgets.capture(StreamOut(0, "stdout", "b\n"))
    assert model.outputs[-1] == {"output_type": "stream", "name": "stdout", "text": "ab\n"}
    assert widgets.capture(StreamOut(1, "stdout", "rank 1\n")) is None
    update = RichOut(0, "update_display_data", {"text/plain": "x"}, {}, {"display_id": "d"})
    assert widgets.capture(update) is None
    msg_id("")
    assert widgets.capture(StreamOut(0, "stdout", "after\n")) is None
    shown = widgets.as_display(model)
    assert shown is not None and shown.msg_type == "display_data"
    assert shown.transient == {"display_id": "jd-output-o"}
    assert widgets.as_display(model) is None  # nothing new since


def test_a_text_view_shows_an_output_widgets_content_instead_of_the_widget() -> None:
    out, err = io.StringIO(), io.StringIO()
    shown: list[dict[str, Any]] = []
    view = TextRenderer([0], out, err, lambda data, _meta: shown.append(data))
    opened = {"comm_id": "o", "data": {"state": {"_model_name": "OutputModel", "msg_id": "c"}}}
    view.handle(WidgetComm(0, "comm_open", opened))
    view.handle(RichOut(0, "display_data", {WIDGET_MIME: {"model_id": "o"}, "text/plain": ""}, {}))
    view.handle(ClearOut(0, wait=True))
    frame = {"text/plain": "Epoch 0 1/4", "text/html": "<pre>Epoch 0 1/4</pre>"}
    view.handle(RichOut(0, "display_data", frame, {}))
    end(view, [0])
    assert shown == [frame], shown  # the frame, not a widget a text view cannot draw


def test_riches_printed_text_reads_as_lines_that_fold() -> None:
    printed = {"text/plain": "hello\n", "text/html": RICH_PRE + "hello\n</pre>\n"}
    assert printed_text(printed) == "hello\n"
    assert printed_text({"text/plain": "x", "text/html": "<pre>x</pre>"}) is None
    out, err = io.StringIO(), io.StringIO()
    view = TextRenderer([0, 1], out, err, lambda data, _meta: None)
    for rank in (0, 1):
        view.handle(RichOut(rank, "display_data", printed, {}))
    end(view, [0, 1])
    assert out.getvalue() == "[ranks 0-1] hello\n"


def test_what_is_live() -> None:
    assert is_live(bar(0)) and is_live(RichOut(0, "execute_result", bar(0).data, {}))
    assert is_live(table(0, 0))
    assert not is_live(RichOut(0, "execute_result", table(0, 0).data, {}, {"display_id": "d"}))
    assert not is_live(RichOut(0, "display_data", {"text/plain": "x"}, {}))
