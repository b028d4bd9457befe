"""A session follows its notebook through a real Jupyter server with auth: renamed (the
contents API, then the session's path, as JupyterLab does), even while a cell runs, it is
named by the new path everywhere, and the notebook's kernel, restarted, finds it again
with the ranks' variables; a session the notebook used that was shut down is said, and
one that lost a rank gets it replaced, the others keeping their variables."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_dist.server_client.discovery import notebook_session_name

from .server_process import API, Server, serving_text_output
from .test_server_kernels import CELL_TIMEOUT, ServerKernel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving_text_output(tmp_path_factory.mktemp("renames")) as running:
        yield running


def root_of(server: Server) -> Path:
    return server.runtime_dir.parent


def new_notebook(server: Server, path: str, kernel_name: str) -> ServerKernel:
    """A notebook file at ``path`` and its kernel, as the Launcher makes them."""
    nbformat.write(nbformat.v4.new_notebook(), root_of(server) / path)
    kernel = ServerKernel(server, path, kernel_name)
    kernel.ok("%load_ext jupyter_dist")
    return kernel


def rename(server: Server, kernel: ServerKernel, old: str, new: str) -> None:
    """What JupyterLab does for File > Rename: the file, then the notebook's session."""
    status, reply = server.call("PATCH", f"/api/contents/{old}", {"path": new})
    assert status == 200, reply
    status, found = server.call("GET", "/api/sessions")
    assert status == 200
    (session_id,) = [s["id"] for s in found if s["kernel"]["id"] == kernel.id]
    status, reply = server.call("PATCH", f"/api/sessions/{session_id}", {"path": new})
    assert status == 200, reply


def session(server: Server, name: str) -> dict[str, Any]:
    status, found = server.call("GET", f"{API}/sessions/{name}")
    assert status == 200, found
    return dict(found)


def names(server: Server) -> list[str]:
    status, found = server.call("GET", f"{API}/sessions")
    assert status == 200
    return [s["name"] for s in found]


def test_a_renamed_notebook_finds_its_session_after_a_kernel_restart(
    server: Server, kernel_name: str
) -> None:
    notebook = new_notebook(server, "Untitled.ipynb", kernel_name)
    try:
        notebook.ok("%%distributed --procs 2\nimport os\nx = int(os.environ['RANK']) * 10")
        name = notebook_session_name({"JPY_SESSION_NAME": "Untitled.ipynb"})
        assert names(server) == [name]
        before = session(server, name)
        assert before["notebook"] == "Untitled.ipynb"
        pids = [r["pid"] for r in before["ranks"]]

        # renamed while a cell runs: the cell goes on, everything names the new path
        go = root_of(server) / "go"
        msg_id = notebook.kc.execute(
            "%%distributed\nimport os, time\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('went')"
        )
        deadline = time.monotonic() + CELL_TIMEOUT
        while session(server, name)["running"] is None:
            assert time.monotonic() < deadline, "the cell never took its turn"
            time.sleep(0.1)
        rename(server, notebook, "Untitled.ipynb", "train.ipynb")
        during = session(server, name)
        assert during["notebook"] == "train.ipynb"
        assert during["running"]["path"] == "train.ipynb", during["running"]
        assert [n["path"] for n in during["notebooks"]] == ["train.ipynb"]
        go.touch()
        while True:
            reply = notebook.kc.get_shell_msg(timeout=CELL_TIMEOUT)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "ok", reply["content"]
        # the kernel still names its old path; the server knows the notebook's new one
        notebook.ok("%%distributed\nprint('still', x)")
        assert [n["path"] for n in session(server, name)["notebooks"]] == ["train.ipynb"]

        notebook.restart()  # JPY_SESSION_NAME is train.ipynb now
        notebook.ok("%load_ext jupyter_dist")
        out = notebook.ok("%%distributed\nprint('x is', x)")
        assert "[rank 0] x is 0" in out and "[rank 1] x is 10" in out, out
        assert f"attached to session {name!r}, which was already running" in out, out
        assert "its ranks kept their variables" in out, out
        assert names(server) == [name]  # no second session beside it
        after = session(server, name)
        assert [r["pid"] for r in after["ranks"]] == pids
        assert after["notebook"] == "train.ipynb"
        assert f"this notebook's session: {name!r}" in notebook.ok("%dist status")
        # said once: the next cell is a plain cell
        out = notebook.ok("%%distributed\nprint('again')")
        assert "already running" not in out, out
        notebook.ok("%dist shutdown")
        assert names(server) == []
    finally:
        notebook.close()


def test_a_session_this_notebook_used_that_was_shut_down_is_pointed_out(
    server: Server, kernel_name: str
) -> None:
    notebook = new_notebook(server, "lost.ipynb", kernel_name)
    try:
        notebook.ok("%%distributed --procs 1\ny = 5")
        (name,) = names(server)
        # stopped from the sidebar while the notebook's kernel restarts
        status, _ = server.call("DELETE", f"{API}/sessions/{name}?path=JupyterLab")
        assert status == 204
        notebook.restart()
        notebook.ok("%load_ext jupyter_dist")
        out = notebook.ok("%%distributed --procs 1\nprint('y' in dir())")
        assert f"session {name!r} was shut down from JupyterLab; its variables are gone" in out
        assert f"this notebook's new session is {name!r}" in out, out
        assert "[rank 0] False" in out, out
        out = notebook.ok("%%distributed\nprint(1)")
        assert "shut down" not in out, out
        notebook.ok("%dist shutdown")
    finally:
        notebook.close()


def test_a_session_a_renamed_notebook_used_that_lost_a_rank_is_found_and_healed(
    server: Server, kernel_name: str
) -> None:
    notebook = new_notebook(server, "broke.ipynb", kernel_name)
    try:
        notebook.ok("%%distributed --procs 2\nimport os\ny = 5 + int(os.environ['RANK'])")
        (name,) = names(server)
        rename(server, notebook, "broke.ipynb", "fixed.ipynb")
        pids = [r["pid"] for r in session(server, name)["ranks"]]
        os.kill(pids[1], 9)
        deadline = time.monotonic() + CELL_TIMEOUT
        while session(server, name)["state"] != "degraded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert session(server, name)["faults"] == ["rank 1 died (killed by signal SIGKILL (9))"]
        notebook.restart()
        notebook.ok("%load_ext jupyter_dist")
        out = notebook.ok(
            "%%distributed\nimport torch, torch.distributed as dist\n"
            "t = torch.ones(1); dist.all_reduce(t); print(globals().get('y'), t.item())"
        )
        flat = " ".join(out.split())
        assert "rank 1 replaced by a fresh rank kernel: rank 1 died (killed by signal" in flat, out
        assert "[rank 0] 5 2.0" in out and "[rank 1] None 2.0" in out, out
        assert names(server) == [name]  # the same session, found by the notebook's new path
        status = session(server, name)
        assert (status["state"], status["generation"]) == ("ready", 1)
        assert status["ranks"][0]["pid"] == pids[0] and status["ranks"][1]["pid"] != pids[1]
        notebook.ok("%dist shutdown")
    finally:
        notebook.close()


def finish(kernel: ServerKernel, msg_id: str) -> tuple[str, dict[str, Any]]:
    """What cell ``msg_id`` (sent with ``kernel.kc.execute``) printed or raised, once it is
    done, and its reply."""
    text: list[str] = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=CELL_TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
        elif kind == "error":
            text.append("\n".join(content["traceback"]))
        elif kind in ("execute_result", "display_data", "update_display_data"):
            text.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "status" and content["execution_state"] == "idle":
            break
    while True:
        reply = kernel.kc.get_shell_msg(timeout=CELL_TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg_id:
            return re.sub(r"\x1b\[[0-9;]*m", "", "".join(text)), reply["content"]


def test_a_new_notebook_given_a_renamed_notebooks_old_name_gets_a_session_of_its_own(
    server: Server, kernel_name: str
) -> None:
    """JupyterLab names the next new notebook ``Untitled.ipynb`` again once the first was
    renamed: the new file is another notebook, with a session of its own, and each is
    named for what it is; one that only interrupts a session does not use it, and one
    that joins it is told whose it is."""
    first = new_notebook(server, "draft.ipynb", kernel_name)
    second: ServerKernel | None = None
    name = notebook_session_name({"JPY_SESSION_NAME": "draft.ipynb"}) or ""
    try:
        first.ok("%%distributed --procs 1\nsecret = 'belongs to the first notebook'")
        rename(server, first, "draft.ipynb", "model.ipynb")
        second = new_notebook(server, "draft.ipynb", kernel_name)  # the old name, a new file
        out = second.ok("%%distributed --procs 1\nprint('sees the secret:', 'secret' in dir())")
        assert "[rank 0] sees the secret: False" in out, out
        assert f"session '{name}-2' ready" in out, out
        assert names(server) == [name, f"{name}-2"]
        mine, theirs = session(server, f"{name}-2"), session(server, name)
        assert (mine["notebook"], theirs["notebook"]) == ("draft.ipynb", "model.ipynb")
        assert mine["notebook_id"] and mine["notebook_id"] != theirs["notebook_id"]
        assert [n["path"] for n in mine["notebooks"]] == ["draft.ipynb"]
        assert [n["path"] for n in theirs["notebooks"]] == ["model.ipynb"]
        assert f"this notebook's session: '{name}-2'" in second.ok("%dist status")

        # the renamed notebook's cell is stopped from the new one: each is named as it is
        msg_id = first.kc.execute("%%distributed\nimport time\nwhile True:\n    time.sleep(0.05)")
        deadline = time.monotonic() + CELL_TIMEOUT
        while session(server, name)["running"] is None:
            assert time.monotonic() < deadline, "the cell never took its turn"
            time.sleep(0.1)
        assert session(server, name)["running"]["path"] == "model.ipynb"
        second.ok(f"%dist interrupt --session {name}")
        out, reply = finish(first, msg_id)
        assert reply["status"] == "error", out
        flat = " ".join(out.split())
        assert f"session '{name}' was interrupted from draft.ipynb" in flat, out
        assert "the cell from model.ipynb was interrupted" in flat, out
        # interrupting is not using it
        assert [n["path"] for n in session(server, name)["notebooks"]] == ["model.ipynb"]

        out = second.ok(f"%dist attach {name}")
        flat = " ".join(out.split())
        assert f"session '{name}' belongs to model.ipynb, which started it" in flat, out
        listed = [n["path"] for n in session(server, name)["notebooks"]]
        assert listed == ["model.ipynb", "draft.ipynb"]
        out = second.ok("%%distributed\nprint(secret)")
        assert "[rank 0] belongs to the first notebook" in out, out
        assert "belongs to model.ipynb" not in out, out  # said once
        second.ok(f"%dist shutdown --session {name}-2")
        second.ok(f"%dist shutdown --session {name}")
        assert names(server) == []
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_cell_that_names_no_session_runs_on_the_one_the_notebook_last_used(
    server: Server, kernel_name: str
) -> None:
    """After ``--session big`` a bare cell runs on ``big`` (no second session beside it),
    and says so; so does the notebook's first cell after a kernel restart. Once that
    session is shut down, the next cell starts the notebook's own, saying which."""
    notebook = new_notebook(server, "sized.ipynb", kernel_name)
    own = notebook_session_name({"JPY_SESSION_NAME": "sized.ipynb"})
    try:
        notebook.ok("%%distributed --session big --procs 1\nw = 'on big'")
        out = notebook.ok("%%distributed\nprint(w)")
        assert "[rank 0] on big" in out, out
        assert "running on session 'big', the one this notebook last used" in out, out
        assert names(server) == ["big"]
        out = notebook.ok("%%distributed\nprint(w)")
        assert "running on session" not in out, out  # said once

        notebook.restart()
        notebook.ok("%load_ext jupyter_dist")
        out = notebook.ok("%%distributed\nprint(w)")
        assert "[rank 0] on big" in out, out
        assert "attached to session 'big', which was already running" in out, out
        assert "this notebook's session: 'big'" in notebook.ok("%dist status")

        assert "session 'big' shut down" in notebook.ok("%dist shutdown")
        out = notebook.ok("%%distributed --procs 1\nprint('w' in dir())")
        assert f"session '{own}' ready" in out and "[rank 0] False" in out, out
        assert "no longer running" not in out, out  # this notebook shut it down itself
        assert names(server) == [own]
        notebook.ok("%dist shutdown")
    finally:
        notebook.close()
