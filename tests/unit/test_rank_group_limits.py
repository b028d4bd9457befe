"""A session of many ranks gets the zmq sockets and open files its clients need."""

from __future__ import annotations

import resource

import pytest
import zmq

from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control import rank_group
from jupyter_dist.control.rank_group import RankGroup


def test_a_thousand_ranks_fit_in_one_context() -> None:
    """zmq allows 1,023 sockets a context by default: three a rank would stop at 341."""
    group = RankGroup(SessionSpec(nodes=64, procs_per_node=16, init_process_group=False), "k")
    try:
        assert group._context.get(zmq.MAX_SOCKETS) >= 3 * 1024
        sockets = [group._context.socket(zmq.DEALER) for _ in range(1100)]
        for socket in sockets:
            socket.close(linger=0)
    finally:
        group._context.term()


def test_the_soft_open_file_limit_is_raised_towards_the_hard_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = {"soft": 2048, "hard": 4096}
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (limits["soft"], limits["hard"]))

    def setrlimit(_which: int, values: tuple[int, int]) -> None:
        limits["soft"], limits["hard"] = values

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    context = zmq.Context()
    try:
        rank_group.room_for_sockets(context, 300)  # small: nothing to raise
        assert limits["soft"] == 2048
        rank_group.room_for_sockets(context, 3 * 1024)  # wants more than the hard limit
        assert limits == {"soft": 4096, "hard": 4096}
    finally:
        context.term()
