"""``%dist status`` as tables: what each column says, from a session's status."""

from __future__ import annotations

from typing import Any

from jupyter_dist.display.status_table import format_duration, status_bundle


def status(**extra: Any) -> Any:
    rank = {
        "rank": 0, "local_rank": 0, "node_rank": 0, "host": "gpu1", "pid": 11, "state": "busy",
        "exit": None, "returncode": None, "exit_tail": "", "log": "",
        "busy_since": 1000.0 - 75, "last_error": "ValueError: " + "x" * 200,
    }  # fmt: skip
    return {
        "name": "train", "state": "ready", "shape": "1 CPU rank (gloo)", "spec": {},
        "world_size": 1, "backend": "gloo", "device": "cpu", "cells_run": 7,
        "broken_reason": "", "master": "gpu1:29500", "nodes": [], "ranks": [rank], **extra,
    }  # fmt: skip


def test_durations_read_at_a_glance() -> None:
    assert [format_duration(s) for s in (None, 5, 600, 3 * 3600 + 300, 3 * 86400)] == [
        "-", "5 s", "10 min", "3 h 05 min", "3 d 0 h",
    ]  # fmt: skip


def test_a_shared_session_says_who_runs_what_and_for_how_long() -> None:
    s = status(
        started_at=1000.0 - 7200,
        notebooks=[{"path": "work/train.ipynb", "kernel_id": "k1", "since": 0.0}],
        running={"path": "work/eval.ipynb", "kernel_id": "k2", "cell_id": "c", "started": 992.0},
        queue=[{"path": "work/train.ipynb", "kernel_id": "k1", "cell_id": "d", "queued_at": 0}],
    )
    bundle = status_bundle([s], "server", "sessions run in the server", {"train": {0: 2048.0}},
                           now=1000.0)  # fmt: skip
    text = bundle["text/plain"]
    row = text.splitlines()[3]
    for said in ("train", "ready", "server", "train.ipynb", "2 h 00 min", "7",
                 "a cell from eval.ipynb (8 s)", "1"):  # fmt: skip
        assert said in row, (said, row)
    rank = text.splitlines()[-1]
    assert "busy 75 s" in rank and "2.0 GiB" in rank and "0 · gpu1" in rank
    assert rank.endswith("...") and len(rank) < 200  # the error line is cut
    assert '<th scope="col">cells run</th>' in bundle["text/html"]


def test_no_sessions_is_one_line() -> None:
    assert status_bundle([], "this kernel", "no sessions", {}) == {
        "text/plain": "no sessions",
        "text/html": "<p>no sessions</p>",
    }


def test_the_process_group_column_says_what_the_ranks_have() -> None:
    from jupyter_dist.display.status_table import group_summary

    def ranks(*groups: str, dead: int | None = None) -> list[dict[str, Any]]:
        base = status()["ranks"][0]
        return [
            {**base, "rank": r, "state": "dead" if r == dead else "idle", "group": g}
            for r, g in enumerate(groups)
        ]

    made = {"init_process_group": True}
    assert group_summary(status(ranks=ranks("gloo", "gloo"), spec=made)) == "gloo"
    destroyed = group_summary(status(ranks=ranks("", ""), spec=made))
    assert destroyed.startswith("none: a cell destroyed it, the next cell on all ranks")
    no_init = {"init_process_group": False}
    assert group_summary(status(ranks=ranks("", ""), spec=no_init)) == "none"
    mixed = group_summary(status(ranks=ranks("gloo", "", "gloo"), spec=made))
    assert mixed == "gloo on ranks 0,2, none on rank 1"
    assert group_summary(status(ranks=ranks("gloo", "", dead=1), spec=made)) == "gloo"
    assert group_summary(status()) == "-"  # a control plane that does not report it
    starting = [{**rank, "state": "starting"} for rank in ranks("", "")]
    assert group_summary(status(ranks=starting, spec=made)) == "-"  # none made yet
    text = status_bundle([status(ranks=ranks("", ""), spec=made)], "kernel", "h", {})
    assert "process group" in text["text/plain"] and "a cell destroyed it" in text["text/html"]


def test_a_degraded_session_says_which_rank_failed() -> None:
    dead = {**status()["ranks"][0], "rank": 1, "state": "dead", "exit": "exit code 3"}
    s = status(
        state="degraded",
        broken_reason="rank 1 (host gpu1, pid 12) exit code 3",
        faults=["rank 1 died (exit code 3)"],
        generation=0,
        ranks=[status()["ranks"][0], dead],
    )
    text = status_bundle([s], "this kernel", "sessions", {}, now=1000.0)["text/plain"]
    row = text.splitlines()[3]
    assert "degraded: rank 1 (host gpu1, pid 12) exit code 3" in row, text
