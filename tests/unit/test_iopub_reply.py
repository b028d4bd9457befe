"""The short way of the notebook side's cells in a rank: which requests take it, and the
``busy``/``idle`` statuses said only for a cell that runs long (on a real ipykernel IO
thread)."""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

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


def _notice(after_s: float) -> tuple[BusyNotice, list[tuple[str, str, str]]]:
    said: list[tuple[str, str, str]] = []

    def publish(state: str, parent: dict[str, Any]) -> None:
        said.append((state, parent["msg_id"], threading.current_thread().name))

    return BusyNotice(publish, after_s=after_s), said


def _until_busy(notice: BusyNotice) -> None:
    deadline = time.monotonic() + 30
    while not notice.said_busy and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_short_cell_says_nothing() -> None:
    notice, said = _notice(after_s=0.3)
    for n in range(20):
        cell = {"msg_id": f"cell-{n}"}
        notice.start(cell)
        assert notice.end(cell) is False
    time.sleep(0.6)  # past every cell's deadline
    assert said == []


def test_a_long_cell_says_busy_from_the_watcher_and_idle_is_the_callers() -> None:
    notice, said = _notice(after_s=0.05)
    cell = {"msg_id": "long"}
    notice.start(cell)
    _until_busy(notice)
    assert said == [("busy", "long", "jupyter-dist-busy")]
    assert notice.end(cell) is True  # the caller says idle, after the reply
    time.sleep(0.2)
    assert len(said) == 1  # nothing after the end: no busy behind the reply
    # the watcher waited idle meanwhile; the next long cell wakes it
    notice.start({"msg_id": "next"})
    _until_busy(notice)
    assert said[-1] == ("busy", "next", "jupyter-dist-busy")


def test_a_cell_that_ended_says_nothing_of_the_next() -> None:
    """A cell ends and the next begins before the first one's deadline: only the second
    one's own deadline decides for it."""
    notice, said = _notice(after_s=0.2)
    first, second = {"msg_id": "first"}, {"msg_id": "second"}
    notice.start(first)
    assert notice.end(first) is False
    notice.start(second)
    _until_busy(notice)
    assert notice.end(second) is True
    assert [s[:2] for s in said] == [("busy", "second")]
