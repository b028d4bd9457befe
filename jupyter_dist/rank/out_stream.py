"""A rank's stdout and stderr: bounded messages, sent at the pace the notebook takes them.

ipykernel's `OutStream` gathers everything written between two flushes (0.2 s apart) and
sends it as one stream message: a rank that prints a gigabyte in a tight loop sends the
notebook one gigabyte-sized message, which the notebook must hold whole (the frame and
the decoded text) before anything can bound it. Here a write is cut into pieces of at most
`MESSAGE_CHARS`, and once `MESSAGE_CHARS` are waiting the writer flushes and waits for
the IO thread to send them. (The cutting is done by the writer, not by the IO thread's
flush: ipykernel 7's IO thread schedules each send through its own event pipe, which a
flush sending hundreds of messages at once fills, and then blocks on.)

The rank kernel's IOPub socket blocks instead of dropping (``XPUB_NODROP``, set by
`rank.kernel_app`) when a subscriber's queue is full: a notebook that reads with a small
receive queue then slows a flooding rank down to its own pace, so neither side piles up
the flood in memory and no output is lost on the way to the rank's log.

Output of a thread goes to the cell that started the thread: ipykernel keeps a cell's
parent in a context variable that threads do not inherit, so a background thread's lines
would otherwise go to whichever cell runs when it prints (another notebook's, on a shared
session). `attribute_threads` records the parent on each thread as it starts.

What is written to the rank's file descriptors 1 and 2 (C code, subprocesses) reaches
the notebook through a pipe ipykernel reads on a thread, which also copies it to the rank's
log. ipykernel's thread stops at the first error, so a full disk under the log would stop
that output for good, and the rank would then block on its next write once the pipe is
full: here a failed copy to the log costs the log only (`_watch_pipe_fd`). That thread
reads whenever it is scheduled, so what C code wrote just before a cell ended (a library's
warning, NCCL's log lines) could reach the notebook after the cell's reply, as output of a
cell that has ended: a flush from the kernel's thread first lets the reader take what the
pipe holds (`_drain_pipe`, at most `DRAIN_S`), so it is sent with the cell that wrote it.

Everything written here also goes to the rank's output log (`rank.output_log`).

Rank kernels use it through ``--IPKernelApp.outstream_class``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import sys
import termios
import threading
import time
from typing import Any

from ipykernel.control import ControlThread
from ipykernel.iostream import PIPE_BUFFER_SIZE, OutStream

from jupyter_dist.rank import output_log

MESSAGE_CHARS = 1 << 18
#: the longest a flush waits for the pipe's reader to take what C code wrote to fd 1 or 2
#: (a thread that writes without pause could otherwise hold the cell's reply for ever)
DRAIN_S = 1.0
#: the thread attribute holding the parent header of the cell that started the thread
THREAD_PARENT_ATTR = "_jupyter_dist_parent"


class RankOutStream(OutStream):
    """`OutStream` whose stream messages carry about `MESSAGE_CHARS` characters at most."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._unsent = 0
        self._flushing = False  # the IO thread is in `_flush`
        #: held by the pipe's reader while it reads a chunk and counts it
        self._pipe_lock = threading.Lock()
        self._pipe_reader: int | None = None  # the reader thread's ident
        self._pipe_read = 0  # bytes the reader has read from the pipe
        self._pipe_taken = 0  # of those, the bytes it has written here

    @property
    def parent_header(self) -> dict[str, Any]:
        try:
            header: dict[str, Any] = self._parent_header.get()  # this thread's cell
            return header
        except LookupError:
            pass
        started_by = getattr(threading.current_thread(), THREAD_PARENT_ATTR, None)
        if started_by:
            return dict(started_by)
        return dict(self._parent_header_global)

    @parent_header.setter
    def parent_header(self, value: dict[str, Any]) -> None:
        self._parent_header.set(value)
        self._parent_header_global = value

    def flush(self) -> None:
        """Send what was written, and wait until it is sent; at once if nothing was.

        ipykernel flushes stdout and stderr after every cell, and each flush from the
        kernel's thread is two hand-offs to the IO thread and back, which a cell that
        printed nothing need not wait for. What the caller sends next (the cell's reply)
        goes through the IO thread too, behind every stream message already queued there.

        A flush the IO thread is running (its timer's) empties the buffers before it
        queues what it took: until it has, this one waits as ipykernel's does, or the
        reply would overtake the cell's last output. ``_flushing`` is checked last: the
        IO thread's `_flush` sets it before it clears ``_flush_pending``, so a flush that
        finds neither set comes after that flush queued its message.

        ipykernel also flushes after every control request (an interrupt, a debugger's
        request), from the control thread: that flush is not waited for. The IO thread may
        be waiting for the sender's acknowledgement (`rank.iopub_credit`), which comes on
        the control channel and is read by the thread that would wait here; what was
        written goes out on the IO thread's timer as any write does."""
        if isinstance(threading.current_thread(), ControlThread):
            return
        self._drain_pipe()
        if (
            self.echo is None
            and not self._flush_pending
            and not self._subprocess_flush_pending
            and not self._buffers
            and not self._flushing
        ):
            return
        super().flush()  # type: ignore[no-untyped-call]

    def _flush(self) -> None:
        self._flushing = True
        try:
            super()._flush()  # type: ignore[no-untyped-call]
        finally:
            self._flushing = False

    def _drain_pipe(self) -> None:
        """Wait until the pipe's reader has written here the bytes the pipe holds now and
        those it has read and not yet written (at most `DRAIN_S`; what C code writes
        meanwhile is not waited for). ``_pipe_lock`` is held only around a read and its
        count, never while the reader writes (a write may wait for the IO thread)."""
        fid = self._fid
        if fid is None or threading.get_ident() in (self._pipe_reader, self._io_thread()):
            return
        with self._pipe_lock:
            target = self._pipe_read + _waiting_bytes(fid)
        deadline = time.monotonic() + DRAIN_S
        while self._pipe_taken < target and time.monotonic() < deadline:
            time.sleep(0.001)

    def _io_thread(self) -> int | None:
        thread = getattr(self.pub_thread, "thread", None)
        return thread.ident if thread is not None else None

    def _watch_pipe_fd(self) -> None:
        """ipykernel's reader of the pipe behind fds 1 and 2 (on its own thread): each
        chunk goes to the notebook, then to the rank's log (the fd it replaced). A copy to
        the log that fails (no space left, a quota) is skipped, and the next one tried.
        A chunk is read and counted under ``_pipe_lock`` (see `_drain_pipe`)."""
        fid = self._fid
        if fid is None:
            return
        self._pipe_reader = threading.get_ident()
        try:
            while self._should_watch:
                select.select([fid], [], [])
                with self._pipe_lock:
                    data = os.read(fid, PIPE_BUFFER_SIZE)
                    self._pipe_read += len(data)
                if not data or not self._should_watch:  # closed, or woken to stop
                    return
                self.write(data.decode(errors="replace"))
                with contextlib.suppress(OSError):
                    os.write(self._original_stdstream_copy, data)
                self._pipe_taken += len(data)
        except Exception:
            self._exc = sys.exc_info()

    def write(self, string: str) -> int:
        size = len(string)
        if size > MESSAGE_CHARS:
            for start in range(0, size, MESSAGE_CHARS):
                self.write(string[start : start + MESSAGE_CHARS])
            return size
        if size:  # a print's text and its newline: the common case, kept short
            kept = output_log.current
            if kept is not None:
                kept.write(string)
            super().write(string)
            self._unsent += size
            if self._unsent >= MESSAGE_CHARS:
                self._unsent = 0
                self.flush()  # waits until it is sent
        return size


def _waiting_bytes(fd: int) -> int:
    """How many bytes the pipe ``fd`` holds, unread (0 if it cannot say)."""
    try:
        raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", raw)[0])


_thread_start = threading.Thread.start


def _start_in_cell(self: threading.Thread) -> None:
    if not hasattr(self, THREAD_PARENT_ATTR):
        stream = sys.stdout
        parent = stream.parent_header if isinstance(stream, RankOutStream) else None
        setattr(self, THREAD_PARENT_ATTR, parent or None)
    _thread_start(self)


def attribute_threads() -> None:
    """Make every thread started from now on remember the cell it was started in."""
    threading.Thread.start = _start_in_cell  # type: ignore[method-assign]
