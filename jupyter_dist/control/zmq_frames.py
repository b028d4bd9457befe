"""Whole messages in and out of a zmq socket, without waiting, at the least cost a frame.

pyzmq's ``send_multipart`` and ``recv_multipart`` combine their flags as enums, one frame
at a time; at several messages per rank and cell that was a third of what a message cost
the notebook side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import zmq

from jupyter_dist.common.pickling import Frame

_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_RCVMORE = int(zmq.RCVMORE)
#: frames at least this large are sent without a copy (smaller ones are cheaper copied)
_NO_COPY_BYTES = 1 << 16


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any (a reader starts with the first)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def receive(socket: zmq.Socket[bytes]) -> list[bytes]:
    """A whole message if one is there (its frames arrive together), else `zmq.Again`."""
    recv, more = socket.recv, socket.getsockopt
    frames = [recv(_NOBLOCK)]
    while more(_RCVMORE):
        frames.append(recv(_NOBLOCK))
    return frames


def send(socket: zmq.Socket[bytes], frames: Sequence[Frame]) -> None:
    """Send a whole message or, if the socket is full, nothing (`zmq.Again`): zmq queues a
    multipart message whole or refuses its first frame."""
    put, last = socket.send, len(frames) - 1
    for i, frame in enumerate(frames):
        size = frame.nbytes if isinstance(frame, memoryview) else len(frame)
        put(frame, _MORE if i < last else _NOBLOCK, copy=size < _NO_COPY_BYTES)
