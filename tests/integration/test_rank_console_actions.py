"""A console on a rank kernel, through a real `jupyter server` with token auth: the
kernels API's interrupt reaches that rank alone, its restart is refused saying why (no
kernel process is started for it), a session restart leaves the old kernel clearly gone
and the rank's new kernel usable, and a collective typed in the console is refused unrun."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from jupyter_dist.rank.console_guard import ALLOW

from .debug_protocol import DebugClient, send_message
from .server_process import API, Server, start_server, stop_server, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("consoles")
    running = start_server(root, root / "config")
    yield running
    stop_server(running)


@pytest.fixture
def session(server: Server) -> Iterator[str]:
    status, created = server.call("POST", f"{API}/sessions", {"name": "consoled", "procs": 2})
    assert status == 201, created
    yield "consoled"
    assert server.call("DELETE", f"{API}/sessions/consoled")[0] == 204


class Console:
    """A websocket on a server's kernel, as a JupyterLab console holds it."""

    def __init__(self, ws: WebSocketClientConnection) -> None:
        self.ws = ws
        self.session = uuid.uuid4().hex
        self.seen: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, server: Server, kernel_id: str) -> Console:
        url = server.url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels"
        request = HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
        return cls(await websocket_connect(request))

    def execute(self, code: str) -> str:
        content = {"code": code, "silent": False, "store_history": True}
        return send_message(self.ws, self.session, "execute_request", content, "shell")

    async def until(self, msg_id: str, msg_type: str, state: str = "") -> list[dict[str, Any]]:
        """The messages of request ``msg_id`` until one of ``msg_type`` (a ``status`` of
        ``state``) came; 120 s at most."""
        mine: list[dict[str, Any]] = [
            m for m in self.seen if m["parent_header"].get("msg_id") == msg_id
        ]
        while not any(_is(m, msg_type, state) for m in mine):
            raw = await asyncio.wait_for(self.ws.read_message(), 120)
            assert raw is not None, "the websocket closed"
            msg = json.loads(raw)
            self.seen.append(msg)
            if msg["parent_header"].get("msg_id") == msg_id:
                mine.append(msg)
        return mine

    async def run(self, code: str) -> list[dict[str, Any]]:
        """Everything ``code`` produced, up to the kernel's idle after it."""
        msg_id = self.execute(code)
        await self.until(msg_id, "execute_reply")
        return await self.until(msg_id, "status", "idle")


def _is(msg: dict[str, Any], msg_type: str, state: str) -> bool:
    if msg["msg_type"] != msg_type:
        return False
    return not state or msg["content"].get("execution_state") == state


def printed(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def errors(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (m["content"]["ename"], m["content"]["evalue"])
        for m in messages
        if m["msg_type"] == "error"
    ]


def rank_kernel(server: Server, session: str, rank: int) -> str:
    status, kernel = server.call("POST", f"{API}/sessions/{session}/ranks/{rank}/kernel", {})
    assert status == 201, kernel
    return str(kernel["id"])


def kernel_processes(server: Server) -> set[int]:
    """The server's children that are kernels of its own (not our agents and ranks)."""
    found = set()
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if "ipykernel" in " ".join(proc.cmdline()) and "jupyter_dist" not in " ".join(
                proc.cmdline()
            ):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def test_interrupt_by_the_kernels_api_stops_that_rank_alone(
    server: Server, session: str, tmp_path: Path
) -> None:
    zero, one = rank_kernel(server, session, 0), rank_kernel(server, session, 1)
    go_on = tmp_path / "go-on"  # rank 0's code runs until rank 1 was interrupted

    async def go() -> None:
        c0, c1 = await Console.open(server, zero), await Console.open(server, one)
        slow = c1.execute("import time; time.sleep(60)")
        await c1.until(slow, "execute_input")  # rank 1 runs it now
        short = c0.execute(
            "import os, time\nuntil = time.monotonic() + 120\n"
            f"while not os.path.exists({str(go_on)!r}):\n"
            "    assert time.monotonic() < until, 'the test never let rank 0 go on'\n"
            "    time.sleep(0.05)\n"
            "print('rank 0 slept')"
        )
        await c0.until(short, "execute_input")
        try:
            status, reply = await asyncio.to_thread(
                server.call, "POST", f"/api/kernels/{one}/interrupt", {}
            )
            assert status == 204, reply
            stopped = await c1.until(slow, "status", "idle")
            assert [name for name, _ in errors(stopped)] == ["KeyboardInterrupt"], stopped
        finally:
            go_on.touch()
        untouched = await c0.until(short, "status", "idle")
        assert errors(untouched) == [] and printed(untouched) == "rank 0 slept\n"
        # the rank goes on as before
        assert printed(await c1.run("import os; print(os.environ['RANK'])")) == "1\n"
        c0.ws.close()
        c1.ws.close()

    asyncio.run(go())

    def states() -> set[str]:
        ranks = server.call("GET", f"{API}/sessions/{session}")[1]["ranks"]
        return {r["state"] for r in ranks}

    # the session hears the consoles' ends through its own channel: polled, not at once
    wait_for(lambda: states() == {"idle"}, 30, "every rank idle again", poll=0.1)


def test_a_ranks_restart_by_the_kernels_api_is_refused_saying_why_and_starts_nothing(
    server: Server, session: str
) -> None:
    kernel = rank_kernel(server, session, 1)
    before = server.call("GET", f"{API}/sessions/{session}")[1]
    kernels_before = kernel_processes(server)
    status, reply = server.call("POST", f"/api/kernels/{kernel}/restart", {})
    assert status == 409, reply
    assert f"rank 1 of the distributed session {session!r}" in reply["message"]
    assert "restarts all 2 ranks" in reply["message"] and "%dist restart" in reply["message"]
    assert kernel_processes(server) == kernels_before  # no kernel process of its own
    after = server.call("GET", f"{API}/sessions/{session}")[1]
    assert [r["pid"] for r in after["ranks"]] == [r["pid"] for r in before["ranks"]]

    async def go() -> None:
        console = await Console.open(server, kernel)
        assert printed(await console.run("print(6 * 7)")) == "42\n"
        console.ws.close()

    asyncio.run(go())


def test_after_a_session_restart_the_old_kernel_is_gone_and_the_new_one_runs(
    server: Server, session: str
) -> None:
    old = rank_kernel(server, session, 1)
    assert server.call("POST", f"{API}/sessions/{session}/restart", {})[0] == 200
    status, reply = server.call("POST", f"/api/kernels/{old}/interrupt", {})
    assert status == 404, reply
    new = rank_kernel(server, session, 1)
    assert new != old

    async def go() -> None:
        console = await Console.open(server, new)
        slow = console.execute("import time; time.sleep(60)")
        await console.until(slow, "execute_input")
        status, reply = await asyncio.to_thread(
            server.call, "POST", f"/api/kernels/{new}/interrupt", {}
        )
        assert status == 204, reply
        stopped = await console.until(slow, "status", "idle")
        assert [name for name, _ in errors(stopped)] == ["KeyboardInterrupt"], stopped
        console.ws.close()

    asyncio.run(go())


def test_a_collective_in_a_console_is_refused_unrun_unless_allowed(
    server: Server, session: str
) -> None:
    zero, one = rank_kernel(server, session, 0), rank_kernel(server, session, 1)

    async def go() -> None:
        c0, c1 = await Console.open(server, zero), await Console.open(server, one)
        refused = await c1.run("import torch.distributed as dist\nran = 1\ndist.barrier()")
        [(name, why)] = errors(refused)
        assert name == "CollectiveInConsole"
        assert why.startswith("line 3: dist.barrier() is a collective"), why
        assert "rank 1 alone" in why and "the other rank is not" in why and ALLOW in why
        # nothing of it ran, and the rank is free
        assert errors(after := await c1.run("print('ran' in dir())")) == [], after
        assert printed(after) == "False\n"
        # both ranks' consoles allow it: the barrier meets and both go on
        code = f"{ALLOW}\nimport torch.distributed as dist\ndist.barrier()\nprint('met')"
        first, second = c0.execute(code), c1.execute(code)
        done0 = await c0.until(first, "status", "idle")
        done1 = await c1.until(second, "status", "idle")
        assert printed(done0) == printed(done1) == "met\n", (done0, done1)
        c0.ws.close()
        c1.ws.close()

    asyncio.run(go())
    status, logged = server.call(
        "GET", f"{API}/sessions/{session}/ranks/1/log?kind=output"
    )  # what it showed
    assert status == 200 and "CollectiveInConsole" in json.dumps(logged), logged


def test_jupyterlabs_debugger_pauses_a_rank_console_cell_at_its_breakpoint(
    server: Server, session: str, tmp_path: Path
) -> None:
    """The Debug Adapter Protocol as JupyterLab drives it, through the server's websocket:
    the rank advertises its debugger, a breakpoint in a console cell pauses rank 1 there
    with its variables and stack, rank 0 runs on meanwhile, and continue ends the cell; a
    breakpoint in a file the rank imports pauses it there, and a step goes on a line."""
    zero, one = rank_kernel(server, session, 0), rank_kernel(server, session, 1)
    cell = "a = 6\nb = a * 7\nprint('b is', b)"

    async def go() -> None:
        ws = (await Console.open(server, one)).ws
        debug = DebugClient(ws)
        info = await debug.kernel_info()
        assert "debugger" in info.get("supported_features", []), info
        await debug.start()
        await debug.break_in_cell(cell, 3)
        run = debug.execute(cell)
        thread, frame = await debug.paused_frame()
        assert frame["line"] == 3, frame
        assert (await debug.local_variables(frame["id"]))["b"] == "42"
        # the other rank is not held by rank 1's pause
        c0 = await Console.open(server, zero)
        assert printed(await c0.run("print('rank 0 runs')")) == "rank 0 runs\n"
        await debug.request("continue", {"threadId": thread})
        await debug.event("continued", thread)  # the paused thread goes on
        reply = await debug.reply_of(run, "execute_reply")
        assert reply["content"]["status"] == "ok", reply

        module = tmp_path / "scaled.py"
        module.write_text("def scaled(x):\n    y = x * 2\n    z = y + 1\n    return z\n")
        found = await debug.request(
            "setBreakpoints",
            {"source": {"path": str(module)}, "breakpoints": [{"line": 2}]},
        )
        assert [b.get("verified") for b in found["breakpoints"]] == [True], found
        run = debug.execute(
            f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
            "import scaled\nprint('scaled', scaled.scaled(20))"
        )
        thread, frame = await debug.paused_frame()
        assert (frame["source"]["path"], frame["line"]) == (str(module), 2), frame
        await debug.request("next", {"threadId": thread})
        thread, frame = await debug.paused_frame()
        assert frame["line"] == 3, frame
        assert (await debug.local_variables(frame["id"]))["y"] == "40"
        await debug.request("continue", {"threadId": thread})
        reply = await debug.reply_of(run, "execute_reply")
        assert reply["content"]["status"] == "ok", reply
        await debug.stop()
        # without the debugger the cell runs through
        assert printed(await Console(ws).run(cell)) == "b is 42\n"
        ws.close()
        c0.ws.close()

    asyncio.run(go())
