"""The sink's accounting: what is put and not yet taken, holding a reader, and closing."""

from __future__ import annotations

import asyncio

from jupyter_dist.common.events import Notice, RichOut, StreamOut, WidgetComm
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
