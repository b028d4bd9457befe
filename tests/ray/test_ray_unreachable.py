"""A ``--ray`` start against an address where no Ray cluster answers fails at once, naming
the address and where it came from, without Ray's own log lines; nothing is left behind.

No cluster is needed (only the ``ray`` package): a port nothing listens on (a socket bound
and closed), and one that accepts connections and never answers. Ray maps a loopback
address to this machine's own, so the silent listener listens on every interface.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from jupyter_dist.text import strip_ansi
from tests import dead_ports
from tests.conftest import CellOutput, our_processes

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
        "answered there within"
    ) in text, text
    assert "`ray start --head` prints it; port 6379 unless" in text, text
    assert not RAY_LOG.search(text), text
    assert "gcs_client" not in text and "rpc_client" not in text, text
    nothing_left(run, "rdead")


def test_a_port_that_never_answers_fails_within_seconds_naming_ray_address(
    run: Callable[[str], CellOutput], silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{silent_port}")
    text, took = start_fails(run, "--ray --session rsilent")
    assert took < HANG_S, f"{took:.0f} s: {text}"
    assert (
        f"Ray address 127.0.0.1:{silent_port} (from the RAY_ADDRESS environment variable): "
        "no Ray cluster answered there within"
    ) in text, text
    assert not RAY_LOG.search(text), text
    nothing_left(run, "rsilent")
