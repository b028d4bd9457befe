"""Aggregated failures: root cause first, identical tracebacks merged."""

from __future__ import annotations

from jupyter_dist.common.stacks import place_of_traceback
from jupyter_dist.errors import (
    CellInterrupted,
    CellTimeout,
    RankFailure,
    RanksFailed,
    SessionError,
    format_ranks,
    group_failures,
    strip_ansi,
)


def fail(rank: int, kind: str = "error", evalue: str = "boom", order: float = 0.0) -> RankFailure:
    return RankFailure(rank, "host-a", rank, kind, "ValueError", evalue, ("tb line",), order=order)


def test_format_ranks() -> None:
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([3]) == "3"


def test_identical_failures_merge_with_rank_list() -> None:
    groups = group_failures([fail(2), fail(0), fail(1, evalue="other")])
    assert [g.ranks for g in groups] == [[0, 2], [1]]


def test_a_dead_rank_is_the_root_cause() -> None:
    died = RankFailure(3, "h", 3, "died", "RankDied", "exit code 1", order=5.0)
    groups = group_failures([fail(0, order=1.0), died])
    assert groups[0].first.rank == 3


def test_render_shows_root_cause_and_more() -> None:
    failures = [fail(r, evalue=f"e{r}", order=r) for r in range(6)]
    error = RanksFailed("default", 8, failures)
    text = strip_ansi("\n".join(error._render_traceback_()))
    assert text.startswith("RanksFailed: 6 of 8 ranks failed in session 'default'")
    assert "root cause on rank 0 (host-a): ValueError: e0" in text
    assert "--- rank 0 (host host-a, local rank 0): ValueError: e0" in text
    assert "... and 3 more (ranks 3-5)" in text
    assert "rank 4 (host" not in text


def test_merged_group_names_all_its_ranks() -> None:
    error = RanksFailed("s", 4, [fail(r) for r in range(4)])
    text = strip_ansi("\n".join(error._render_traceback_()))
    assert "--- ranks 0-3 (host host-a): ValueError: boom" in text
    assert text.count("tb line") == 1


def test_plain_errors_render_as_one_line() -> None:
    assert SessionError("gone")._render_traceback_() == ["\x1b[31mSessionError\x1b[0m: gone"]


def test_cell_counters_do_not_split_groups() -> None:
    a = RankFailure(0, "h", 0, "error", "E", "at 0x7f00aa11", ("Cell In[3], line 1",))
    b = RankFailure(1, "h", 1, "error", "E", "at 0x7f00bb22", ("Cell In[4], line 1",))
    assert len(group_failures([a, b])) == 1


def test_ranks_stopped_because_another_failed_are_not_counted_as_failed() -> None:
    """Rank 1 raised; ranks 0 and 2 were interrupted waiting for it: one failure, the
    victims named apart, and the culprit as the root cause."""
    failures = [fail(0, "interrupted", order=2), fail(1, order=1), fail(2, "stuck", order=3)]
    text = str(RanksFailed("s", 3, failures))
    assert text.startswith("rank 1 failed in session 's' (ranks 0,2 stopped after it)")
    assert "root cause on rank 1" in text
    assert "of 3 ranks failed" not in text


def test_a_cell_the_user_stopped_says_interrupted_not_failed() -> None:
    text = str(RanksFailed("s", 2, [fail(0, "interrupted"), fail(1, "interrupted")]))
    assert text == "interrupted on ranks 0-1 in session 's'"


# frames as ipykernel sends them in an error reply (colours included), trimmed
KEYBOARD_TB = (
    "\x1b[31m---------------------------------------------------------------------------\x1b[39m",
    "\x1b[31mKeyboardInterrupt\x1b[39m                         Traceback (most recent call last)",
    "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[4]\x1b[39m\x1b[32m, line 2\x1b[39m\n"
    "\x1b[32m      1\x1b[39m x = 1\n"
    "\x1b[32m----> \x1b[39m\x1b[32m2\x1b[39m dist.barrier()\n",
    "\x1b[36mFile \x1b[39m\x1b[32m/site/torch/distributed/distributed_c10d.py:5356\x1b[39m, in "
    "\x1b[36mbarrier\x1b[39m\x1b[34m(group, async_op)\x1b[39m\n"
    "\x1b[32m   5355\x1b[39m work = group.barrier()\n",
    "\x1b[31mKeyboardInterrupt\x1b[39m: ",
)
SLEEP_TB = (
    "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[7]\x1b[39m\x1b[32m, line 1\x1b[39m\n"
    "\x1b[32m----> \x1b[39m\x1b[32m1\x1b[39m time.sleep(\x1b[32m30\x1b[39m)\n",
    "\x1b[31mKeyboardInterrupt\x1b[39m: ",
)


def stopped(rank: int, kind: str, traceback: tuple[str, ...]) -> RankFailure:
    return RankFailure(
        rank, "h", rank, kind, "KeyboardInterrupt", "", traceback,
        place=place_of_traceback(traceback),
    )  # fmt: skip


def test_where_a_traceback_ended_reads_like_a_stack_dump() -> None:
    assert place_of_traceback(KEYBOARD_TB) == "in barrier (distributed_c10d.py:5356), cell line 2"
    assert place_of_traceback(SLEEP_TB) == "at cell line 1: time.sleep(30)"
    assert place_of_traceback(("no frames here",)) == ""
    # an interrupt that came before the cell's code began: the innermost frame, said so
    kernel_only = (
        "\x1b[36mFile \x1b[39m\x1b[32m/site/ipykernel/ipkernel.py:455\x1b[39m, in "
        "\x1b[36mIPythonKernel.do_execute\x1b[39m\x1b[34m(self)\x1b[39m\n",
        "KeyboardInterrupt",
    )
    assert place_of_traceback(kernel_only) == (
        "in IPythonKernel.do_execute (ipkernel.py:455), outside the cell's code"
    )
    # an interrupt is raised from the rank's SIGINT handler: its frame is not where it was
    handler = (
        "\x1b[36mFile \x1b[39m\x1b[32m/site/jupyter_dist/rank/interrupt_ack.py:48\x1b[39m, in "
        "\x1b[36mhandler_for.<locals>.on_sigint\x1b[39m\x1b[34m(signum, frame)\x1b[39m\n",
    )
    assert place_of_traceback(SLEEP_TB[:1] + handler + SLEEP_TB[1:]) == (
        "at cell line 1: time.sleep(30)"
    )
    assert place_of_traceback(KEYBOARD_TB[:4] + handler + KEYBOARD_TB[4:]) == (
        "in barrier (distributed_c10d.py:5356), cell line 2"
    )


def test_a_timeout_is_one_short_block_naming_where_each_rank_was() -> None:
    err = CellTimeout(
        "s", 2, [stopped(0, "timeout", SLEEP_TB), stopped(1, "timeout", SLEEP_TB)], timeout=3.0
    )
    text = strip_ansi("\n".join(err._render_traceback_()))
    assert text.splitlines() == [
        "CellTimeout: timed out after 3 s on ranks 0-1 in session 's'",
        "",
        "where each rank was:",
        "  ranks 0-1: at cell line 1: time.sleep(30)",
    ]
    assert "KeyboardInterrupt" not in text  # the interrupt jupyter_dist sent is no cause


def test_an_interrupted_cell_is_a_keyboard_interrupt_with_places() -> None:
    err = CellInterrupted(
        "s", 2, [stopped(0, "interrupted", SLEEP_TB), stopped(1, "interrupted", KEYBOARD_TB)]
    )
    assert isinstance(err, KeyboardInterrupt) and isinstance(err, RanksFailed)
    text = strip_ansi("\n".join(err._render_traceback_()))
    assert text.splitlines()[0] == "CellInterrupted: interrupted on ranks 0-1 in session 's'"
    assert "  rank 0: at cell line 1: time.sleep(30)" in text
    assert "  rank 1: in barrier (distributed_c10d.py:5356), cell line 2" in text
    assert "Traceback" not in text and "jupyter_dist" not in text


def test_an_interrupt_the_ranks_did_not_answer_says_so() -> None:
    err = CellInterrupted("s", 2, [], still_running=[0, 1])
    assert str(err).startswith("interrupted in session 's'; ranks 0-1 not stopped yet")
    assert "stacks button" not in str(err)


def test_a_stopped_cell_names_the_rank_that_did_not_stop_and_the_one_that_had_finished() -> None:
    err = CellInterrupted("s", 2, [stopped(0, "stuck", KEYBOARD_TB)], finished=[1])
    first = strip_ansi("\n".join(err._render_traceback_())).splitlines()[0]
    assert first == (
        "CellInterrupted: interrupted in session 's': rank 0 did not stop; rank 1 had finished"
    )
    assert "still running" not in str(err) and "deaf" not in str(err)


def test_a_failure_shows_its_traceback_and_the_stopped_ranks_one_line_each() -> None:
    failures = [fail(1, order=1), stopped(0, "stuck", KEYBOARD_TB)]
    text = strip_ansi("\n".join(RanksFailed("s", 2, failures)._render_traceback_()))
    assert "--- rank 1 (host host-a, local rank 1): ValueError: boom" in text
    assert "tb line" in text
    assert (
        "  rank 0 (did not stop when interrupted): in barrier (distributed_c10d.py:5356), cell "
        "line 2" in text
    )
    assert text.count("barrier") == 1


def test_a_traceback_shown_above_is_named_not_printed_again() -> None:
    """The cell's output already shows the ranks' tracebacks: the error points there."""
    one = RanksFailed("s", 4, [fail(r) for r in range(4)]).shown_above(range(4))
    text = strip_ansi("\n".join(one._render_traceback_()))
    assert "tb line" not in text and "--- ranks" not in text
    assert text.endswith("(the traceback is above, in the ranks' output)"), text
    alone = RanksFailed("s", 4, [fail(2)]).shown_above([2])
    assert strip_ansi(alone._render_traceback_()[-1]) == (
        "(the traceback is above, in rank 2's output)"
    )
    two = RanksFailed("s", 4, [fail(0, evalue="a"), fail(1, evalue="b")]).shown_above([0, 1])
    text = strip_ansi("\n".join(two._render_traceback_()))
    assert "--- rank 0 (host host-a, local rank 0): ValueError: a" in text
    assert "--- rank 1 (host host-a, local rank 1): ValueError: b" in text
    assert "tb line" not in text
    assert "(the tracebacks of ranks 0-1 are above, in the ranks' output)" in text
    # a rank whose traceback was not shown (its end never reached the notebook) still is
    partly = RanksFailed("s", 4, [fail(0, evalue="a"), fail(1, evalue="b")]).shown_above([0])
    assert strip_ansi("\n".join(partly._render_traceback_())).count("tb line") == 1


def test_a_stopped_rank_whose_traceback_names_no_line_says_so_not_unknown() -> None:
    err = CellInterrupted(
        "s", 2, [stopped(0, "interrupted", SLEEP_TB), stopped(1, "interrupted", ())]
    )
    text = strip_ansi("\n".join(err._render_traceback_()))
    assert "  rank 1: not in the cell's code (its traceback names no line)" in text
    assert "unknown" not in text
