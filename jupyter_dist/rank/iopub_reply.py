"""The notebook side's cells, answered on IOPub: one message a rank for a short cell.

For each cell, ipykernel sends its sender a ``busy`` status, a shell ``execute_reply``
and an ``idle`` status, the last so that the sender knows no output is still on the way
(IOPub and shell are two sockets, with no order between them). That is three messages a
rank for a cell that prints nothing, each signed, queued to the IO thread, relayed and
parsed by the notebook, and most of what an empty cell costs at many ranks.

A request that asks for it (`IOPUB_REPLY_KEY` in its metadata: the notebook side's own
cells) is answered instead by one IOPub message after the cell's output,
`EXECUTE_REPLY_MSG_TYPE`, whose content is the ``execute_reply`` ipykernel would have
sent: on one socket, behind the output, it is also the end of the cell. The cell itself
runs as any other (`IPythonKernel.do_execute`: the same shell, execution count, history,
magics, interrupts, tracebacks); only ipykernel's message plumbing around it is left out.

The statuses still tell other clients what the rank is doing, but only for a cell that
takes longer than `BUSY_AFTER_S`: a watching thread then says ``busy``, and ``idle``
follows the reply (`BusyNotice`). A console on the rank or the session's status sees a
long cell as before, and a short one costs nobody anything.

Requests without the key (a console's, a client of another version) take ipykernel's
usual way, as do requests that ipykernel would abort after an error.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from jupyter_client.jsonutil import json_clean

from jupyter_dist.common.wire_codec import DELIMITER, WireCodec, WireError
from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE, IOPUB_REPLY_KEY

log = logging.getLogger(__name__)
#: seconds a cell runs before its rank says ``busy`` on IOPub (and ``idle`` after it)
BUSY_AFTER_S = 0.05
_KEY_BYTES = IOPUB_REPLY_KEY.encode()


def iopub_reply_request(msg: list[Any]) -> tuple[list[bytes], list[Any]] | None:
    """``(identities, frames from the delimiter on)`` of a shell message that is an
    execute_request asking for its reply on IOPub, else None: a look at its header and
    metadata parts, nothing parsed."""
    index = next((i for i, frame in enumerate(msg) if _bytes(frame) == DELIMITER), None)
    if index is None:
        return None
    frames = msg[index:]
    if len(frames) < 6 or _KEY_BYTES not in _bytes(frames[4]):
        return None
    if b'"execute_request"' not in _bytes(frames[2]):
        return None
    return [_bytes(f) for f in msg[:index]], frames


def _bytes(frame: Any) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


class BusyNotice:
    """``busy`` and ``idle`` on IOPub for a cell that runs longer than `BUSY_AFTER_S`.

    A thread of its own watches the running cell: ``start`` notes the cell and its start
    (and wakes the thread only if it waits idle, so cells back to back cost no thread
    switch); the thread says ``busy`` once a cell has run `BUSY_AFTER_S`. ``end`` notes
    the cell ended and says whether ``busy`` was said: it is called before the reply is
    queued, so no ``busy`` comes after the reply, and the caller says ``idle`` after it.
    One lock orders the two threads."""

    def __init__(
        self, publish: Callable[[str, dict[str, Any]], None], after_s: float = BUSY_AFTER_S
    ) -> None:
        self.after_s = after_s
        self._publish = publish
        self._changed = threading.Condition()
        self._cell: dict[str, Any] | None = None
        self._since = 0.0
        self._said_busy = False
        self._idle_wait = False  # the watcher waits for a cell, with no deadline
        self._thread: threading.Thread | None = None

    def start(self, parent: dict[str, Any]) -> None:
        with self._changed:
            self._cell, self._since, self._said_busy = parent, time.monotonic(), False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="jupyter-dist-busy", daemon=True
                )
                self._thread.start()
            elif self._idle_wait:
                self._changed.notify()

    def end(self, parent: dict[str, Any]) -> bool:
        """The cell ``parent`` ended: whether ``busy`` was said for it (then ``idle``
        is the caller's to say, after the reply)."""
        with self._changed:
            said = self._said_busy and self._cell is parent
            self._cell, self._said_busy = None, False
            return said

    @property
    def said_busy(self) -> bool:
        with self._changed:
            return self._said_busy

    def _watch(self) -> None:
        with self._changed:
            while True:
                cell = self._cell
                if cell is None or self._said_busy:
                    self._idle_wait = True
                    self._changed.wait()
                    self._idle_wait = False
                    continue
                left = self._since + self.after_s - time.monotonic()
                if left > 0:
                    self._changed.wait(left)  # a later cell only moves the deadline on
                    continue
                self._said_busy = True
                try:
                    self._publish("busy", cell)
                except Exception:  # the kernel is going away: the next cell tries again
                    log.exception("saying busy failed")


class IopubReplies:
    """Runs the requests that ask for an IOPub reply, for one `IPythonKernel`."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        session = kernel.session
        self.codec = WireCodec(session.key, session.signature_scheme)
        # signed as the kernel signs: a subscriber tells kernels apart by the session
        # of their messages' headers
        self.codec.session, self.codec.username = session.session, session.username
        self.topic = kernel._topic(EXECUTE_REPLY_MSG_TYPE)
        self.busy = BusyNotice(self._status)

    def _status(self, state: str, parent: dict[str, Any]) -> None:
        kernel = self.kernel
        kernel.session.send(
            kernel.iopub_socket,
            "status",
            {"execution_state": state},
            parent=parent,
            ident=kernel._topic("status"),
        )

    async def run(self, idents: list[Any], frames: list[Any]) -> bool:
        """Run the request ``frames``; False (nothing done) for one that ipykernel's own
        way must take: malformed or badly signed (it says so in the log), or arriving
        while the kernel aborts requests after an error."""
        kernel = self.kernel
        if kernel._aborting:
            return False
        try:
            msg = self.codec.decode(frames)
        except WireError:
            return False
        content = msg["content"]
        code = content.get("code")
        if not isinstance(code, str):
            return False
        silent = bool(content.get("silent", False))
        cell_meta = msg["metadata"]
        kernel.set_parent(idents, msg, channel="shell")
        self.busy.start(msg)
        if not silent:
            kernel.execution_count += 1
        with contextlib.suppress(Exception):  # as ipykernel's dispatch: SIGINT raises
            kernel.pre_handler_hook()
        try:
            reply = await kernel.do_execute(
                code,
                silent,
                bool(content.get("store_history", not silent)),
                content.get("user_expressions") or {},
                bool(content.get("allow_stdin", False)),
                cell_meta=cell_meta,
                cell_id=cell_meta.get("cellId"),
            )
        except (Exception, KeyboardInterrupt) as err:
            # outside the cell's code (an interrupt as the cell ends, a kernel bug):
            # ipykernel would log it and never reply; the sender is told instead
            kernel.log.exception("a cell failed outside its code")
            reply = {
                "status": "error",
                "ename": type(err).__name__,
                "evalue": str(err),
                "traceback": [],
                "execution_count": kernel.execution_count,
            }
        finally:
            with contextlib.suppress(Exception):
                kernel.post_handler_hook()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        said_busy = self.busy.end(msg)
        _msg_id, reply_frames = self.codec.encode(
            EXECUTE_REPLY_MSG_TYPE, json_clean(reply), parent=msg["header"]
        )
        kernel.iopub_socket.send_multipart([self.topic, *reply_frames])
        if said_busy:
            self._status("idle", msg)
        return True
