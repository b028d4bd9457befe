"""The magic in notebook kernels that a real Jupyter server started: the server owns the
sessions, the kernels attach to them, and the sessions outlive the kernels."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from jupyter_dist.server_client.discovery import notebook_session_name
from tests.conftest import wait_until_ready

from .server_process import API, Server, start_server, stop_server

pytestmark = pytest.mark.slow
CELL_TIMEOUT = 180
NOTEBOOK = "exp/train.ipynb"
#: ``exp-train-`` and a hash of the path: a notebook's session is named after it
NAME = notebook_session_name({"JPY_SESSION_NAME": NOTEBOOK}) or ""


class ServerKernel:
    """A notebook's kernel, started through the server's sessions API like JupyterLab does."""

    def __init__(self, server: Server, path: str, kernel_name: str) -> None:
        self.server = server
        status, reply = server.call(
            "POST",
            "/api/sessions",
            {"path": path, "type": "notebook", "kernel": {"name": kernel_name}},
        )
        assert status == 201, reply
        self.id = reply["kernel"]["id"]
        self.kc = self._connect()

    def _connect(self) -> BlockingKernelClient:
        kc = BlockingKernelClient(
            connection_file=str(self.server.runtime_dir / f"kernel-{self.id}.json")
        )
        kc.load_connection_file()
        kc.start_channels()
        wait_until_ready(kc)
        return kc

    def run(self, code: str, timeout: float = CELL_TIMEOUT) -> tuple[str, dict[str, Any]]:
        """Run a cell; return everything it printed or raised, and the reply."""
        text: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                text.append("\n".join(content["traceback"]))
            elif kind in ("execute_result", "display_data"):
                text.append(content["data"].get("text/plain", "") + "\n")

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return re.sub(r"\x1b\[[0-9;]*m", "", "".join(text)), reply["content"]

    def ok(self, code: str) -> str:
        out, reply = self.run(code)
        assert reply["status"] == "ok", out
        return out

    def pid(self) -> int:
        return int(self.ok("import os; print(os.getpid())").strip())

    def restart(self) -> None:
        self.kc.stop_channels()
        status, _ = self.server.call("POST", f"/api/kernels/{self.id}/restart", {})
        assert status == 200
        self.kc = self._connect()

    def close(self) -> None:
        self.kc.stop_channels()
        self.server.call("DELETE", f"/api/kernels/{self.id}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kernel_name: str) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("server-kernels")
    (root / "exp").mkdir()
    # the kernels print text (these tests read streams; the widget view has its own tests)
    running = start_server(root, root / "config", extra_env={"JUPYTER_DIST_OUTPUT": "text"})
    yield running
    ours = running.descendants()  # this server's agents and ranks, not other servers'
    stop_server(running)
    assert not [p for p in ours if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def notebook(server: Server, kernel_name: str) -> Iterator[ServerKernel]:
    kernel = ServerKernel(server, NOTEBOOK, kernel_name)
    yield kernel
    kernel.close()


def sessions(server: Server) -> list[dict[str, Any]]:
    status, found = server.call("GET", f"{API}/sessions")
    assert status == 200
    return list(found)


def rank_pids(server: Server, name: str) -> list[int]:
    status, found = server.call("GET", f"{API}/sessions/{name}")
    assert status == 200, found
    return [r["pid"] for r in found["ranks"]]


def test_server_owns_the_session_and_it_survives_a_kernel_restart(
    server: Server, notebook: ServerKernel, kernel_name: str
) -> None:
    notebook.ok("%load_ext jupyter_dist")
    out = notebook.ok(
        "%%distributed --procs 2\n"
        "import os, torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "x = int(os.environ['RANK']) * 10\n"
        "print('sum', t.item(), 'cwd', os.path.basename(os.getcwd()))\n"
    )
    assert "[ranks 0-1] sum 2.0 cwd exp" in out, out
    # the cell that started it says where to look at it
    pointer = "sessions, ranks and their logs: the Distributed sidebar (View > Show distributed"
    assert out.count(pointer) == 1, out
    # the server owns it, named after the notebook; no rank is a child of the kernel
    (listed,) = sessions(server)
    assert (listed["name"], listed["state"], listed["world_size"]) == (NAME, "ready", 2)
    pids = rank_pids(server, NAME)
    kernel_pid = notebook.pid()
    assert not set(pids) & {p.pid for p in psutil.Process(kernel_pid).children(recursive=True)}
    status = notebook.ok("%dist status")
    assert f"sessions run in the Jupyter server at {server.url}" in status, status
    assert f"this notebook's session: {NAME!r}" in status

    notebook.restart()  # a new kernel process; the ranks and their variables live on
    assert notebook.pid() != kernel_pid
    notebook.ok("%load_ext jupyter_dist")
    out = notebook.ok("%%distributed\nprint('x is', x)")
    assert "[rank 0] x is 0" in out and "[rank 1] x is 10" in out, out
    assert pointer not in out  # said when it starts only
    assert rank_pids(server, NAME) == pids

    # asking for another shape names the running one
    out, reply = notebook.run("%%distributed --procs 3\nprint(1)")
    assert reply["status"] == "error"
    assert f"session {NAME!r} is running 2 CPU ranks (gloo)" in out, out

    notebook.ok("%dist shutdown")
    assert sessions(server) == []
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie" for p in pids)


def test_another_notebook_attaches_and_sees_rank_deaths(
    server: Server, notebook: ServerKernel, kernel_name: str
) -> None:
    notebook.ok("%load_ext jupyter_dist")
    notebook.ok(
        "%%distributed --procs 2 --session shared\nimport os\ny = int(os.environ['RANK']) + 100"
    )
    other = ServerKernel(server, "other.ipynb", kernel_name)
    try:
        other.ok("%load_ext jupyter_dist")
        out, reply = other.run("%dist attach nosuch")
        assert reply["status"] == "error" and "no session named 'nosuch'" in out, out
        out = other.ok("%dist attach shared")
        assert "attached to session 'shared' (2 CPU ranks (gloo), ready)" in out, out
        out = other.ok("%%distributed\nprint('y', y)")
        assert "[rank 0] y 100" in out and "[rank 1] y 101" in out, out

        # a rank dies in the other notebook's cell: the server reports exit code and rank
        out, reply = other.run("%%distributed --ranks 1\nimport os; os._exit(3)", timeout=60)
        assert reply["status"] == "error"
        assert "rank 1" in out and "exit code 3" in out, out
        # the first notebook's next cell has the server replace rank 1 alone
        out = notebook.ok("%%distributed --session shared\nprint('y', globals().get('y'))")
        assert "rank 1 replaced by a fresh rank kernel: rank 1 died (exit code 3)" in " ".join(
            out.split()
        ), out
        assert "[rank 0] y 100" in out and "[rank 1] y None" in out, out
        out = other.ok("%%distributed\nprint('y', globals().get('y'))")  # on the new ranks
        assert "[rank 0] y 100" in out and "[rank 1] y None" in out, out

        # restarting from the first notebook gives the other one fresh ranks too
        out = notebook.ok("%dist restart --session shared")
        assert "restarted" in out, out
        out = other.ok(
            "%%distributed\nimport torch, torch.distributed as dist\n"
            "t = torch.ones(1); dist.all_reduce(t); print('sum', t.item())"
        )
        assert "[ranks 0-1] sum 2.0" in out, out
    finally:
        other.close()
    notebook.ok("%dist shutdown --session shared")
    assert sessions(server) == []


def test_interrupt_from_the_notebook_reaches_server_owned_ranks(
    server: Server, notebook: ServerKernel
) -> None:
    notebook.ok("%load_ext jupyter_dist")
    notebook.ok("%%distributed --procs 2 --session slow\nimport time")
    msg_id = notebook.kc.execute(
        "%%distributed --session slow\nimport os\nprint('sleeping', os.environ['RANK'], flush=True)"
        "\ntime.sleep(120)"
    )
    heard, deadline = "", time.monotonic() + 60
    while not ("sleeping 0" in heard and "sleeping 1" in heard):  # both ranks in the sleep
        assert time.monotonic() < deadline, f"the ranks did not start the cell: {heard!r}"
        msg = notebook.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            heard += msg["content"]["text"]
    began = time.monotonic()
    status, _ = server.call("POST", f"/api/kernels/{notebook.id}/interrupt", {})
    assert status == 204
    while True:
        reply = notebook.kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "error"
    assert time.monotonic() - began < 20
    out = notebook.ok("%%distributed --session slow\nprint('alive')")
    assert "[ranks 0-1] alive" in out, out
    out = notebook.ok("%dist stacks --session slow")  # asked of the server's agents
    assert "ranks 0-1: idle (waiting for a cell)" in out, out
    notebook.ok("%dist shutdown --session slow")


def test_killed_kernel_leaves_the_session_for_the_next_one(
    server: Server, notebook: ServerKernel, kernel_name: str
) -> None:
    notebook.ok("%load_ext jupyter_dist")
    notebook.ok("%%distributed --procs 2 --session keep\nz = 7")
    os.kill(notebook.pid(), signal.SIGKILL)
    time.sleep(1)
    assert [s["name"] for s in sessions(server)] == ["keep"]
    fresh = ServerKernel(server, "fresh.ipynb", kernel_name)
    try:
        fresh.ok("%load_ext jupyter_dist")
        out = fresh.ok("%%distributed --session keep\nprint('z', z)")
        assert "[ranks 0-1] z 7" in out, out
        fresh.ok("%dist shutdown --session keep")
    finally:
        fresh.close()


def test_a_server_without_the_extension_leaves_sessions_in_the_kernel(
    tmp_path: Path, kernel_name: str
) -> None:
    plain = start_server(
        tmp_path, tmp_path / "config", extension=False, extra_env={"JUPYTER_DIST_OUTPUT": "text"}
    )
    try:
        kernel = ServerKernel(plain, "nb.ipynb", kernel_name)
        kernel.ok("%load_ext jupyter_dist")
        out = kernel.ok("%%distributed --procs 1\nprint('ran')\n")
        assert "[rank 0] ran" in out, out
        out = kernel.ok("%dist status")
        assert "sessions run in this process" in out and "does not serve them" in out, out
        kernel.close()
    finally:
        stop_server(plain)
