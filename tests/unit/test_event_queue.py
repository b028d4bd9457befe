"""The sink's accounting: what is put and not yet taken, holding a reader, and closing."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time

import pytest

from jupyter_dist.common.events import (
    Notice,
    RankFinished,
    RankStarted,
    RichOut,
    StreamOut,
    WidgetComm,
)
from jupyter_dist.control.event_queue import EventQueue, event_size


def test_sizes_count_output_text_and_data() -> None:
    assert event_size(StreamOut(0, "stdout", "abc")) == 3
    assert event_size(RichOut(0, "display_data", {"image/png": "x" * 100}, {}, {})) == 100
    comm = WidgetComm(0, "comm_msg", {"data": {"state": {"value": "yy"}}}, (b"12345",))
    assert event_size(comm) == 7
    assert event_size(Notice("a note")) == 0


def test_waiting_output_holds_a_reader_until_taken() -> None:
    sink = EventQueue(limit=10)
    sink.put(StreamOut(0, "stdout", "x" * 8))
    sink.put(Notice("n"))
    sink.put(StreamOut(1, "stdout", "y" * 8))
    assert sink.waiting == 16 and sink.full

    async def reader() -> bool:
        waited = asyncio.ensure_future(sink.room())
        await asyncio.sleep(0.05)
        held = not waited.done()
        await asyncio.get_running_loop().run_in_executor(None, sink.get_nowait)  # x * 8
        await asyncio.wait_for(waited, 5)
        return held

    assert asyncio.run(reader())
    assert sink.held == 1 and sink.waiting == 8
    assert isinstance(sink.get(), Notice) and sink.waiting == 8
    assert sink.get(timeout=1) == StreamOut(1, "stdout", "y" * 8) and sink.waiting == 0


def test_a_closed_sink_holds_nobody_and_keeps_nothing() -> None:
    sink = EventQueue(limit=1)
    sink.put(StreamOut(0, "stdout", "too much"))
    sink.close()
    asyncio.run(asyncio.wait_for(sink.room(), 5))  # returns at once
    sink.put(StreamOut(0, "stdout", "after the notebook stopped reading"))
    assert sink.qsize() == 1


def test_quiet_events_wait_for_the_next_loud_one_in_order() -> None:
    sink = EventQueue()
    sink.put(StreamOut(0, "stdout", "a"))
    sink.put(RankFinished(0, "ok", 0.1))
    sink.put(RankStarted(1))
    assert sink.qsize() == 3 and not sink.empty()
    sink.put(Notice("loud"))
    taken = [sink.get_nowait() for _ in range(4)]
    assert taken == [
        StreamOut(0, "stdout", "a"),
        RankFinished(0, "ok", 0.1),
        RankStarted(1),
        Notice("loud"),
    ]
    assert sink.empty()


def test_a_reader_gets_quiet_events_without_being_woken_for_them() -> None:
    sink = EventQueue()
    done = threading.Event()
    got: list[object] = []

    def reader() -> None:
        with contextlib.suppress(queue.Empty):
            got.append(sink.get(timeout=0.5))
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)  # the reader waits
    sink.put(RankFinished(3, "ok", 0.2))
    assert not done.wait(0.2)  # not woken ...
    assert done.wait(5)  # ... its wait ran out, and it took the held event
    thread.join()
    assert got == [RankFinished(3, "ok", 0.2)]
    sink.put(RankFinished(4, "ok", 0.2))
    assert sink.get(timeout=0) == RankFinished(4, "ok", 0.2)  # no wait when held
    with pytest.raises(queue.Empty):
        sink.get(timeout=0.01)


def test_take_all_takes_what_is_there_in_order_and_counts_it_taken() -> None:
    sink = EventQueue()
    assert sink.take_all() == []
    sink.put(StreamOut(0, "stdout", "abc"))
    sink.put(RankFinished(0, "ok", 0.1))
    sink.put(Notice("n"))
    sink.put(RankFinished(1, "ok", 0.1))
    assert sink.take_all() == [
        StreamOut(0, "stdout", "abc"),
        RankFinished(0, "ok", 0.1),
        Notice("n"),
        RankFinished(1, "ok", 0.1),
    ]
    assert sink.waiting == 0 and sink.empty()
