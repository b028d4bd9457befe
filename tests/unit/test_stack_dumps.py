"""A rank's own thread writes every thread's stack on request (`rank.stack_dumps`), in
the format the stacks reader parses."""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time

from jupyter_dist.common import stacks
from jupyter_dist.rank import stack_dumps


def _waiting_in_a_cell(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait()


def _raw_thread(entered: threading.Event, release: threading.Event, done: threading.Event) -> None:
    entered.set()
    release.wait()
    done.set()


def test_a_dump_reads_as_faulthandlers() -> None:
    entered, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=_waiting_in_a_cell, args=(entered, release))
    worker.start()
    # a thread started without `threading` (as some libraries do): no bootstrap frame
    raw_entered, raw_done = threading.Event(), threading.Event()
    _thread.start_new_thread(_raw_thread, (raw_entered, release, raw_done))
    try:
        assert entered.wait(10) and raw_entered.wait(10)
        text = stack_dumps.format_threads(sys._current_frames())
    finally:
        release.set()
        worker.join()
        raw_done.wait(10)
    threads = stacks.parse_dump(text)
    assert len(threads) >= 2 and stacks.is_dump(text)
    # this (main) thread is the one whose oldest frame is not a thread bootstrap
    assert stacks.main_thread(threads)[0].func == "test_a_dump_reads_as_faulthandlers"
    worker_frames = next(t for t in threads if t[-1].func == "_bootstrap")
    assert any(f.func == "_waiting_in_a_cell" for f in worker_frames)


def test_each_request_gets_a_dump_and_the_thread_ends_with_the_agent() -> None:
    written: list[str] = []
    ask_r, ask_w = os.pipe()
    thread = stack_dumps.start(ask_r, written.append)
    try:
        os.write(ask_w, b"s")
        deadline = time.monotonic() + 10
        while not written and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(written) == 1 and stacks.is_dump(written[0])
        # the answering thread leaves itself out of the dump
        assert stack_dumps.THREAD_NAME not in written[0]
        assert "answer_requests" not in written[0]
    finally:
        os.close(ask_w)  # the agent's end closed: the thread ends
        thread.join(10)
        os.close(ask_r)
    assert not thread.is_alive()


def test_text_without_a_thread_header_is_not_a_dump() -> None:
    assert not stacks.is_dump("rank log line\n(no dump: AgentError)")
