"""IOPub at the pace of each cell's sender, not of its slowest subscriber.

A rank kernel's IOPub socket (an XPUB) is shared by every notebook attached to the
session. If it blocked when any subscriber's queue was full, one stopped notebook would
stall every rank's output, and with it the other notebooks' cells. So the socket drops
what a subscriber cannot take (its queue is bounded: `SEND_QUEUE` messages), and the
flood bound moves to the one subscriber that matters for a cell, its sender: a cell
whose ``execute_request`` asks for it (`CREDIT_KEY`) has at most `CREDIT_WINDOW`
messages on the way to its sender before the rank waits for the sender's acknowledgement
(`ACK_MSG_TYPE`, on the control channel, every `ACK_EVERY` messages). A sender that
reads slowly slows its own cell's output down to its pace, and loses none of it; other
subscribers lose only what they did not ask for. A sender that stops acknowledging for
`GIVE_UP_S` (its kernel stopped or died) is no longer waited for.

An acknowledgement is taken as it arrives, on the control thread (`take_ack`), not as
ipykernel handles a control request: one at a time, each with a busy and an idle status
on IOPub and a flush of stdout and stderr. A flush waits until the IO thread has sent
what was queued before it, and while a cell's sender is a window behind, the IO thread
waits for the very acknowledgement queued behind the flush: each one then cost
ipykernel's flush timeout (10 s), so a cell that printed while it set a widget in a loop
took minutes instead of a second. For the same reason no flush from the control thread
waits (`rank.out_stream`).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import Any

from jupyter_dist.common.wire_names import ACK_MSG_TYPE, CREDIT_WINDOW

log = logging.getLogger(__name__)
#: messages the socket keeps for a subscriber that does not read (more are dropped for it)
SEND_QUEUE = 4 * CREDIT_WINDOW
#: seconds without an acknowledgement before a cell's sender is no longer waited for
GIVE_UP_S = 30.0
#: credited cells remembered (a thread of an ended cell may still print)
MAX_CELLS = 256
DELIMITER = b"<IDS|MSG>"


class _Cell:
    __slots__ = ("acked", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.acked = 0


class CreditGate:
    """Counts each credited cell's IOPub messages and holds the sending thread while its
    sender is `CREDIT_WINDOW` behind. Shared by the shell thread (`credit`), the IO
    thread (`before_send`) and the control thread (`ack`)."""

    def __init__(self, window: int = CREDIT_WINDOW, give_up_s: float = GIVE_UP_S) -> None:
        self.window = window
        self.give_up_s = give_up_s
        self._cells: collections.OrderedDict[str, _Cell] = collections.OrderedDict()
        self._changed = threading.Condition()
        self.waits = 0  # times a send waited for its sender (for tests and benchmarks)

    def credit(self, msg_id: str) -> None:
        """The cell ``msg_id`` is paced by its sender's acknowledgements."""
        with self._changed:
            self._cells[msg_id] = _Cell()
            while len(self._cells) > MAX_CELLS:
                self._cells.popitem(last=False)

    def ack(self, msg_id: str, count: int) -> None:
        with self._changed:
            cell = self._cells.get(msg_id)
            if cell is not None and count > cell.acked:
                cell.acked = count
                self._changed.notify_all()

    def before_send(self, frames: list[Any]) -> None:
        """Called with each IOPub message before it is sent: wait while its cell's sender
        is a window behind."""
        if not self._cells:
            return
        parent = _parent_id(frames)
        if parent is None:
            return
        with self._changed:
            cell = self._cells.get(parent)
            if cell is None:
                return
            cell.sent += 1
            if cell.sent - cell.acked <= self.window:
                return
            self.waits += 1
            acked = cell.acked
            deadline = time.monotonic() + self.give_up_s
            while cell.sent - cell.acked > self.window:
                if cell.acked != acked:  # progress: the sender reads
                    acked = cell.acked
                    deadline = time.monotonic() + self.give_up_s
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("cell %s: its sender stopped reading; no longer waited for", parent)
                    self._cells.pop(parent, None)
                    return
                self._changed.wait(min(left, 1.0))


def take_ack(gate: CreditGate, session: Any, frames: list[Any]) -> bool:
    """If ``frames`` (a control message as received, identities first) is a signed
    acknowledgement (`ACK_MSG_TYPE`), give it to ``gate`` and say so; anything else,
    a message that does not parse or verify included, is left to ipykernel."""
    try:
        _, message = session.feed_identities(frames, copy=False)
        raw = message[1]
        header = json.loads(raw.bytes if hasattr(raw, "bytes") else raw)
    except (ValueError, IndexError):
        return False
    if not isinstance(header, dict) or header.get("msg_type") != ACK_MSG_TYPE:
        return False
    try:
        content = session.deserialize(message, content=True, copy=False)["content"]
    except Exception:  # a bad signature, or no JSON: ipykernel logs it
        return False
    cell, count = content.get("cell"), content.get("count")
    if isinstance(cell, str) and isinstance(count, int):
        gate.ack(cell, count)
    return True


def _parent_id(frames: list[Any]) -> str | None:
    """The parent msg_id of a serialized Jupyter message (the frame after the header)."""
    for index, frame in enumerate(frames):
        data = frame.bytes if hasattr(frame, "bytes") else frame
        if data == DELIMITER:
            try:
                raw = frames[index + 3]
                parent = json.loads(raw.bytes if hasattr(raw, "bytes") else raw)
            except (IndexError, ValueError):
                return None
            msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
            return msg_id if isinstance(msg_id, str) else None
    return None
