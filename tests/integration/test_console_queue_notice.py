"""A cell that waits on a rank because a console on that rank runs code says so: the
notice names the rank and the console, and the cell runs there once the console's code
ends; one whose rank JupyterLab's debugger holds paused says that instead (real rank
kernels, a real kernel client as the console)."""

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


class ConsoleDebugger:
    """JupyterLab's debugger on a console's kernel client: DAP requests on the control
    channel, their replies there, its events on IOPub."""

    def __init__(self, client: AsyncKernelClient) -> None:
        self.client = client
        self.seq = 0

    async def request(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        self.seq += 1
        content: dict[str, Any] = {"type": "request", "seq": self.seq, "command": command}
        if arguments is not None:
            content["arguments"] = arguments
        msg = self.client.session.msg("debug_request", content)
        self.client.control_channel.send(msg)
        while True:
            reply = await asyncio.wait_for(self.client.get_control_msg(), 60)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["content"].get("success"), reply["content"]
                return reply["content"].get("body", {})

    async def event(self, name: str) -> dict[str, Any]:
        while True:
            msg = await asyncio.wait_for(self.client.get_iopub_msg(), 60)
            if msg["msg_type"] == "debug_event" and msg["content"].get("event") == name:
                return dict(msg["content"].get("body", {}))


async def wait_for_text(sink: NoticeSink, start: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [t for t in sink.console_texts if t.startswith(start)]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the console line never began {start!r}: {sink.console_texts}")


def test_a_rank_paused_in_jupyterlabs_debugger_is_said_to_be_and_the_cell_goes_on(
    session: Session, tmp_path: Path
) -> None:
    """A console's debugger holds rank 1 at a breakpoint: the notebook's cell runs on rank
    0 at once and says rank 1 is paused in the debugger (not hung), and runs on rank 1
    once the debugger lets it continue; the debugger breaks nothing of the notebook's. A
    breakpoint in a file the notebook's cell calls pauses rank 1 in the cell itself, which
    says so the same way."""
    code = "a = 6\nb = a * 7\nprint('console b', b)"
    module = tmp_path / "halved.py"
    module.write_text("def halved(x):\n    y = x / 2\n    return y\n")

    async def scenario() -> tuple[list[str], str]:
        await session.start()
        console = console_on(session, 1)
        debug = ConsoleDebugger(console)
        try:
            await debug.request("initialize", {"adapterID": "python", "pathFormat": "path"})
            await debug.request("attach", {})
            path = (await debug.request("dumpCell", {"code": code}))["sourcePath"]
            arguments = {"source": {"path": path}, "breakpoints": [{"line": 3}]}
            await debug.request("setBreakpoints", arguments)
            await debug.request("configurationDone")
            console.execute(code)
            thread = (await debug.event("stopped"))["threadId"]
            sink = NoticeSink()
            cell = asyncio.ensure_future(
                session.execute("import os; print('cell on', os.environ['RANK'])", sink=sink)
            )
            said = await wait_for_text(sink, "rank 1 is paused in JupyterLab's debugger")
            assert not cell.done()
            await debug.request("continue", {"threadId": thread})
            result = await asyncio.wait_for(cell, 60)
            assert not result.failures, result
            # a breakpoint in a module the notebook's cell calls: rank 1 stops in the cell
            arguments = {"source": {"path": str(module)}, "breakpoints": [{"line": 3}]}
            await debug.request("setBreakpoints", arguments)
            cell = asyncio.ensure_future(
                session.execute(
                    f"import os, sys; sys.path.insert(0, {str(tmp_path)!r})\n"
                    "import halved; print('half', halved.halved(int(os.environ['RANK']) + 1))",
                    sink=sink,
                )
            )
            thread = (await debug.event("stopped"))["threadId"]
            sink.console_texts.clear()
            again = await wait_for_text(sink, "rank 1 is paused in JupyterLab's debugger")
            assert not cell.done()
            await debug.request("continue", {"threadId": thread})
            result = await asyncio.wait_for(cell, 60)
            assert not result.failures, result
            printed = ""
            while not sink.empty():
                event = sink.get()
                if isinstance(event, StreamOut):
                    printed += f"[{event.rank}] {event.text}"
            await debug.request("disconnect", {"restart": False, "terminateDebuggee": False})
            return [said, again], printed
        finally:
            console.stop_channels()
            await session.shutdown()

    said, printed = asyncio.run(scenario())
    for text in said:
        assert "not hung: Continue in the debugger lets it go on" in text, said
    assert sorted(printed.splitlines()) == [
        "[0] cell on 0",
        "[0] half 0.5",
        "[1] cell on 1",
        "[1] half 1.0",
    ], printed
