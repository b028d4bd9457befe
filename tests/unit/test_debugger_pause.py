"""A rank paused by JupyterLab's debugger, as its ``debug_event`` messages say."""

from __future__ import annotations

from jupyter_dist.control.debugger_pause import paused_after, paused_words


def test_a_stop_pauses_the_rank_until_it_continues_or_the_debugger_goes() -> None:
    since = paused_after(None, {"event": "stopped", "body": {"reason": "breakpoint"}})
    assert since is not None
    # a second stop (a step) keeps when the pause began; other events change nothing
    assert paused_after(since, {"event": "stopped", "body": {"reason": "step"}}) == since
    assert paused_after(since, {"event": "output", "body": {}}) == since
    for resumed in ("continued", "terminated", "exited"):
        assert paused_after(since, {"event": resumed}) is None
    assert paused_after(None, {"event": "thread"}) is None


def test_the_line_names_the_paused_ranks_and_says_they_are_not_hung() -> None:
    one = paused_words([1], 12.4)
    assert one.startswith("rank 1 is paused in JupyterLab's debugger (for 12 s), not hung")
    assert paused_words([1, 2], 3).startswith("ranks 1-2 are paused")
