"""The short way of the notebook side's cells in a rank: which requests take it, and the
``busy``/``idle`` statuses said only for a cell that runs long (on a real ipykernel IO
thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from ipykernel.iostream import IOPubThread

from jupyter_dist.common.wire_codec import WireCodec
from jupyter_dist.common.wire_names import IOPUB_REPLY_KEY
from jupyter_dist.rank.iopub_reply import BusyNotice, iopub_reply_request

CODEC = WireCodec(b"key")


def _request(
    msg_type: str = "execute_request", metadata: dict[str, Any] | None = None
) -> list[Any]:
    _msg_id, frames = CODEC.encode(msg_type, {"code": "x = 1"}, metadata=metadata)
    return [b"notebook-identity", *frames]


def test_only_execute_requests_that_ask_take_the_short_way() -> None:
    asked = _request(metadata={IOPUB_REPLY_KEY: True})
    found = iopub_reply_request(asked)
    assert found is not None
    idents, frames = found
    assert idents == [b"notebook-identity"]
    assert CODEC.decode(frames)["content"] == {"code": "x = 1"}
    # a console's request, another request type, and frames that are no message
    assert iopub_reply_request(_request()) is None
    assert iopub_reply_request(_request("comm_msg", {IOPUB_REPLY_KEY: True})) is None
    assert iopub_reply_request([b"no delimiter", b"{}"]) is None
    assert iopub_reply_request(asked[:4]) is None  # cut short
    as_frames = [zmq.Frame(f) for f in asked]  # as ipykernel hands them over
    assert iopub_reply_request(as_frames) is not None


@pytest.fixture
def io_thread() -> Iterator[IOPubThread]:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind("inproc://busy-notice")
    thread = IOPubThread(pub)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
        thread.close()
        ctx.term()


def _notice(thread: IOPubThread, after_s: float) -> tuple[BusyNotice, list[tuple[str, str, str]]]:
    said: list[tuple[str, str, str]] = []

    def publish(state: str, parent: dict[str, Any]) -> None:
        said.append((state, parent["msg_id"], threading.current_thread().name))

    notice = BusyNotice(thread.schedule, thread.io_loop.call_later, publish, after_s=after_s)
    return notice, said


def test_a_short_cell_says_nothing(io_thread: IOPubThread) -> None:
    notice, said = _notice(io_thread, after_s=0.3)
    for n in range(20):
        cell = {"msg_id": f"cell-{n}"}
        notice.start(cell)
        notice.finish(cell)
    time.sleep(0.6)  # every timer has fired by now, each after its cell ended
    assert said == []


def test_a_long_cell_says_busy_then_idle(io_thread: IOPubThread) -> None:
    notice, said = _notice(io_thread, after_s=0.05)
    cell = {"msg_id": "long"}
    notice.start(cell)
    deadline = time.monotonic() + 30
    while not notice.said_busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s[:2] for s in said] == [("busy", "long")]
    assert said[0][2] != threading.current_thread().name  # said by the IO thread
    notice.finish(cell)
    assert [s[:2] for s in said] == [("busy", "long"), ("idle", "long")]
    # the next cell, short, says nothing
    notice.start({"msg_id": "short"})
    notice.finish({"msg_id": "short"})
    time.sleep(0.2)
    assert len(said) == 2


def test_a_timer_of_an_ended_cell_says_nothing_of_the_next(io_thread: IOPubThread) -> None:
    """A cell ends and the next begins before the first one's timer fires: the timer is
    the first cell's, which is over, and the second's own timer decides for it."""
    notice, said = _notice(io_thread, after_s=0.2)
    first, second = {"msg_id": "first"}, {"msg_id": "second"}
    notice.start(first)
    notice.finish(first)
    notice.start(second)
    deadline = time.monotonic() + 30
    while not notice.said_busy and time.monotonic() < deadline:
        time.sleep(0.01)
    notice.finish(second)
    assert [s[:2] for s in said] == [("busy", "second"), ("idle", "second")]
