"""Every thread's Python stack on request, written by a thread of the rank itself.

faulthandler can dump all threads from its C signal handler, and it does so even while
the main thread is stuck in C code; but it walks the thread states without the GIL, and
a thread starting or ending meanwhile crashes the process (CPython documents that the
all-threads dump is unsafe while other threads run). Asking where ranks are must never
kill one, so a rank answers from a thread of its own: it waits on a pipe its node's agent
writes a byte to, takes the GIL like any thread, and writes ``sys._current_frames()`` in
faulthandler's format, which the rest of jupyter_dist reads (`common.stacks`).

A collective (gloo, NCCL) waits with the GIL released, so the thread answers while the
main thread is stuck in one. Only a rank whose GIL is held by stuck C code stays silent;
for that one the agent falls back to faulthandler's signal, which is then safe: no other
Python thread can run to start or end while the GIL is held.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import traceback
from collections.abc import Callable
from types import FrameType

THREAD_NAME = "jupyter-dist-stacks"
#: the byte that asks the thread to free the main thread from a collective of its process
#: group (`rank.group_sockets.free`); any other byte asks for a dump
FREE_REQUEST = b"f"
#: innermost frames kept per thread, as faulthandler does
MAX_FRAMES = 100


def format_threads(frames: dict[int, FrameType], skip: int | None = None) -> str:
    """Each thread's stack, most recent call first, as faulthandler writes it; the main
    thread (the one that runs cells) first, so that a reader finds it even beside threads
    started without `threading` (whose oldest frame is no thread bootstrap either)."""
    blocks = []
    main = threading.main_thread().ident
    for ident, frame in sorted(frames.items(), key=lambda item: item[0] != main):
        if ident == skip:
            continue
        lines = [f"Thread 0x{ident:016x} (most recent call first):"]
        for each, line in itertools.islice(traceback.walk_stack(frame), MAX_FRAMES):
            code = each.f_code
            lines.append(f'  File "{code.co_filename}", line {line} in {code.co_name}')
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


def answer_requests(fd: int, write: Callable[[str], None]) -> None:
    """Write a dump for each request read from ``fd`` (any byte but `FREE_REQUEST`), and
    free the main thread from its group's collective for `FREE_REQUEST`
    (`rank.group_sockets`), until the agent's end is closed."""
    me = threading.get_ident()
    while True:
        try:
            wanted = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not wanted:  # the agent is gone
            return
        if FREE_REQUEST in wanted:
            with contextlib.suppress(Exception):
                from jupyter_dist.rank import group_sockets

                group_sockets.free()
        if wanted.strip(FREE_REQUEST):
            with contextlib.suppress(Exception):
                write(format_threads(sys._current_frames(), skip=me))


def start(fd: int, write: Callable[[str], None]) -> threading.Thread:
    """Answer dump requests arriving on ``fd`` from a daemon thread."""
    thread = threading.Thread(target=answer_requests, args=(fd, write), name=THREAD_NAME)
    thread.daemon = True
    thread.start()
    return thread
