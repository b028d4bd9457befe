"""The parts of the cell view that need no kernel: bounds, chips, summaries, charts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_dist.display.metrics_charts import MetricsView
from jupyter_dist.display.output_store import LineWriter, ViewOutput
from jupyter_dist.display.status_chips import RankStatus, cell_summary, chips_html
from jupyter_dist.errors import SpecError
from jupyter_dist.notebook.magics import output_mode


def test_a_view_keeps_its_last_lines_and_counts_the_rest() -> None:
    view = ViewOutput(limit=3)
    out, err = LineWriter(view, "stdout"), LineWriter(view, "stderr")
    out.write("a\nb\n")
    err.write("oops\n")
    view.add_rich({"output_type": "display_data", "data": {"text/plain": "fig"}})
    out.write("tail without newline")
    out.flush()
    assert view.hidden == 2
    assert view.as_outputs() == [
        {"output_type": "stream", "name": "stderr", "text": "oops\n"},
        {"output_type": "display_data", "data": {"text/plain": "fig"}},
        {"output_type": "stream", "name": "stdout", "text": "tail without newline\n"},
    ]


def test_chips_carry_state_rank_and_a_time_bar_per_node() -> None:
    statuses = [
        RankStatus(0, "a", 0, "done", started=0.0, elapsed=2.0),
        RankStatus(1, "b", 1, "error", started=0.0, elapsed=1.0, process={"cpu_percent": 99}),
    ]
    html = chips_html(statuses, now=5.0)
    assert 'data-rank="0" data-state="done"' in html
    assert 'data-rank="1" data-state="error"' in html
    assert "node 1 · b" in html and "CPU 99%" in html
    assert 'style="width:100%"' in html and 'style="width:50%"' in html


def test_summaries_name_failures_first_and_the_slowest_rank() -> None:
    few = [RankStatus(r, "h", 0, "done", elapsed=0.5 + r) for r in range(2)]
    assert cell_summary(few) == "done on ranks 0-1 in 1.50 s (rank 0 0.50 s, rank 1 1.50 s)"
    many = [RankStatus(r, "h", 0, "done", elapsed=1.0) for r in range(16)]
    many[5] = RankStatus(5, "h", 0, "dead", elapsed=9.0)
    assert cell_summary(many) == (
        "dead on rank 5; done on ranks 0-4,6-15 in 9.00 s (fastest 1.00 s, slowest rank 5 9.00 s)"
    )


def test_many_ranks_chart_a_mean_and_a_band() -> None:
    view = MetricsView(list(range(12)))
    view.build()
    for rank in range(12):
        view.add(rank, tuple(("loss", float(s), float(rank)) for s in range(3)))
    view.render()
    chart = view.charts["loss"]
    assert chart.many and list(chart.mean.y) == [5.5, 5.5, 5.5]
    assert [list(row) for row in chart.band.y] == [[0.0] * 3, [11.0] * 3]
    assert view.summary() == ["loss: 0 at step 2 (rank 0)"]


def test_output_mode_defaults_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTER_DIST_OUTPUT", raising=False)

    class InKernel:
        kernel = object()

    assert output_mode(InKernel(), None) == "widget"
    assert output_mode(object(), None) == "text"
    assert output_mode(InKernel(), "text") == "text"
    monkeypatch.setenv("JUPYTER_DIST_OUTPUT", "text")
    assert output_mode(InKernel(), None) == "text"
    with pytest.raises(SpecError, match="--output 'fancy': expected one of auto, widget, text"):
        output_mode(InKernel(), "fancy")


def test_log_folders_of_gone_processes_are_pruned(tmp_path: Path) -> None:
    import subprocess
    import sys

    from jupyter_dist.display.rank_logs import LOGS_PREFIX, _prune

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / f"{LOGS_PREFIX}{gone}-abc").mkdir()
    mine = tmp_path / f"{LOGS_PREFIX}{os.getpid()}-def"
    mine.mkdir()
    _prune(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]


def test_a_first_single_point_gets_a_real_domain_and_round_ticks() -> None:
    """bqplot's own domain for one point is zero-wide, and its tick format then fails in
    the browser ("invalid format: .undefinedg") and drops the update: the chart sets both
    scales' bounds itself, on round ticks, from the first point on."""
    view = MetricsView([0, 1])
    view.build()
    view.add(0, (("loss", 0.0, 2.5),))
    view.render()
    chart = view.charts["loss"]
    for scale, axis in ((chart.x, chart.x_axis), (chart.y, chart.y_axis)):
        assert scale.min is not None and scale.max is not None and scale.min < scale.max
        ticks = list(axis.tick_values)
        assert ticks[0] == scale.min and ticks[-1] == scale.max and ticks == sorted(ticks)
        assert axis.tick_format  # never left to bqplot's guess
    view.add(0, tuple(("loss", float(s), 100.0 / (s + 1)) for s in range(1, 200)))
    view.add(1, tuple(("loss", float(s), 90.0 / (s + 1)) for s in range(200)))
    view.render()
    assert (chart.x.min, chart.x.max) == (0.0, 200.0)
    assert list(chart.x_axis.tick_values) == [0.0, 50.0, 100.0, 150.0, 200.0]
    assert chart.y.min <= 90.0 / 200 and chart.y.max >= 100.0
    assert all(float(t).is_integer() for t in chart.y_axis.tick_values)


def test_the_legend_sits_under_the_chart_not_over_the_data() -> None:
    view = MetricsView([0, 3])
    view.build()
    view.add(3, (("acc", 0.0, 0.5),))
    view.render()
    chart = view.charts["acc"]
    assert not any(m.display_legend for m in chart.figure.marks)
    assert list(chart.box.children) == [chart.figure, chart.legend]
    assert "rank 0" in chart.legend.value and "rank 3" in chart.legend.value


def test_chips_are_buttons_that_pick_their_rank_in_the_selector() -> None:
    statuses = [RankStatus(r, "h", 0, "running", started=0.0) for r in (0, 1, 2)]
    html = chips_html(statuses, now=1.0)
    assert html.count('<button type="button"') == 3
    # rank 2 is the third view of the selector, and the third block of a snapshot
    chip = html[html.index('data-rank="2"') :]
    # on the press: a click straddling the chips' redraw (each tick) would never fire
    assert "onclick=" not in chip
    handler = chip[chip.index('onpointerdown="') : chip.index('">')]
    assert "selectedIndex=2" in handler and ".jd-select button&#x27;)[2]" in handler
    assert "details[data-rank=&quot;2&quot;]" in handler
    assert 'aria-label="rank 2 on h: running, 1.0 s"' in chip


def test_the_selector_says_each_rank_state_for_keyboard_users() -> None:
    from jupyter_dist.common.events import RankFinished, RankStarted
    from jupyter_dist.display.cell_view import CellView
    from jupyter_dist.errors import RankFailure

    view = CellView(
        "tips", 0, {0: ("h", 0), 1: ("h", 0)}, display=lambda *a, **k: None, live_after=0
    )
    view.show()
    view.handle(RankStarted(0))
    view.handle(RankStarted(1))
    failure = RankFailure(1, "h", 1, "error", "ValueError", "boom")
    view.handle(RankFinished(1, "error", 0.1, failure))
    view.render()
    assert view.live is not None
    assert list(view.live.selector.tooltips) == ["rank 0: running", "rank 1: error", "all ranks"]
    assert view.live.selector.index == 1  # the culprit's view
    view.finish()


def test_the_log_folder_is_a_link_where_a_server_serves_it() -> None:
    from jupyter_dist.common.events import StreamOut
    from jupyter_dist.display.cell_view import CellView

    served = CellView(
        "links", 0, {0: ("h", 0)}, display=lambda *a, **k: None, log_url=lambda f: "/l/x/"
    )
    served.handle(StreamOut(0, "stdout", "kept\n"))
    served.finish()
    assert '<a class="jd-logs" href="/l/x/" target="_blank"' in served.footer_html
    assert 'href="/l/x/"' in served.snapshot
    assert served.logs.path(0).read_text() == "kept\n"
    plain = CellView("links", 1, {0: ("h", 0)}, display=lambda *a, **k: None)
    plain.handle(StreamOut(0, "stderr", "kept too\n"))
    plain.finish()
    assert f"logs: {plain.logs.folder}" in plain.footer_html and "<a " not in plain.footer_html


def test_a_silent_cell_makes_no_log_folder_and_names_none() -> None:
    from jupyter_dist.common.events import RankFinished, RankStarted
    from jupyter_dist.display.cell_view import CellView

    silent = CellView("quiet", 2, {0: ("h", 0)}, display=lambda *a, **k: None)
    silent.handle(RankStarted(0))
    silent.handle(RankFinished(0, "ok", 0.01))
    silent.finish()
    assert not silent.logs.folder.exists()
    assert "logs" not in silent.footer_html and "done on rank 0" in silent.footer_html


def test_a_rank_in_the_debugger_has_its_chip_and_the_footer_names_who_waits() -> None:
    from jupyter_dist.common.events import InputAsked, InputEnded, RankStarted
    from jupyter_dist.display.cell_view import CellView

    view = CellView(
        "debug", 0, {r: ("h", 0) for r in range(3)}, display=lambda *a, **k: None, live_after=0
    )
    view.show()
    for rank in range(3):
        view.handle(RankStarted(rank))
    view.handle(InputAsked(1, "ipdb> "))
    view.handle(InputAsked(2, "name?"))
    view.render()
    assert view.live is not None
    header = view.live.header.value
    assert 'data-rank="1" data-state="debugging"' in header
    assert 'data-rank="2" data-state="input"' in header
    assert 'data-rank="0" data-state="running"' in header
    assert "rank 1 in the debugger and rank 2 asking for input" in view.footer_html
    assert "rank 0 runs on until it waits for them" in view.footer_html
    view.handle(InputEnded(1, (2,)))
    view.handle(InputEnded(2))
    view.render()
    assert 'data-state="debugging"' not in view.live.header.value
    assert "in the debugger" not in view.footer_html
    view.finish()
