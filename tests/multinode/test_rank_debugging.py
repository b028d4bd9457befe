"""A breakpoint on a rank of another node: its debugger's prompts reach the notebook's input
box over the SSH connection that carries the rank's other channels, and JupyterLab's visual
debugger on a console of that rank works over the same connection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.integration.debug_protocol import DebugClient
from tests.integration.server_process import API, start_server, stop_server
from tests.integration.stdin_frontend import stdin_frontend

from .test_ssh_sessions import flags

pytestmark = pytest.mark.slow


def test_a_breakpoint_on_rank_1_of_the_other_node(
    cluster: Any, kernel_name: str, tmp_path: Path
) -> None:
    with stdin_frontend(kernel_name, tmp_path) as nb:
        started = nb.run(
            f"%%distributed --session dbg {flags(cluster)} --procs 1\n"
            "import os, socket\nimport torch\nimport torch.distributed as dist\n"
            "rank = int(os.environ['RANK'])"
        )
        assert started.reply["status"] == "ok", started.text
        run = nb.run(
            "%%distributed --session dbg\n"
            "here = socket.gethostname()\n"
            "if rank == 1:\n    breakpoint()\n    seen = here\nelse:\n    seen = here\n"
            "total = torch.tensor([1.0])\ndist.all_reduce(total)\nprint('sum', total.item())",
            ["p here", "n", "p seen", "c"],
        )
        assert run.reply["status"] == "ok", run.text
        assert [p.text for p in run.prompts] == ["[rank 1] ipdb> "] * 4
        assert f"[rank 1] {cluster.hosts[1]!r}" in run.text
        assert "[ranks 0-1] sum 2.0" in run.text
        assert nb.run("%dist shutdown --session dbg").reply["status"] == "ok"


def test_jupyterlabs_debugger_on_a_console_of_a_rank_of_the_other_node(
    cluster: Any, tmp_path: Path
) -> None:
    """The visual debugger's messages reach a rank of another node through the server's
    websocket and the SSH connection that carries the rank's channels: a breakpoint in a
    console cell pauses it there, with the other node's variables, until continue."""
    server = start_server(
        tmp_path,
        tmp_path / "config",
        args=(
            f"--DistServerApp.default_hosts={','.join(cluster.hosts)}",
            f"--DistServerApp.ssh_config={cluster.config_path}",
        ),
    )
    cell = "import socket\nhere = socket.gethostname()\nprint('on', here)"

    async def go(kernel_id: str) -> None:
        url = server.url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels"
        request = HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
        debug = DebugClient(await websocket_connect(request))
        assert "debugger" in (await debug.kernel_info()).get("supported_features", [])
        await debug.start()
        await debug.break_in_cell(cell, 3)
        run = debug.execute(cell)
        thread, frame = await debug.paused_frame()
        assert frame["line"] == 3, frame
        assert (await debug.local_variables(frame["id"]))["here"] == repr(cluster.hosts[1])
        await debug.request("continue", {"threadId": thread})
        assert (await debug.reply_of(run, "execute_reply"))["content"]["status"] == "ok"
        await debug.stop()
        debug.ws.close()

    try:
        status, created = server.call("POST", f"{API}/sessions", {"name": "far", "procs": 1})
        assert status == 201, created
        assert [r["host"] for r in created["ranks"]] == list(cluster.hosts), created
        status, kernel = server.call("POST", f"{API}/sessions/far/ranks/1/kernel", {})
        assert status == 201, kernel
        asyncio.run(go(str(kernel["id"])))
    finally:
        stop_server(server)
