"""A widget's state updates that a later one replaces are not sent while they wait.

A cell that sets a widget in a tight loop (``bar.value = i`` 400 times) sends one
``comm_msg`` update per assignment. Its sender reads them at its own pace
(`rank.iopub_credit`), so while the notebook is behind they wait in the IO thread's
queue. A viewer only needs the widget's last state: an update waiting there is dropped
when a later update of the same widget that sets every key it sets is queued, with
nothing but widget updates in between (`Superseded.schedule`). The loop then costs what
it costs in a plain kernel, and the notebook and the browser get a handful of updates
instead of every one.

Nothing else is dropped and nothing is reordered. Any other message queued between two
updates (output, a display, a widget opened or closed, an update with binary buffers, a
custom message) keeps both: rich's live display sets its Output widget's ``msg_id``
around what it prints, and the notebook side puts that output in the widget only if it
sees the ``msg_id`` set first. An update that is already being sent is sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

DELIMITER = b"<IDS|MSG>"
#: how ipykernel's comms name their IOPub topic
COMM_TOPIC = b"comm-"


class _Update:
    __slots__ = ("dropped", "keys", "started")

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys
        self.dropped = False  # replaced: not to be sent
        self.started = False  # the IO thread came to it


class Superseded:
    """Schedules the IO thread's sends (``schedule``, ipykernel's `IOPubThread.schedule`)
    so that an update a later one replaces is skipped if it has not been sent yet.

    Called from any thread that sends on IOPub; the IO thread only reads a flag."""

    def __init__(self, schedule: Callable[[Callable[[], None]], None]) -> None:
        self._schedule = schedule
        self._lock = threading.Lock()
        #: each widget's updates queued since the last other message, by the keys they set
        #: (one an exact set of keys: an earlier one with the same keys was replaced)
        self._latest: dict[bytes, dict[frozenset[str], _Update]] = {}
        self.dropped = 0  # updates not sent, about (for tests and benchmarks)

    def schedule(self, frames: list[Any], send: Callable[[], None]) -> None:
        """Queue ``send`` (which sends ``frames``, a serialized message) on the IO thread.

        The queue is appended to outside the lock (the IO thread's event pipe may be full,
        and the thread that would then wait must not hold up the others' sends): two
        threads may append in the other order than they were looked at, which only
        places two messages of different threads, as threads do anyway."""
        found = _update_of(frames)
        if found is None:
            with self._lock:
                self._latest.clear()  # nothing queued so far can be skipped any more
            self._schedule(send)
            return
        comm, keys = found
        update = _Update(keys)
        with self._lock:
            queued = self._latest.setdefault(comm, {})
            for earlier in [u for k, u in queued.items() if k <= keys]:
                del queued[earlier.keys]
                earlier.dropped = True  # unsent, it is not sent; sent, nothing changes
                self.dropped += not earlier.started
            queued[keys] = update

        def send_unless_replaced() -> None:
            update.started = True
            if not update.dropped:
                send()

        self._schedule(send_unless_replaced)


def _update_of(frames: list[Any]) -> tuple[bytes, frozenset[str]] | None:
    """The widget (its topic) and state keys of a ``comm_msg`` state update without
    binary buffers; None for any other message."""
    if not frames:
        return None
    topic = _bytes(frames[0])
    if not topic.startswith(COMM_TOPIC):
        return None
    try:
        start = [_bytes(f) for f in frames[:3]].index(DELIMITER)
        header = json.loads(_bytes(frames[start + 2]))
        if header.get("msg_type") != "comm_msg" or len(frames) != start + 6:
            return None  # another message type, or buffers follow the content
        data = json.loads(_bytes(frames[start + 5])).get("data") or {}
    except (ValueError, IndexError, AttributeError):
        return None
    state = data.get("state")
    if data.get("method") != "update" or data.get("buffer_paths") or not isinstance(state, dict):
        return None
    return topic, frozenset(state)


def _bytes(frame: Any) -> bytes:
    if isinstance(frame, bytes):
        return frame
    data = frame.bytes if hasattr(frame, "bytes") else frame
    return bytes(data)
