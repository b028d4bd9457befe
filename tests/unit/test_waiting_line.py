"""A waiting cell's news is one line that updates, in the widget view and the text view."""

from __future__ import annotations

import io
from typing import Any

from jupyter_dist.common.events import Notice
from jupyter_dist.control.rank_group import WAITING_LINE
from jupyter_dist.display.render_text import TextRenderer
from jupyter_dist.display.status_lines import StatusLines


def waiting(seconds: int) -> Notice:
    return Notice(
        f"waiting for a cell from train.ipynb (running {seconds} s)", True, line=WAITING_LINE
    )


def test_the_widget_footer_keeps_one_waiting_line_that_updates() -> None:
    from jupyter_dist.display.cell_view import CellView

    view = CellView("w", 0, {0: ("h", 0), 1: ("h", 0)}, display=lambda *a, **k: None)
    view.handle(Notice("rank 1 printed a warning"))
    for seconds in range(120):  # two minutes of waiting
        view.handle(waiting(seconds))
    footer = view.footer_html
    assert footer.count("waiting for") == 1, footer
    assert "(running 119 s)" in footer and "(running 118 s)" not in footer
    assert "rank 1 printed a warning" in footer
    view.handle(
        Notice(
            "waiting for the session's ranks, which are being restarted", True, line=WAITING_LINE
        )
    )
    assert view.footer_html.count("waiting for") == 1
    assert "being restarted" in view.footer_html
    view.handle(Notice("", True, line=WAITING_LINE))  # the turn came
    assert "waiting for" not in view.footer_html
    assert "rank 1 printed a warning" in view.footer_html
    view.finish()


class Handle:
    def __init__(self, bundle: dict[str, Any]) -> None:
        self.shown = [bundle["text/plain"]]

    def update(self, bundle: dict[str, Any], raw: bool) -> None:
        assert raw
        self.shown.append(bundle["text/plain"])


def test_the_text_view_shows_one_output_that_each_news_updates() -> None:
    handles: list[Handle] = []

    def show(bundle: dict[str, Any]) -> Handle:
        handles.append(Handle(bundle))
        return handles[-1]

    out, err = io.StringIO(), io.StringIO()
    renderer = TextRenderer([0, 1], out, err, status=StatusLines(show))
    for seconds in range(120):
        renderer.handle(waiting(seconds))
    renderer.handle(Notice("", True, line=WAITING_LINE))
    renderer.finish()
    assert len(handles) == 1
    assert handles[0].shown[0] == "[jupyter_dist] waiting for a cell from train.ipynb (running 0 s)"
    assert handles[0].shown[-2].endswith("(running 119 s)") and handles[0].shown[-1] == ""
    assert "waiting" not in out.getvalue() + err.getvalue()


def test_without_a_notebook_the_text_view_prints_what_it_waits_for_once() -> None:
    out, err = io.StringIO(), io.StringIO()
    renderer = TextRenderer([0, 1], out, err)
    for seconds in range(120):
        renderer.handle(waiting(seconds))
    renderer.finish()
    assert out.getvalue().count("waiting for") == 1, out.getvalue()
