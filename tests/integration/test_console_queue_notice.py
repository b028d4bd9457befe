"""A cell that waits on a rank because a console on that rank runs code says so: the
notice names the rank and the console, and the cell runs there once the console's code
ends (real rank kernels, a real kernel client as the console)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from jupyter_client.asynchronous import AsyncKernelClient

from jupyter_dist.common.events import Notice, StreamOut
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


def test_a_cell_queued_behind_a_consoles_code_says_why(session: Session) -> None:
    async def scenario() -> tuple[list[str], str]:
        await session.start()
        console = console_on(session, 1)
        try:
            msg_id = console.execute("import time; time.sleep(15); print('console done')")
            while True:  # the rank runs the console's code now
                msg = await asyncio.wait_for(console.get_iopub_msg(), 60)
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == (
                    "execute_input"
                ):
                    break
            sink = EventQueue()
            result = await session.execute(
                "import os; print('cell on', os.environ['RANK'])", sink=sink
            )
            assert not result.failures, result
            notices, printed = [], ""
            while not sink.empty():
                event = sink.get()
                if isinstance(event, Notice) and event.line == CONSOLE_LINE:
                    notices.append(event.text)
                elif isinstance(event, StreamOut) and event.rank == 1:
                    printed += event.text
            return notices, printed
        finally:
            console.stop_channels()
            await session.shutdown()

    notices, printed = asyncio.run(scenario())
    # one line that updates while rank 1 runs the console's code, taken away when it ends
    assert len(notices) >= 2 and notices[-1] == "", notices
    for text in notices[:-1]:
        assert text.startswith("rank 1 is queued: running code from a console on it (for ")
        assert "Kernel > Interrupt in that console" in text
    assert printed == "cell on 1\n"
