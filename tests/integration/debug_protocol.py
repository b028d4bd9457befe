"""JupyterLab's visual debugger, as a test drives it: the Debug Adapter Protocol carried in
``debug_request`` (control channel) and ``debug_reply``/``debug_event`` (control, IOPub)
messages over a kernel's websocket, in the order JupyterLab sends them."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from tornado.websocket import WebSocketClientConnection

#: seconds one request, or an event the test waits for, may take on a loaded machine
WAIT_S = 120.0


def send_message(
    ws: WebSocketClientConnection,
    session: str,
    msg_type: str,
    content: dict[str, Any],
    channel: str,
) -> str:
    """One Jupyter message on a kernel's websocket, as a frontend of ``session`` writes it;
    its id."""
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": msg_type,
        "username": "test",
        "session": session,
        "version": "5.3",
        "date": "2026-01-01T00:00:00Z",
    }
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
    ws.write_message(json.dumps({**message, "channel": channel, "buffers": []}))
    return msg_id


class DebugClient:
    """A frontend on one kernel's websocket: shell requests and the debugger's."""

    def __init__(self, ws: WebSocketClientConnection) -> None:
        self.ws = ws
        self.session = uuid.uuid4().hex
        self.seq = 0
        self.seen: list[dict[str, Any]] = []

    def send(self, msg_type: str, content: dict[str, Any], channel: str) -> str:
        return send_message(self.ws, self.session, msg_type, content, channel)

    async def next_message(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.read_message(), WAIT_S)
        assert raw is not None, "the kernel's websocket closed"
        assert isinstance(raw, str), f"expected a JSON text message, got {raw[:80]!r}"
        msg: dict[str, Any] = json.loads(raw)
        self.seen.append(msg)
        return msg

    async def wait(self, match: Any, what: str) -> dict[str, Any]:
        """The first message (seen already or coming) that ``match`` takes; ``what`` names
        it when none comes within `WAIT_S`."""
        for msg in self.seen:
            if match(msg):
                self.seen.remove(msg)
                return msg
        try:
            while True:
                msg = await self.next_message()
                if match(msg):
                    self.seen.remove(msg)
                    return msg
        except TimeoutError:
            kinds = [m["msg_type"] for m in self.seen][-20:]
            raise AssertionError(f"no {what} within {WAIT_S} s; last seen: {kinds}") from None

    async def request(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """A DAP request's successful reply (its ``body``); a failed one fails the test."""
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command}
        if arguments is not None:
            content["arguments"] = arguments
        msg_id = self.send("debug_request", content, "control")
        reply = await self.wait(
            lambda m: m["msg_type"] == "debug_reply" and m["parent_header"].get("msg_id") == msg_id,
            f"debug_reply to {command}",
        )
        body = reply["content"]
        assert body.get("success"), f"debugger request {command} failed: {body}"
        return body.get("body", {})

    async def event(self, name: str, thread: int | None = None) -> dict[str, Any]:
        """The next ``debug_event`` named ``name`` (on IOPub), its ``body``; with ``thread``,
        the next of that thread's (or of all threads'): debugpy tells of its other threads
        too."""

        def wanted(m: dict[str, Any]) -> bool:
            if m["msg_type"] != "debug_event" or m["content"].get("event") != name:
                return False
            body = m["content"].get("body") or {}
            return (
                thread is None
                or body.get("threadId") == thread
                or bool(body.get("allThreadsContinued"))
            )

        msg = await self.wait(wanted, f"debug_event {name!r}")
        return dict(msg["content"].get("body", {}))

    def execute(self, code: str) -> str:
        return self.send(
            "execute_request",
            {"code": code, "silent": False, "store_history": True, "allow_stdin": False},
            "shell",
        )

    async def reply_of(self, msg_id: str, msg_type: str) -> dict[str, Any]:
        return await self.wait(
            lambda m: m["msg_type"] == msg_type and m["parent_header"].get("msg_id") == msg_id,
            f"{msg_type} of request {msg_id}",
        )

    async def kernel_info(self) -> dict[str, Any]:
        msg_id = self.send("kernel_info_request", {}, "shell")
        return dict((await self.reply_of(msg_id, "kernel_info_reply"))["content"])

    async def start(self) -> None:
        """What JupyterLab sends as its debugger is turned on in a console."""
        await self.request(
            "initialize",
            {
                "clientID": "jupyterlab",
                "clientName": "JupyterLab",
                "adapterID": "python",
                "pathFormat": "path",
                "linesStartAt1": True,
                "columnsStartAt1": True,
                "supportsVariableType": True,
                "supportsVariablePaging": True,
                "supportsRunInTerminalRequest": True,
                "locale": "en",
            },
        )
        await self.request("attach", {})
        await self.request("configurationDone")

    async def stop(self) -> None:
        await self.request("disconnect", {"restart": False, "terminateDebuggee": False})

    async def break_in_cell(self, code: str, line: int) -> str:
        """A breakpoint at ``line`` (from 1) of the cell ``code``: the file the kernel
        runs it as."""
        path = str((await self.request("dumpCell", {"code": code}))["sourcePath"])
        found = await self.request(
            "setBreakpoints",
            {"source": {"path": path}, "breakpoints": [{"line": line}], "sourceModified": False},
        )
        assert [b.get("verified") for b in found["breakpoints"]] == [True], found
        return path

    async def paused_frame(self) -> tuple[int, dict[str, Any]]:
        """The thread a ``stopped`` event names, and its top frame."""
        stopped = await self.event("stopped")
        thread = int(stopped["threadId"])
        frames = (await self.request("stackTrace", {"threadId": thread}))["stackFrames"]
        assert frames, f"thread {thread} stopped without a frame: {stopped}"
        return thread, dict(frames[0])

    async def local_variables(self, frame_id: int) -> dict[str, str]:
        scopes = (await self.request("scopes", {"frameId": frame_id}))["scopes"]
        local = next(s for s in scopes if s["name"] == "Locals")
        found = await self.request("variables", {"variablesReference": local["variablesReference"]})
        return {v["name"]: v["value"] for v in found["variables"]}
