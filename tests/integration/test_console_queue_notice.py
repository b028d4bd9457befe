"""A cell that waits on a rank because a console on that rank runs code says so: the
notice names the rank and the console, and the cell runs there once the console's code
ends (real rank kernels, a real kernel client as the console)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.asynchronous import AsyncKernelClient

from jupyter_dist.common.events import Notice, RankFinished, StreamOut
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.rank_group import CONSOLE_LINE
from jupyter_dist.control.session import Session, SessionTimeouts

pytestmark = pytest.mark.slow


@pytest.fixture
def session() -> Iterator[Session]:
    spec = resolve_shape("queued", ShapeRequest(procs=2, init=False), 0, "localhost")
    yield Session(spec, SessionTimeouts(start=120))


def console_on(session: Session, rank: int) -> AsyncKernelClient:
    info = session.connection_info()
    entry = next(r for r in info["ranks"] if r["rank"] == rank)
    client = AsyncKernelClient()
    client.load_connection_info(
        {**entry["connection"], "key": info["key"], "signature_scheme": info["signature_scheme"]}
    )
    client.start_channels()
    return client


class NoticeSink(EventQueue):
    """A cell's sink that also keeps the texts of its console line, as they are put."""

    def __init__(self) -> None:
        super().__init__()
        self.console_texts: set[str] = set()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(item, Notice) and item.line == CONSOLE_LINE and item.text:
            self.console_texts.add(item.text)
        super().put(item, block, timeout)


async def release_after_updates(sink: NoticeSink, go: Path, updates: int = 2) -> None:
    """Create ``go`` once the console line said ``updates`` different things (its time
    went on), or after a minute (then the test's assertions say what was missing)."""
    try:
        deadline = time.monotonic() + 60
        while len(sink.console_texts) < updates and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        go.touch()


def test_a_cell_queued_behind_a_consoles_code_says_why(session: Session, tmp_path: Path) -> None:
    go = tmp_path / "go"

    async def scenario() -> tuple[list[str], str]:
        await session.start()
        console = console_on(session, 1)
        try:
            # the console's code runs until the cell's line for it has updated
            msg_id = console.execute(
                "import os, time\nuntil = time.monotonic() + 120\n"
                f"while not os.path.exists({str(go)!r}) and time.monotonic() < until:\n"
                "    time.sleep(0.05)\nprint('console done')"
            )
            while True:  # the rank runs the console's code now
                msg = await asyncio.wait_for(console.get_iopub_msg(), 60)
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == (
                    "execute_input"
                ):
                    break
            sink = NoticeSink()
            release = asyncio.ensure_future(release_after_updates(sink, go))
            sent = time.monotonic()
            try:
                result = await session.execute(
                    "import os; print('cell on', os.environ['RANK'])", sink=sink
                )
            finally:
                release.cancel()
                go.touch()
            took = time.monotonic() - sent
            assert not result.failures, result
            notices, printed, ran = [], "", {}
            while not sink.empty():
                event = sink.get()
                if isinstance(event, Notice) and event.line == CONSOLE_LINE:
                    notices.append(event.text)
                elif isinstance(event, StreamOut) and event.rank == 1:
                    printed += event.text
                elif isinstance(event, RankFinished):
                    ran[event.rank] = event.elapsed
            # the time rank 1 waited behind the console's code is not its run time
            assert ran[1] < took / 2, (ran, took)
            return notices, printed
        finally:
            console.stop_channels()
            await session.shutdown()

    notices, printed = asyncio.run(scenario())
    # one line that updates while rank 1 runs the console's code, taken away when it ends
    assert len(notices) >= 3 and notices[-1] == "", notices
    for text in notices[:-1]:
        assert text.startswith("rank 1 is queued: running code from a console on it (for ")
        assert "Kernel > Interrupt in that console" in text
    assert printed == "cell on 1\n"
