"""A rank's stdout: a flush with nothing written returns at once; written text is sent
before the flush returns (a real ipykernel IO thread and PUB socket)."""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.session import Session

from jupyter_dist.rank.out_stream import MESSAGE_CHARS, RankOutStream


@pytest.fixture
def stream() -> Iterator[tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    thread = IOPubThread(pub)
    thread.start()
    out = RankOutStream(Session(key=b""), thread, "stdout", watchfd=False)
    _joined(out, sub)
    try:
        yield out, thread, sub
    finally:
        out.close()
        thread.stop()
        thread.close()
        sub.close(linger=0)
        ctx.term()


def _joined(out: RankOutStream, sub: zmq.Socket[bytes]) -> None:
    """Write until the subscriber gets something: a PUB drops what it sends before a
    subscriber's connection is up."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out.write(".")
        out.flush()
        if sub.poll(50):
            while sub.poll(50):
                sub.recv_multipart()
            return
    raise AssertionError("the subscriber never joined")


def _counting(thread: IOPubThread) -> list[Any]:
    scheduled: list[Any] = []
    schedule = thread.schedule

    def counted(f: Any) -> None:
        scheduled.append(f)
        schedule(f)

    thread.schedule = counted  # type: ignore[method-assign]
    return scheduled


def test_flush_with_nothing_written_does_not_wait_on_the_io_thread(
    stream: tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]],
) -> None:
    out, thread, _ = stream
    scheduled = _counting(thread)
    for _ in range(3):
        out.flush()
    assert scheduled == []


def test_written_text_is_sent_by_the_time_flush_returns(
    stream: tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]],
) -> None:
    out, thread, sub = stream
    scheduled = _counting(thread)
    out.write("hello\n")
    out.flush()
    assert scheduled  # the flush went through the IO thread
    assert not out._buffers  # and handed the text to the socket before returning
    assert sub.poll(10_000)
    frames = sub.recv_multipart()
    assert frames[0] == b"stream.stdout"
    assert b'"hello\\n"' in frames[-1]
    scheduled.clear()
    out.flush()  # everything went: nothing to wait for
    assert scheduled == []


def _stream_texts(sub: zmq.Socket[bytes]) -> list[str]:
    texts = []
    while sub.poll(200):
        frames = sub.recv_multipart()
        texts.append(json.loads(frames[-1])["text"])
    return texts


def test_a_long_write_goes_out_in_bounded_messages_and_nothing_is_lost(
    stream: tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]],
) -> None:
    out, _, sub = stream
    long = "".join(chr(ord("a") + i % 26) for i in range(2 * MESSAGE_CHARS + 1000))
    written = ["step 1\n", long, "", "\n", "last"]
    assert [out.write(text) for text in written] == [len(text) for text in written]
    out.flush()
    texts = _stream_texts(sub)
    assert "".join(texts) == "".join(written)
    # a write is cut at MESSAGE_CHARS and the writer flushes once that much waits: a
    # message holds what waited before, less than MESSAGE_CHARS, and one piece at most
    assert max(len(text) for text in texts) < 2 * MESSAGE_CHARS
    assert len(texts) >= 3


def test_a_flush_waits_for_one_the_io_thread_is_running(
    stream: tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]],
) -> None:
    """The IO thread's own flush (its timer's) empties the buffers before it queues what
    it took. A flush from the cell's thread in between must still wait for it: what the
    cell sends next (its reply) must not overtake the cell's last output."""
    out, thread, sub = stream
    inside, release = threading.Event(), threading.Event()
    send = out.session.send

    def held_send(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is thread.thread:
            inside.set()
            release.wait(10)
        return send(*args, **kwargs)

    out.session.send = held_send  # type: ignore[method-assign]
    out.write("the last line\n")
    thread.schedule(out._flush)  # as the flush timer does
    assert inside.wait(10)  # the IO thread took the buffers and is about to queue them
    flushed = threading.Event()
    flusher = threading.Thread(target=lambda: (out.flush(), flushed.set()))
    flusher.start()
    try:
        assert not flushed.wait(0.5), "flush returned before the output it waits for was queued"
    finally:
        release.set()
        flusher.join(10)
    assert flushed.is_set()
    thread.send_multipart([b"reply", b"sent after the flush"])
    received = []
    while sub.poll(1000):
        received.append(sub.recv_multipart()[0])
        if received[-1] == b"reply":
            break
    assert received == [b"stream.stdout", b"reply"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_log_costs_the_log_not_the_output_of_fds_1_and_2(
    stream: tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]],
) -> None:
    """What C code writes to fd 1 goes through a pipe to the notebook and to the rank's
    log: a log on a full disk (``/dev/full`` fails every write with ENOSPC) must not stop
    the pipe's reader, or the rank would block once the pipe is full."""
    out, _thread, _sub = stream
    got: list[str] = []
    out.write = got.append  # type: ignore[method-assign,assignment]
    read_fd, write_fd = os.pipe()
    log_fd = os.open("/dev/full", os.O_WRONLY)
    out._fid, out._original_stdstream_copy, out._should_watch = read_fd, log_fd, True
    reader = threading.Thread(target=out._watch_pipe_fd, daemon=True)
    reader.start()
    data = b"".join(b"line %d from C\n" % n for n in range(20_000))  # more than a pipe holds
    try:
        view = memoryview(data)
        while view:
            ready = select.select([], [write_fd], [], 10)[1]
            assert ready, "the pipe's reader stopped: the writer would block for good"
            view = view[os.write(write_fd, view[: 1 << 12]) :]
    finally:
        os.close(write_fd)
        reader.join(10)
        os.close(read_fd)
        os.close(log_fd)
        out._fid, out._should_watch = None, False
    assert not reader.is_alive() and out._exc is None
    assert "".join(got) == data.decode()


def test_a_flush_sends_what_c_code_wrote_just_before_it(
    stream: tuple[RankOutStream, IOPubThread, zmq.Socket[bytes]],
) -> None:
    """A library's warning written to fd 2 just before a cell ends is sent with that cell:
    the flush before the cell's reply waits for the pipe's reader to take it, even when
    the reader is slow to be scheduled."""
    out, _thread, sub = stream
    read_fd, write_fd = os.pipe()
    log_fd = os.open(os.devnull, os.O_WRONLY)
    out._fid, out._original_stdstream_copy, out._should_watch = read_fd, log_fd, True
    write = out.write
    written: list[str] = []

    def slow_write(text: str) -> int:
        time.sleep(0.3)  # a reader the scheduler lets run late, after the cell's flush
        written.append(text)
        return write(text)

    out.write = slow_write  # type: ignore[method-assign]
    reader = threading.Thread(target=out._watch_pipe_fd, daemon=True)
    reader.start()
    try:
        os.write(write_fd, b"[W] hostname of the client socket cannot be retrieved\n")
        out.flush()  # as ipykernel does before the reply
        assert written and not out._buffers  # taken from the pipe and handed to the socket
        assert "cannot be retrieved" in "".join(_stream_texts(sub))
    finally:
        out._should_watch = False
        os.close(write_fd)
        reader.join(10)
        os.close(read_fd)
        os.close(log_fd)
        out._fid = None
