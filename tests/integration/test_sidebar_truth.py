"""What the sidebar reads from a real `jupyter server`: each rank's output log apart from
its diagnostics, rank state after a restart, a rank left busy, the form's validation."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .server_process import API, Server, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("server")
    running = start_server(root, root / "config")
    yield running
    stop_server(running)


def run_on_rank(server: Server, session: str, rank: int, code: str, wait: bool = True) -> Any:
    """Run ``code`` on one rank through the session's connection info, as a console
    would; returns the reply (or, with ``wait`` False, the client, the request sent)."""
    from jupyter_client.blocking.client import BlockingKernelClient

    status, info = server.call("GET", f"{API}/sessions/{session}/connection")
    assert status == 200, info
    (found,) = [r for r in info["ranks"] if r["rank"] == rank]
    client = BlockingKernelClient()
    client.load_connection_info({**found["connection"], "key": info["key"]})
    client.start_channels()
    if not wait:
        client.execute(code)
        return client
    try:
        return client.execute_interactive(code, timeout=60, output_hook=lambda _msg: None)
    finally:
        client.stop_channels()


def until(check: Callable[[], bool], within: float) -> bool:
    """Poll ``check`` until it holds, for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def read_log(server: Server, session: str, rank: int, kind: str) -> dict[str, Any]:
    status, piece = server.call("GET", f"{API}/sessions/{session}/ranks/{rank}/log?kind={kind}")
    assert status == 200, piece
    return dict(piece)


def test_a_ranks_output_log_holds_what_it_printed_and_raised_and_diagnostics_are_apart(
    server: Server,
) -> None:
    assert server.call("POST", f"{API}/sessions", {"name": "logged", "procs": 2})[0] == 201
    try:
        run_on_rank(server, "logged", 1, "print('hello from rank one')\n40 + 2")
        reply = run_on_rank(server, "logged", 1, "raise ValueError('only raised here')")
        assert reply["content"]["status"] == "error"
        # a thread dump goes to the diagnostics, not to the output
        assert server.call("POST", f"{API}/sessions/logged/stacks?ranks=1")[0] == 200

        output = read_log(server, "logged", 1, "output")
        text = output["text"]
        assert output["kind"] == "output" and output["offset"] == 0
        assert output["end"] == len(text.encode())
        assert "hello from rank one" in text
        assert "Out[" in text and "42" in text  # rich output, as text
        assert "Traceback" in text and "ValueError: only raised here" in text
        assert "\x1b[" not in text  # tracebacks without colour codes
        assert text.count("--- In [") == 2  # each cell begins with a line naming it
        assert "most recent call first" not in text  # no thread dump

        diagnostics = read_log(server, "logged", 1, "diagnostics")
        assert "most recent call first" in diagnostics["text"]  # the dump
        assert "hello from rank one" not in diagnostics["text"]
        assert "only raised here" not in diagnostics["text"]
        assert diagnostics["path"] != output["path"]
        # the default stays the process log
        assert server.call("GET", f"{API}/sessions/logged/ranks/1/log")[1]["kind"] == (
            "diagnostics"
        )
        # rank 0 ran nothing: its output log is empty
        assert read_log(server, "logged", 0, "output")["text"] == ""

        # following it: from the end, nothing; then the next cell only
        run_on_rank(server, "logged", 1, "print('later')")
        status, more = server.call(
            "GET", f"{API}/sessions/logged/ranks/1/log?kind=output&offset={output['end']}"
        )
        assert status == 200 and more["offset"] == output["end"]
        assert "later" in more["text"] and "hello from rank one" not in more["text"]

        status, reply = server.call("GET", f"{API}/sessions/logged/ranks/1/log?kind=stdout")
        assert status == 400 and "kind: 'stdout'" in reply["message"], reply
        assert "output" in reply["message"] and "diagnostics" in reply["message"]

        # a restarted rank starts a new output log
        assert server.call("POST", f"{API}/sessions/logged/restart")[0] == 200
        fresh = read_log(server, "logged", 1, "output")
        assert "hello from rank one" not in fresh["text"]
        status, again = server.call(
            "GET", f"{API}/sessions/logged/ranks/1/log?kind=output&offset={more['end']}"
        )
        assert status == 200 and again["offset"] == 0  # past its end: from the start
    finally:
        assert server.call("DELETE", f"{API}/sessions/logged")[0] == 204


def test_after_a_restart_no_rank_shows_the_error_of_a_cell_from_before(server: Server) -> None:
    assert server.call("POST", f"{API}/sessions", {"name": "renewed", "procs": 2})[0] == 201
    try:
        turn = {"turn_id": "t1", "kind": "cell", "ranks": [], "sender": None}
        status, granted = server.call("POST", f"{API}/sessions/renewed/turns", turn)
        assert status == 200 and granted["state"] == "running", granted
        # the cell is interrupted, and the session restarted before it says how it ended
        assert server.call("POST", f"{API}/sessions/renewed/restart")[0] == 200
        end = {"errors": {"0": "KeyboardInterrupt"}, "ran": [0, 1]}
        assert server.call("POST", f"{API}/sessions/renewed/turns/t1/end", end)[0] == 204
        status, session = server.call("GET", f"{API}/sessions/renewed")
        assert status == 200
        assert session["running"] is None
        assert [r["last_error"] for r in session["ranks"]] == ["", ""], session["ranks"]

        # a cell of the fresh ranks still says how it failed
        turn = {"turn_id": "t2", "kind": "cell", "ranks": [], "sender": None}
        assert server.call("POST", f"{API}/sessions/renewed/turns", turn)[0] == 200
        end = {"errors": {"1": "ValueError: bad"}, "ran": [0, 1]}
        assert server.call("POST", f"{API}/sessions/renewed/turns/t2/end", end)[0] == 204
        session = server.call("GET", f"{API}/sessions/renewed")[1]
        assert [r["last_error"] for r in session["ranks"]] == ["", "ValueError: bad"]
    finally:
        assert server.call("DELETE", f"{API}/sessions/renewed")[0] == 204


def test_a_rank_left_busy_with_no_cell_waiting_is_seen_busy_with_the_threshold(
    server: Server,
) -> None:
    assert server.call("POST", f"{API}/sessions", {"name": "wedged", "procs": 2})[0] == 201
    client = None
    try:
        client = run_on_rank(server, "wedged", 0, "import time\ntime.sleep(600)", wait=False)
        deadline = time.monotonic() + 60
        while True:
            session = server.call("GET", f"{API}/sessions/wedged")[1]
            rank0 = session["ranks"][0]
            if rank0["state"] == "busy" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rank0["state"] == "busy" and rank0["busy_since"], rank0
        assert session["ranks"][1]["state"] == "idle"
        assert session["running"] is None  # no cell of a notebook waits for it
        assert session["state"] == "ready"
        # what the sidebar needs to call it stuck once it has been busy that long
        assert session["straggler_s"] > 0
    finally:
        if client is not None:
            client.stop_channels()
        assert server.call("DELETE", f"{API}/sessions/wedged")[0] == 204


def test_the_new_session_form_is_checked_without_starting_anything(server: Server) -> None:
    def check(body: dict[str, Any]) -> dict[str, Any]:
        status, reply = server.call("POST", f"{API}/sessions?validate=true", body)
        assert status == 200, reply
        return dict(reply)

    reply = check({"name": "formed", "procs": "abc"})
    assert not reply["valid"] and reply["message"].startswith("procs: 'abc'"), reply
    reply = check({"name": "formed", "procs": 0})
    assert not reply["valid"] and reply["message"].startswith("--procs 0: expected"), reply
    reply = check({"name": "bad name!", "procs": 2})
    assert not reply["valid"] and "bad name!" in reply["message"], reply
    assert check({"name": "formed", "procs": 2, "nodes": 1}) == {"valid": True, "name": "formed"}
    status, reply = server.call("POST", f"{API}/sessions?validate=yes", {"name": "formed"})
    assert status == 400 and "validate: 'yes'" in reply["message"], reply
    status, listed = server.call("GET", f"{API}/sessions")
    assert status == 200 and "formed" not in [s["name"] for s in listed]
    assert not server.descendants()


def test_a_collective_refused_in_a_console_leaves_the_rank_healthy(server: Server) -> None:
    """The refusal is the console's to show: the sidebar does not paint the rank red,
    while a console input that really failed does."""
    assert server.call("POST", f"{API}/sessions", {"name": "refusal", "procs": 2})[0] == 201

    def rank_1() -> dict[str, Any]:
        return dict(server.call("GET", f"{API}/sessions/refusal")[1]["ranks"][1])

    try:
        run_on_rank(server, "refusal", 1, "raise ValueError('bad')")
        assert until(lambda: rank_1()["last_error"] == "ValueError: bad", 30), rank_1()
        reply = run_on_rank(
            server, "refusal", 1, "import torch.distributed as dist\ndist.barrier()"
        )
        assert reply["content"]["ename"] == "CollectiveInConsole", reply["content"]
        # the refusal's first message cleared the last error; once its last is in, the
        # rank is idle: what it shows then is all the refusal did
        assert until(lambda: rank_1()["last_error"] != "ValueError: bad", 30), rank_1()
        assert until(lambda: rank_1()["state"] == "idle", 30), rank_1()
        assert rank_1()["last_error"] == "", rank_1()
    finally:
        assert server.call("DELETE", f"{API}/sessions/refusal")[0] == 204
