"""The turns of a shared session: order, withdrawal, a sender going away, what waiters see."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_dist.control.cell_queue import (
    MAX_WAITING,
    MAX_WAITING_PER_SENDER,
    CellQueue,
    Sender,
    Turn,
    check_kind,
    waiting_text,
)
from jupyter_dist.errors import SessionError, SpecError
from tests.async_run import in_loop

A = Sender("train.ipynb", "ka")
B = Sender("eval.ipynb", "kb")


@in_loop
async def test_turns_run_one_at_a_time_in_order() -> None:
    queue = CellQueue()
    first = await queue.take(Turn("1", A))
    second = asyncio.ensure_future(queue.take(Turn("2", B)))
    await asyncio.sleep(0.01)
    assert not second.done()
    assert queue.status()["running"]["turn_id"] == "1"  # type: ignore[index]
    assert [t["path"] for t in queue.status()["queue"]] == ["eval.ipynb"]
    queue.end(first.turn_id)
    assert (await second).turn_id == "2"
    assert queue.cells_run == 2


@in_loop
async def test_a_waiter_hears_whose_cell_runs() -> None:
    queue = CellQueue()
    running = await queue.take(Turn("1", A))
    heard: list[str] = []
    waiting = asyncio.ensure_future(queue.take(Turn("2", B), heard.append, report_every=0.01))
    await asyncio.sleep(0.05)
    queue.end(running.turn_id)
    await waiting
    assert heard and heard[0].startswith("waiting for a cell from train.ipynb (running ")


@in_loop
async def test_withdrawing_a_waiting_turn_leaves_the_running_one_alone() -> None:
    queue = CellQueue()
    running = await queue.take(Turn("1", A))
    waiting = asyncio.ensure_future(queue.take(Turn("2", B)))
    await asyncio.sleep(0.01)
    queue.end("2")
    with pytest.raises(SessionError, match="withdrawn"):
        await waiting
    assert queue.running is running
    assert queue.status()["queue"] == []


@in_loop
async def test_a_cancelled_waiter_withdraws_its_turn() -> None:
    queue = CellQueue()
    await queue.take(Turn("1", A))
    waiting = asyncio.ensure_future(queue.take(Turn("2", B)))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert queue.status()["queue"] == []


@in_loop
async def test_a_sender_that_goes_away_loses_its_turns_and_the_next_one_runs() -> None:
    queue = CellQueue()
    await queue.take(Turn("a1", A, ranks=(0, 1)))
    a2 = asyncio.ensure_future(queue.take(Turn("a2", A)))
    b1 = asyncio.ensure_future(queue.take(Turn("b1", B)))
    await asyncio.sleep(0.01)
    running, withdrawn = queue.drop_sender("ka")
    assert running is not None and running.turn_id == "a1" and running.ranks == (0, 1)
    assert [t.turn_id for t in withdrawn] == ["a2"]
    assert (await b1).turn_id == "b1"
    with pytest.raises(SessionError):
        await a2


@in_loop
async def test_asking_twice_with_one_id_is_one_turn() -> None:
    queue = CellQueue()
    queue.enqueue(Turn("1", A))
    queue.enqueue(Turn("2", B))
    queue.enqueue(Turn("2", B))
    assert len(queue.status()["queue"]) == 1


@in_loop
async def test_errors_and_busy_ranks_are_recorded() -> None:
    queue = CellQueue()
    turn = await queue.take(Turn("1", A, ranks=(1,)))
    assert queue.busy_since(1) == turn.started
    assert queue.busy_since(0) is None
    queue.end("1", {1: "ValueError: bad"}, [1])
    assert queue.last_errors == {1: "ValueError: bad"}
    await queue.take(Turn("2", A))
    queue.end("2", {}, [0, 1])
    assert queue.last_errors == {}


def test_the_queue_is_bounded() -> None:
    queue = CellQueue()
    queue.enqueue(Turn("running", A))
    for i in range(MAX_WAITING):
        queue.enqueue(Turn(str(i), Sender("", f"k{i}")))
    with pytest.raises(SessionError, match=f"at most {MAX_WAITING}"):
        queue.enqueue(Turn("one-more", B))


def test_one_sender_holds_a_few_waiting_turns_only() -> None:
    queue = CellQueue()
    queue.enqueue(Turn("running", A))
    for i in range(MAX_WAITING_PER_SENDER):
        queue.enqueue(Turn(str(i), B))
    with pytest.raises(SessionError, match=f"at most {MAX_WAITING_PER_SENDER} from one sender"):
        queue.enqueue(Turn("one-more", B))
    assert queue.enqueue(Turn("0", B)) is queue.waiting[0]  # asking again is no new turn
    queue.enqueue(Turn("from-a", A))  # another sender still may
    queue.end("0")
    queue.enqueue(Turn("now-there-is-room", B))


def test_senders_from_requests_are_checked() -> None:
    assert Sender.from_json({"path": "a.ipynb", "kernel_id": "k"}) == Sender("a.ipynb", "k")
    assert Sender.from_json(None) == Sender()
    with pytest.raises(SpecError, match="unknown field 'pid'"):
        Sender.from_json({"pid": 3})
    with pytest.raises(SpecError, match=r"sender.path: '3' is not a string"):
        Sender.from_json({"path": 3})
    with pytest.raises(SpecError, match="is not an object"):
        Sender.from_json("a.ipynb")
    with pytest.raises(SpecError, match="'job' is not one of"):
        check_kind("job")


def test_waiting_text_names_the_sender() -> None:
    running = Turn("1", Sender("", "0123456789abcdef"), "pull", started=100.0).to_json()
    assert (
        waiting_text(running, now=108.4) == "waiting for a pull from kernel 01234567 (running 8 s)"
    )
    assert waiting_text(None) == "waiting for the session's ranks"
    assert Sender().label == "another client"


@in_loop
async def test_the_manager_forgets_kernels_that_are_gone_and_notebooks_without_a_stream() -> None:
    from jupyter_dist.control.manager import SessionManager

    class Stub:
        def __init__(self) -> None:
            self.notebooks: dict[str, Any] = {}
            self.turns = CellQueue()
            self.name = "s"
            self.state = None

    manager = SessionManager()
    session: Any = Stub()
    manager.sessions["s"] = session
    session.notebooks = {
        "ka": {**A.to_json(), "since": 0.0},
        "kb": {**B.to_json(), "since": 0.0},
        "kc": {"path": "c.ipynb", "kernel_id": "kc", "since": 0.0},
    }
    session.turns.enqueue(Turn("1", A))
    session.turns.enqueue(Turn("2", B))
    manager.client_came("ka")  # a held stream does not keep a gone kernel
    manager.client_came("kb")
    await manager.prune_senders(lambda k: k != "ka", stream_grace=60.0)
    assert session.turns.running is not None and session.turns.running.turn_id == "2"
    assert "ka" not in manager.clients
    assert sorted(session.notebooks) == ["kb"]  # kc: no stream for more than 60 s
