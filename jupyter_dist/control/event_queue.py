"""The queue between the control-plane loop and the notebook thread, with a bound on the
output waiting in it.

The loop thread reads the ranks' messages as fast as they come; the notebook thread
draws them, and on a loaded machine (or behind a slow redraw) it falls behind. Without a
bound, a rank printing a gigabyte would pile up in this queue. So the loop stops reading a
rank's messages while more than `SINK_BYTES` of output waits here (`EventQueue.room`): the
messages then wait in the rank's socket, whose queue is bounded too, and the rank's
writes block until the notebook catches up. Nothing is dropped; the rank only slows down.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from jupyter_dist.common.events import CellEvent, RichOut, StreamOut, WidgetComm

#: output waiting for the notebook thread beyond which the ranks' messages wait in their
#: sockets (a rank sends at most 256 KiB a message)
SINK_BYTES = 8 * 1024 * 1024
#: how often a held reader looks again
ROOM_POLL_S = 0.005


def event_size(event: CellEvent) -> int:
    """About how many bytes ``event`` holds (output text and data; 0 for small events)."""
    if isinstance(event, StreamOut):
        return len(event.text)
    if isinstance(event, WidgetComm):
        return sum(len(b) for b in event.buffers) + _rough_size(event.content)
    if isinstance(event, RichOut):
        return _rough_size(event.data)
    return 0


def _rough_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(_rough_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_rough_size(v) for v in value)
    return 8


class EventQueue(queue.SimpleQueue[CellEvent]):
    """A `queue.SimpleQueue` of cell events that counts the output waiting in it."""

    def __init__(self, limit: int = SINK_BYTES) -> None:
        super().__init__()
        self.limit = limit
        self.waiting = 0  # bytes of output put and not yet taken
        self.held = 0  # times a reader waited for room
        self.closed = False  # the notebook thread stopped reading
        self._lock = threading.Lock()

    def close(self) -> None:
        """Nobody reads on: later events are dropped and readers are held no more (an
        interrupted cell's ranks may still print after the notebook stopped waiting)."""
        self.closed = True

    def put(self, item: CellEvent, block: bool = True, timeout: float | None = None) -> None:
        if self.closed:
            return
        size = event_size(item)
        if size:
            with self._lock:
                self.waiting += size
        super().put(item, block, timeout)

    def put_nowait(self, item: CellEvent) -> None:
        self.put(item)

    def get(self, block: bool = True, timeout: float | None = None) -> CellEvent:
        item = super().get(block, timeout)
        self._taken(item)
        return item

    def get_nowait(self) -> CellEvent:
        return self.get(False)

    def _taken(self, item: CellEvent) -> None:
        size = event_size(item)
        if size:
            with self._lock:
                self.waiting -= size

    @property
    def full(self) -> bool:
        return self.waiting > self.limit

    async def room(self) -> None:
        """Return once the output waiting here is within the limit (on the loop thread)."""
        if not self.full or self.closed:
            return
        self.held += 1
        while self.full and not self.closed:
            await asyncio.sleep(ROOM_POLL_S)
