"""A rank that prints a gigabyte, in a real notebook kernel, in both output modes.

The promise: the notebook kernel's memory stays bounded, what reaches the frontend is
bounded and says where the rest is (a marker naming the rank's full log), and the full log
on disk has every byte. The test client is the frontend: it counts the bytes of every
IOPub message it receives during the cell. Numbers are printed (``pytest -s``) for the
record; nothing here is timed against a bound.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.manager import KernelManager

from tests.conftest import kernel_process, ready_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GIB = 1 << 30
MB = 1_000_000
#: how much the notebook kernel's RSS may grow while a rank prints 1 GiB
RSS_BOUND = 100 * MB
#: how much of it may reach the frontend
FRONTEND_BOUND = 16 * MB
#: a marker naming rank 0's full log
LOG_PATH = re.compile(r"full log:? (/\S+?/rank-0\.log)")

FLOOD = """%%distributed
import os, sys
if int(os.environ["RANK"]) == 0:
    chunk = ("x" * 1023 + "\\n") * 1024  # 1 MiB of 1 KiB lines
    for _ in range(1024):
        sys.stdout.write(chunk)
else:
    print("a little from rank 1")
"""

ONE_LINE = """%%distributed
import os, sys
if int(os.environ["RANK"]) == 0:
    sys.stdout.write("y" * 100_000_000)  # one 100 MB line, no newline
else:
    print("a little from rank 1")
"""


@dataclass
class Received:
    """What the frontend got for one cell."""

    reply: dict[str, Any]
    seconds: float
    frontend_bytes: int
    messages: int
    texts: list[str] = field(default_factory=list)  # every string in the messages

    def text(self) -> str:
        return "\n".join(self.texts)


class Notebook:
    """A notebook kernel driven as a frontend would drive it, watched with psutil."""

    def __init__(self, km: KernelManager, mode: str) -> None:
        self.km = km
        self.mode = mode
        self.kc = ready_client(km)
        self.process = kernel_process(km)

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def run(self, code: str, timeout: float = 600) -> Received:
        """Run a cell; count every IOPub message until the kernel is idle again."""
        msg_id = self.kc.execute(code)
        started = time.monotonic()
        got = Received({}, 0.0, 0, 0)
        deadline = started + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            content = msg["content"]
            got.frontend_bytes += len(json.dumps(content)) + sum(
                len(b) for b in msg.get("buffers") or ()
            )
            got.messages += 1
            _strings(content, got.texts)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and content["execution_state"] == "idle"
            ):
                break
        got.seconds = time.monotonic() - started
        reply = self.kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id
        got.reply = reply["content"]
        return got

    def close(self) -> None:
        self.run("%dist shutdown --all", timeout=120)
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


class PeakRss:
    """The highest RSS of a process, sampled every 10 ms in a thread."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.peak = process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _strings(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, into)
    elif isinstance(value, list):
        for v in value:
            _strings(v, into)


@pytest.fixture(params=["text", "widget"])
def notebook(
    request: pytest.FixtureRequest, kernel_name: str, tmp_path: Path
) -> Iterator[Notebook]:
    km = KernelManager(kernel_name=kernel_name)
    env = {**os.environ, "JUPYTER_DIST_OUTPUT": request.param}
    env.pop("JUPYTER_DIST_OUTPUT_LIMIT", None)  # the default limit
    km.start_kernel(cwd=str(tmp_path), env=env)
    nb = Notebook(km, request.param)
    try:
        assert nb.run("%load_ext jupyter_dist").reply["status"] == "ok"
        # a session, and one cell of each kind, before the baseline: the first cell view
        # imports ipywidgets and bqplot, which is not what is measured here
        warm = nb.run("%%distributed --procs 2\nimport os, sys\nfor i in range(3000): print(i)")
        assert warm.reply["status"] == "ok", warm.reply
        yield nb
    finally:
        nb.close()


def _flood(nb: Notebook, code: str, size: int, label: str) -> tuple[Received, Path]:
    """Run a cell in which rank 0 prints ``size`` characters; check and report the bounds."""
    base = nb.rss()
    with PeakRss(nb.process) as rss:
        got = nb.run(code)
    time.sleep(1)
    after = nb.rss()
    assert got.reply["status"] == "ok", got.reply
    print(
        f"\n[{label}] {size / MB:.0f} MB printed by rank 0 in {got.seconds:.1f} s "
        f"({size / MB / got.seconds:.0f} MB/s through the notebook); notebook RSS "
        f"{base / MB:.0f} MB before, peak +{(rss.peak - base) / MB:.0f} MB, "
        f"{(after - base) / MB:+.0f} MB after; frontend got {got.frontend_bytes / MB:.2f} MB "
        f"in {got.messages} messages"
    )
    assert rss.peak - base < RSS_BOUND, f"notebook RSS grew by {(rss.peak - base) / MB:.0f} MB"
    assert got.frontend_bytes < FRONTEND_BOUND, got.frontend_bytes
    # the marker names the full log, which has every byte rank 0 printed
    found = LOG_PATH.search(got.text())
    assert found, "no truncation marker naming rank 0's full log reached the frontend"
    log = Path(found.group(1))
    assert log.stat().st_size == size
    assert "a little from rank 1" in got.text()  # the other rank's output is all there
    return got, log


def test_a_rank_printing_a_gigabyte_is_bounded_and_logged(notebook: Notebook) -> None:
    label = notebook.mode
    got, log = _flood(notebook, FLOOD, GIB, label)
    try:
        text = got.text()
        if label == "text":
            # the first 2 MiB of rank 0's lines came through, then the marker and the tally
            assert "[rank 0] xxx" in text
            assert "more output not shown (JUPYTER_DIST_OUTPUT_LIMIT is 2.0 MiB)" in text
        else:
            # rank 0's view: its last lines, and how many earlier ones are only in the log
            assert re.search(r"\.\.\. \d+ earlier lines hidden; full log: ", text)
        # the next cell is quick and normal again
        after = notebook.run("%%distributed\nprint('next cell')")
        assert after.reply["status"] == "ok" and "next cell" in after.text()
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)  # 1 GiB of /tmp


def test_one_endless_line_is_bounded_and_logged(notebook: Notebook) -> None:
    got, log = _flood(notebook, ONE_LINE, 100_000_000, f"{notebook.mode}, one line")
    try:
        assert "yyyyyyyy" in got.text()
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)
