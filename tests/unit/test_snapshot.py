"""A finished cell's snapshot: self-contained HTML that needs no kernel to show."""

from __future__ import annotations

import re

from jupyter_dist.display.output_store import ViewOutput
from jupyter_dist.display.snapshot import chart_svg, snapshot_html, widget_html, widget_text
from jupyter_dist.display.status_chips import RankStatus


def statuses(*states: str) -> list[RankStatus]:
    return [RankStatus(r, "h", 0, state=s, elapsed=0.5) for r, s in enumerate(states)]


def outputs(n: int) -> dict[int, ViewOutput]:
    return {r: ViewOutput() for r in range(n)}


def test_the_failing_rank_is_open_and_its_traceback_shown() -> None:
    out = outputs(3)
    out[0].add_line("stdout", "waiting <in barrier>")
    out[2].add_rich(
        {
            "output_type": "error",
            "ename": "ValueError",
            "evalue": "bad",
            "traceback": ["\x1b[31mTraceback\x1b[0m", "ValueError: bad"],
        }
    )
    page = snapshot_html(statuses("stuck", "done", "error"), out, "all", {}, "", {}, 0.0)
    opened = re.findall(r'<details class="jd-snap-rank" data-rank="(\d)"[^>]*\bopen>', page)
    assert opened == ["2"]
    assert "ValueError: bad" in page and "\x1b[" not in page
    assert "waiting &lt;in barrier&gt;" in page  # rank text is escaped


def test_without_a_failure_the_first_rank_is_open_and_hidden_lines_are_counted() -> None:
    out = outputs(2)
    out[1].hidden = 7
    page = snapshot_html(statuses("done", "done"), out, None, {}, "", {1: "/logs/rank-1.log"}, 0.0)
    assert re.findall(r'data-rank="(\d)"[^>]*\bopen>', page) == ["0"]
    assert "7 earlier lines hidden; full log: /logs/rank-1.log" in page
    assert "jd-snap-all" not in page


def test_a_tqdm_bar_is_drawn_as_its_last_state() -> None:
    states = {
        "box": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_d", "IPY_MODEL_p"]},
        "d": {"_model_name": "HTMLModel", "value": "epoch: 100%"},
        "p": {"_model_name": "FloatProgressModel", "value": 40, "min": 0, "max": 40},
    }
    drawn = widget_html("box", states)
    assert drawn is not None
    assert "epoch: 100%" in drawn and '<progress value="40" max="40"' in drawn
    assert widget_html("slider", {"slider": {"_model_name": "IntSliderModel"}}) is None
    out = outputs(1)
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "box"}}
    out[0].add_rich({"output_type": "display_data", "data": {**view, "text/plain": "HBox()"}})
    page = snapshot_html(statuses("done"), out, None, {}, "", {}, 0.0, states)
    assert '<progress value="40"' in page and "HBox()" not in page


def test_a_widgets_last_state_reads_as_text_and_an_output_widget_shows_what_it_holds() -> None:
    """tqdm's bar and rich's live display (an Output widget the notebook side filled) as
    the text a finished cell keeps, and as its HTML snapshot."""
    states = {
        "box": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_d", "IPY_MODEL_p"]},
        "d": {"_model_name": "HTMLModel", "value": "epoch: <b>50%</b>"},
        "p": {"_model_name": "FloatProgressModel", "value": 20, "min": 0, "max": 40},
        "out": {
            "_model_name": "OutputModel",
            "outputs": [
                {
                    "output_type": "display_data",
                    "data": {
                        "text/plain": "Epoch 1/1 4/4",
                        "text/html": "<pre>Epoch 1/1 4/4</pre>",
                    },
                    "metadata": {},
                }
            ],
        },
    }
    assert widget_text("box", states) == "epoch: 50% [##########----------]"
    assert widget_text("out", states) == "Epoch 1/1 4/4"
    assert widget_text("missing", states) is None
    drawn = widget_html("out", states)
    assert drawn == "<div><pre>Epoch 1/1 4/4</pre></div>", drawn


def test_a_chart_is_an_svg_with_a_line_per_rank_on_round_ticks() -> None:
    series = {0: ([0.0, 1.0, 2.0], [3.0, 2.0, 1.0]), 1: ([0.0, 1.0, 2.0], [2.5, 1.5, 0.5])}
    svg = chart_svg("loss", series)
    assert svg.count('class="jd-snap-line"') == 2 and "<svg" in svg
    ticks = re.findall(r'font-size="10">([^<]+)<', svg)
    assert {"0", "1", "2", "3"} <= set(ticks), ticks
    many = {r: ([0.0, 1.0], [float(r), float(r) + 1]) for r in range(12)}
    band = chart_svg("acc", many)
    assert band.count("<polygon") == 1 and band.count('class="jd-snap-line"') == 1
    assert chart_svg("empty", {0: ([], [])}) == ""


def test_without_a_failure_every_ranks_text_is_open_first() -> None:
    """As the live view opens on all ranks: their text first and open, the ranks closed."""
    page = snapshot_html(statuses("done", "done"), outputs(2), "[ranks 0-1] hi", {}, "", {}, 0.0)
    assert page.index('<details class="jd-snap-all" open>') < page.index('class="jd-snap-rank"')
    assert re.findall(r'data-rank="(\d)"[^>]*\bopen>', page) == []
    failed = snapshot_html(statuses("done", "error"), outputs(2), "x", {}, "", {}, 0.0)
    assert '<details class="jd-snap-all">' in failed  # the culprit's block is the open one
    assert re.findall(r'data-rank="(\d)"[^>]*\bopen>', failed) == ["1"]
