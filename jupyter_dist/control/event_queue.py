"""The queue between the control-plane loop and the notebook thread, with a bound on the
output waiting in it.

The loop thread reads the ranks' messages as fast as they come; the notebook thread
draws them, and on a loaded machine (or behind a slow redraw) it falls behind. Without a
bound, a rank printing a gigabyte would pile up in this queue. So the loop stops reading a
rank's messages while more than `SINK_BYTES` of output waits here (`EventQueue.room`): the
messages then wait in the rank's socket, whose queue is bounded too, and the rank's
writes block until the notebook catches up. Nothing is dropped; the rank only slows down.

Each event put wakes the notebook thread, which then takes the GIL from the loop thread
that is still routing the rest of a batch. The events a reader draws only at its next tick
(a rank began or finished, metric points: `QUIET_EVENTS`) do not wake it: they wait behind
the queue, in order, until the next event that does, or until the reader's wait times out
(it ticks every `cell_loop.POLL_S` anyway). A quick cell on 32 ranks is then one wake-up of
the notebook thread, at its end, instead of one for every rank's reply.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any

from jupyter_dist.common.events import (
    CellEvent,
    MetricsOut,
    RankFinished,
    RankStarted,
    RichOut,
    StreamOut,
    WidgetComm,
)

#: output waiting for the notebook thread beyond which the ranks' messages wait in their
#: sockets (a rank sends at most 256 KiB a message)
SINK_BYTES = 8 * 1024 * 1024
#: how often a held reader looks again
ROOM_POLL_S = 0.005


#: events the reader draws at its next tick: put, they do not wake it
QUIET_EVENTS: tuple[type, ...] = (RankStarted, RankFinished, MetricsOut)


def event_size(event: CellEvent) -> int:
    """About how many bytes ``event`` holds (output text and data; 0 for small events)."""
    sizer = _SIZERS.get(type(event))
    return 0 if sizer is None else sizer(event)


def _rough_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(_rough_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_rough_size(v) for v in value)
    return 8


def _stream_size(event: StreamOut) -> int:
    return len(event.text)


def _widget_size(event: WidgetComm) -> int:
    return sum(len(b) for b in event.buffers) + _rough_size(event.content)


def _rich_size(event: RichOut) -> int:
    return _rough_size(event.data)


#: the events that hold output (by their exact type: events are final dataclasses)
_SIZERS: dict[type, Callable[[Any], int]] = {
    StreamOut: _stream_size,
    WidgetComm: _widget_size,
    RichOut: _rich_size,
}


class EventQueue(queue.SimpleQueue[CellEvent]):
    """A `queue.SimpleQueue` of cell events that counts the output waiting in it."""

    def __init__(self, limit: int = SINK_BYTES) -> None:
        super().__init__()
        self.limit = limit
        self.waiting = 0  # bytes of output put and not yet taken
        self.held = 0  # times a reader waited for room
        self.closed = False  # the notebook thread stopped reading
        self._lock = threading.Lock()
        #: quiet events put since the last one that woke the reader, oldest first: they
        #: come after everything in the queue itself (appended without the lock: only
        #: `_release`, under it, takes them, from the left)
        self._held: collections.deque[CellEvent] = collections.deque()

    def close(self) -> None:
        """Nobody reads on: later events are dropped and readers are held no more (an
        interrupted cell's ranks may still print after the notebook stopped waiting)."""
        self.closed = True

    def put(self, item: CellEvent, block: bool = True, timeout: float | None = None) -> None:
        if self.closed:
            return
        if isinstance(item, QUIET_EVENTS):  # no output in them: nothing to count
            self._held.append(item)
            return
        size = event_size(item)
        with self._lock:
            self.waiting += size
            if self._held:
                self._release()
            super().put(item, block, timeout)

    def put_nowait(self, item: CellEvent) -> None:
        self.put(item)

    def _release(self) -> None:
        """Move the held events into the queue (under the lock: nothing put meanwhile can
        pass them)."""
        held, put = self._held, super().put
        while held:
            put(held.popleft())

    def _release_held(self) -> bool:
        """Whether there were held events, now in the queue."""
        with self._lock:
            if not self._held:
                return False
            self._release()
            return True

    def get(self, block: bool = True, timeout: float | None = None) -> CellEvent:
        """The next event; held quiet events once the queue itself is empty (at once, or
        when ``timeout`` ran out: they never wake the reader)."""
        try:
            item = super().get(False)
        except queue.Empty:
            if self._release_held():
                item = super().get(False)
            elif not block:
                raise
            else:
                try:
                    item = super().get(True, timeout)
                except queue.Empty:
                    if not self._release_held():
                        raise
                    item = super().get(False)
        self._taken(item)
        return item

    def get_nowait(self) -> CellEvent:
        return self.get(False)

    def take_all(self) -> list[CellEvent]:
        """Every event there now, the held ones last, in the order they were put (none
        if none: it never waits)."""
        get = super().get
        with self._lock:  # nothing put meanwhile can pass the held events
            taken = [get(False) for _ in range(super().qsize())]  # only this thread takes
            size = sum(map(event_size, taken))  # the held ones hold no output
            self.waiting -= size
            held = self._held
            while held:
                taken.append(held.popleft())
        return taken

    def qsize(self) -> int:
        return super().qsize() + len(self._held)

    def empty(self) -> bool:
        return super().empty() and not self._held

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
