"""A ``--ray`` start against an address where no Ray cluster answers fails at once, naming
the address and where it came from, without Ray's own log lines; nothing is left behind.

No cluster is needed (only the ``ray`` package): a port nothing listens on (a socket bound
and closed), and one that accepts connections and never answers. Ray maps a loopback
address to this machine's own, so the silent listener listens on every interface.

A Jupyter server stopped while a session's driver is still connecting (blocked inside Ray,
its bounds raised as a user's environment may raise them) stops that start: its driver is
gone, where it lived on as an orphan for as long as Ray kept trying.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_dist.control.launchers.ray_reach import CONNECT_BOUNDS
from jupyter_dist.text import strip_ansi
from tests import dead_ports
from tests.conftest import CellOutput, our_processes
from tests.integration.server_process import (
    API,
    START_S,
    Server,
    start_server,
    stop_server,
    stop_servers,
    wait_for,
)

pytestmark = [pytest.mark.slow]
pytest.importorskip("ray")

#: well past the start's bound (Ray's own settings: about 8 s, plus starting the driver
#: and importing Ray), short of Ray's defaults (retries for minutes): a hang guard
HANG_S = 60.0
#: a line of Ray's own log
RAY_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\]", re.M)


@pytest.fixture
def silent_port() -> Iterator[int]:
    with dead_ports.silent_port("") as port:
        yield port


def start_fails(run: Callable[[str], CellOutput], line: str) -> tuple[str, float]:
    began = time.monotonic()
    out = run(f"%%distributed {line} --nodes 1 --procs 1\nx = 1")
    took = time.monotonic() - began
    assert not out.ok
    return strip_ansi(out.stdout + out.stderr), took


def nothing_left(run: Callable[[str], CellOutput], session: str) -> None:
    status = run("%dist status")
    assert session not in status.stdout, status.stdout
    drivers = []
    for proc in our_processes():
        with contextlib.suppress(psutil.Error):
            if "ray_driver" in " ".join(proc.cmdline()):
                drivers.append(proc)
    assert not drivers, drivers


def test_a_port_with_nothing_listening_fails_within_seconds_naming_the_flag(
    run: Callable[[str], CellOutput],
) -> None:
    port = dead_ports.closed_port()
    text, took = start_fails(run, f"--ray --ray-address 127.0.0.1:{port} --session rdead")
    assert took < HANG_S, f"{took:.0f} s: {text}"
    assert f"Ray cluster 127.0.0.1:{port} (given by --ray-address): connecting" in text, text
    assert (
        f"AgentError: Ray address 127.0.0.1:{port} (given by --ray-address): no Ray cluster "
        "answered there: the connection was refused (nothing listens on that port)"
    ) in text, text
    # asked before any driver was started (it would import Ray, then try for seconds)
    assert "ray_driver" not in text, text
    assert "`ray start --head` prints it; port 6379 unless" in text, text
    assert not RAY_LOG.search(text), text
    assert "gcs_client" not in text and "rpc_client" not in text, text
    nothing_left(run, "rdead")


def test_a_port_that_never_answers_fails_within_seconds_naming_ray_address_and_auto(
    run: Callable[[str], CellOutput],
    silent_port: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RAY_ADDRESS=auto: ``auto`` finds the cluster the last ``ray start`` here wrote into
    Ray's address file (under RAY_TMPDIR), and the start names the address, the variable
    and that file."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{silent_port}")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    text, took = start_fails(run, "--ray --session rsilent")
    assert took < HANG_S, f"{took:.0f} s: {text}"
    assert (
        f"Ray address 127.0.0.1:{silent_port} (found by `auto` (from the RAY_ADDRESS "
        "environment variable): the cluster last started on this machine with `ray start`, "
        f"as Ray's {tmp_path}/ray/ray_current_cluster says"
    ) in " ".join(text.split()), text
    assert "no Ray cluster answered there within" in text, text
    assert not RAY_LOG.search(text), text
    nothing_left(run, "rsilent")


def drivers_of(server: Server) -> list[psutil.Process]:
    return [p for p in server.descendants() if "ray_driver" in " ".join(p.cmdline())]


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_server_stopped_while_its_ray_driver_connects_leaves_no_driver(tmp_path: Path) -> None:
    """The driver is inside ``ray.init`` (it connected to the port, which never answers)
    when the server gets SIGTERM: the server's stop cancels the start, which kills it, and
    says so; the driver was told its owner's pid, so that it dies with a killed server."""
    root = tmp_path / "root"
    root.mkdir()
    server = start_server(root, root / "config")
    answers: list[object] = []

    def post(body: dict[str, object]) -> None:
        try:  # no answer is a right answer too: the server stops
            answers.append(server.call("POST", f"{API}/sessions", body))
        except OSError as err:
            answers.append(err)

    try:
        # it answers the owner's probe as a gRPC server its client's preface (its
        # settings), then nothing: the second connection is the driver's, inside ray.init
        settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
        with dead_ports.silent_peer(greeting=settings, taken_count=2) as (port, connecting):
            # Ray's own bounds raised (the first try waits for minutes), as they may be
            body = {
                "name": "rstopped",
                "launcher": "ray",
                "procs": 1,
                "ray": {"address": f"127.0.0.1:{port}"},
                "env": {var: "600" for var in CONNECT_BOUNDS if "connect" in var},
            }
            threading.Thread(target=post, args=(body,), daemon=True).start()
            wait_for(lambda: connecting.is_set() or answers, START_S, "a connection", poll=0.2)
            assert connecting.is_set(), f"the start ended before its driver connected: {answers}"
            drivers = drivers_of(server)
            assert len(drivers) == 1, drivers
            assert f"--owner-pid {server.process.pid}" in " ".join(drivers[0].cmdline())
            stop_server(server)  # SIGTERM: the server stops its sessions
            wait_for(lambda: gone(drivers[0]), HANG_S, "the end of the Ray driver", poll=0.2)
    finally:
        stop_servers([server])
    log = (root / "server.log").read_text()
    assert "jupyter_dist: stopping 1 session(s), 1 of them starting" in log, log
    assert "jupyter_dist: stopped the start of session(s) 'rstopped'" in log, log
