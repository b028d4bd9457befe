"""Prefixed text output, identical lines folded, rich outputs labelled."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from jupyter_dist.common.events import (
    CellFinished,
    CellResult,
    Notice,
    RankFinished,
    RichOut,
    StreamOut,
)
from jupyter_dist.display import render_text
from jupyter_dist.display.render_text import TextRenderer


def make(ranks: list[int]) -> tuple[TextRenderer, io.StringIO, io.StringIO, list[Any]]:
    out, err = io.StringIO(), io.StringIO()
    shown: list[Any] = []
    r = TextRenderer(ranks, out, err, lambda data, meta: shown.append(data))
    return r, out, err, shown


def done(r: TextRenderer, ranks: list[int]) -> None:
    for rank in ranks:
        r.handle(RankFinished(rank, "ok", 0.1))
    r.handle(CellFinished(CellResult(tuple(ranks), (), {})))


def test_identical_lines_fold() -> None:
    r, out, _, _ = make([0, 1])
    r.handle(StreamOut(0, "stdout", "a\nb\n"))
    r.handle(StreamOut(1, "stdout", "a\nc\n"))
    done(r, [0, 1])
    lines = out.getvalue().splitlines()
    assert lines[0] == "[ranks 0-1] a"
    assert sorted(lines[1:]) == ["[rank 0] b", "[rank 1] c"]


def test_partial_lines_join_across_chunks() -> None:
    r, out, _, _ = make([0, 1])
    r.handle(StreamOut(0, "stdout", "hel"))
    r.handle(StreamOut(0, "stdout", "lo\n"))
    r.handle(StreamOut(1, "stdout", "hello"))
    done(r, [0, 1])
    assert out.getvalue() == "[ranks 0-1] hello\n"


def test_stderr_goes_to_stderr() -> None:
    r, out, err, _ = make([0, 1])
    r.handle(StreamOut(1, "stderr", "warn\n"))
    done(r, [0, 1])
    assert err.getvalue() == "[rank 1] warn\n"
    assert out.getvalue() == ""


def test_a_notice_a_rank_wrote_on_stderr_first_stays_above_what_it_printed_next() -> None:
    """The ranks say on stderr that the group is made again before the cell's code runs:
    written out together with the cell's prints, it is not put below them."""
    both = io.StringIO()
    r = TextRenderer([0, 1], both, both, None)
    for rank in (0, 1):
        r.handle(StreamOut(rank, "stderr", "group made again\n"))
    for rank in (0, 1):
        r.handle(StreamOut(rank, "stdout", "line 0\nline 1\n"))
    done(r, [0, 1])
    assert both.getvalue().splitlines() == [
        "[ranks 0-1] group made again",
        "[ranks 0-1] line 0",
        "[ranks 0-1] line 1",
    ]


def test_a_lone_line_waits_for_twins_then_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render_text, "HOLD_S", 0.05)
    r, out, _, _ = make([0, 1])
    r.handle(StreamOut(0, "stdout", "only me\n"))
    r.tick()
    assert out.getvalue() == ""
    time.sleep(0.06)
    r.tick()
    assert out.getvalue() == "[rank 0] only me\n"


def test_finished_rank_does_not_hold_others() -> None:
    r, out, _, _ = make([0, 1])
    r.handle(RankFinished(1, "ok", 0.1))
    r.handle(StreamOut(0, "stdout", "x\n"))
    r.tick()
    assert out.getvalue() == "[rank 0] x\n"


def test_many_lines_all_arrive() -> None:
    r, out, _, _ = make([0, 1, 2])
    for rank in (0, 1, 2):
        r.handle(StreamOut(rank, "stdout", "".join(f"{i}\n" for i in range(5000))))
    done(r, [0, 1, 2])
    lines = out.getvalue().splitlines()
    assert len(lines) == 5000
    assert lines[-1] == "[ranks 0-2] 4999"


def test_execute_results_fold_when_equal() -> None:
    r, out, _, _ = make([0, 1, 2])
    for rank, value in ((0, "1"), (1, "1"), (2, "7")):
        r.handle(RichOut(rank, "execute_result", {"text/plain": value}, {}))
    done(r, [0, 1, 2])
    assert out.getvalue().splitlines() == ["[ranks 0-1] Out: 1", "[rank 2] Out: 7"]


def test_rich_display_is_labelled_and_published() -> None:
    r, out, _, shown = make([0, 1])
    data = {"text/html": "<b>x</b>", "text/plain": "x"}
    r.handle(RichOut(1, "display_data", data, {}))
    done(r, [0, 1])
    assert out.getvalue() == "[rank 1]\n"
    assert shown == [data]


def test_rows_stay_aligned_after_a_per_rank_line() -> None:
    r, out, _, _ = make([0, 1])
    r.handle(StreamOut(0, "stdout", "rank 0 of 2\nshared\n"))
    r.handle(StreamOut(1, "stdout", "rank 1 of 2\nshared\n"))
    done(r, [0, 1])
    assert out.getvalue().splitlines() == [
        "[rank 0] rank 0 of 2",
        "[rank 1] rank 1 of 2",
        "[ranks 0-1] shared",
    ]


def test_a_row_folds_into_groups() -> None:
    r, out, _, _ = make([0, 1, 2, 3])
    for rank, host in ((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")):
        r.handle(StreamOut(rank, "stdout", f"{host}\n"))
    done(r, [0, 1, 2, 3])
    assert out.getvalue().splitlines() == ["[ranks 0-1] node0", "[ranks 2-3] node1"]


class CountingSink(io.StringIO):
    """A text sink that counts its flushes (ipykernel's stdout waits on its IO thread in
    each one)."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_a_silent_cell_flushes_nothing() -> None:
    out, err = CountingSink(), CountingSink()
    r = TextRenderer([0, 1], out, err)
    r.tick()
    done(r, [0, 1])
    assert (out.flushes, err.flushes) == (0, 0)


def test_written_output_is_flushed_once_where_it_went() -> None:
    out, err = CountingSink(), CountingSink()
    r = TextRenderer([0, 1], out, err)
    r.handle(StreamOut(0, "stdout", "a\n"))
    r.handle(StreamOut(1, "stdout", "a\n"))
    done(r, [0, 1])
    assert out.getvalue() == "[ranks 0-1] a\n"
    assert out.flushes >= 1
    assert err.flushes == 0
    flushed = out.flushes
    r.finish()  # nothing new: no further flush
    assert out.flushes == flushed


def test_a_failed_ranks_traceback_follows_its_output_once_with_its_ranks() -> None:
    from jupyter_dist.errors import RankFailure

    def failure(rank: int, count: int) -> RankFailure:
        traceback = (f"Cell In[{count}], line 1\n----> 1 raise ValueError('x')\n", "ValueError: x")
        return RankFailure(rank, "h", rank, "error", "ValueError", "x", traceback)

    r, out, err, _ = make([0, 1, 2])
    for rank in (0, 1, 2):
        r.handle(StreamOut(rank, "stdout", "before\n"))
    r.handle(RankFinished(0, "error", 0.1, failure(0, 3)))
    r.handle(RankFinished(1, "error", 0.1, failure(1, 4)))  # counters differ: still twins
    stopped = RankFailure(2, "h", 2, "interrupted", "KeyboardInterrupt", "", ("KeyboardInterrupt",))
    r.handle(RankFinished(2, "interrupted", 0.1, stopped))
    r.handle(CellFinished(CellResult((0, 1, 2), (), {})))
    assert out.getvalue().startswith("[ranks 0-2] before\n")
    assert err.getvalue() == (
        "[ranks 0-1] Cell In[3], line 1\n"
        "[ranks 0-1] ----> 1 raise ValueError('x')\n"
        "[ranks 0-1] \n"
        "[ranks 0-1] ValueError: x\n"
    )  # the interrupted rank's KeyboardInterrupt is the cell error's to say


def test_a_twin_traceback_arriving_late_while_a_rank_runs_is_still_folded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine the same error reaches the ranks seconds apart: the first
    traceback waits for its twin while that rank still runs, past the lines' hold."""
    from jupyter_dist.errors import RankFailure

    monkeypatch.setattr(render_text, "HOLD_S", 0.0)
    r, _out, err, _ = make([0, 1])
    tb = ("----> 1 raise ValueError('x')\n", "ValueError: x")
    r.handle(RankFinished(1, "error", 0.1, RankFailure(1, "h", 1, "error", "ValueError", "x", tb)))
    r.handle(Notice("rank 1 failed; rank 0 still running", transient=True, line="wind-down"))
    r.tick()
    assert err.getvalue() == ""  # rank 0 still runs: its twin may come
    r.handle(RankFinished(0, "error", 2.1, RankFailure(0, "h", 0, "error", "ValueError", "x", tb)))
    r.tick()
    assert err.getvalue() == (
        "[ranks 0-1] ----> 1 raise ValueError('x')\n[ranks 0-1] \n[ranks 0-1] ValueError: x\n"
    )


def test_a_failed_rank_does_not_wait_for_the_others_to_show_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_dist.errors import RankFailure

    r, _out, err, _ = make([0, 1])
    monkeypatch.setattr(render_text, "FAILURE_HOLD_S", 0.0)
    died = RankFailure(1, "h", 1, "died", "RankDied", "killed by signal SIGKILL (9)")
    r.handle(RankFinished(1, "died", 0.1, died))
    r.tick()
    assert err.getvalue() == "[rank 1] RankDied: killed by signal SIGKILL (9)\n"
