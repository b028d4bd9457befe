"""A node's relay between its real rank kernels and the notebook side: one IOPub and one
shell endpoint a node, a cell sent once a node, every rank's output whole and attributed,
a relay that dies (even amid a cell) replaced without losing the session or hanging a
cell, and nothing left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_dist.common.events import CellResult, StreamOut
from jupyter_dist.common.proc_titles import command_line, is_ours
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.errors import SpecError
from jupyter_dist.settings import NODE_RELAY_VAR, node_relay

pytestmark = pytest.mark.slow

LINES = 300
CELL = f"import os\nfor i in range({LINES}): print(os.environ['RANK'], i)"


def _relays(agent_pid: int) -> list[psutil.Process]:
    """The live relays among the agent's children (a killed one may linger as a zombie)."""
    found = []
    for child in psutil.Process(agent_pid).children():
        try:
            if " ".join(child.cmdline()).startswith("jupyter_dist relay "):
                found.append(child)
        except psutil.Error:  # gone, or a zombie not reaped yet
            continue
    return found


def _lines(sink: EventQueue) -> dict[int, list[str]]:
    got: dict[int, list[str]] = {}
    while not sink.empty():
        event = sink.get()
        if isinstance(event, StreamOut):
            got.setdefault(event.rank, []).extend(event.text.splitlines())
    return got


def _check_every_line(got: dict[int, list[str]], ranks: int) -> None:
    for rank in range(ranks):
        assert got.get(rank) == [f"{rank} {i}" for i in range(LINES)], (rank, got.get(rank))


@pytest.fixture
def session() -> Iterator[Session]:
    spec = resolve_shape("relay", ShapeRequest(procs=3, init=False), 0, "localhost")
    yield Session(spec, SessionTimeouts(start=120))


def test_a_nodes_ranks_are_read_through_its_relay(session: Session) -> None:
    async def scenario() -> tuple[set[str], dict[int, list[str]], int, int, list[str]]:
        await session.start()
        try:
            fan_in = session._iopub
            assert fan_in is not None
            [shell] = session._shells.values()
            assert shell.url.endswith("/relay-shell")
            batched, sent, replies = fan_in.batched, shell.sent, shell.replies
            sink = EventQueue()
            result = await session.execute(CELL, sink=sink)
            assert not result.failures, result.failures
            assert shell.sent == sent + 1  # one request for the node's three ranks
            # each rank answers the cell on IOPub, behind its output, not on shell
            assert shell.replies == replies
            agent_pid = session.status()["nodes"][0]["agent_pid"]
            assert agent_pid is not None
            relays = _relays(agent_pid)
            titles = [" ".join(command_line(p.cmdline())) + " | " + p.name() for p in relays]
            return fan_in.endpoints, _lines(sink), fan_in.batched - batched, agent_pid, titles
        finally:
            await session.shutdown()

    endpoints, got, batched, agent_pid, titles = asyncio.run(scenario())
    assert len(endpoints) == 1 and next(iter(endpoints)).endswith("/relay-iopub"), endpoints
    _check_every_line(got, 3)
    # at least each rank's output and reply came in the relay's batches
    assert batched >= 3 * 2, batched
    assert titles == ["jupyter_dist relay node 0 session relay | jd-relay-0"]
    assert is_ours(titles[0].split(" | ")[0].split(" "))
    assert not psutil.pid_exists(agent_pid) or not _relays(agent_pid)


def test_a_relay_that_dies_is_replaced_and_the_next_cell_is_whole(session: Session) -> None:
    async def scenario() -> tuple[int, int, dict[int, list[str]]]:
        await session.start()
        try:
            agent_pid = session.status()["nodes"][0]["agent_pid"]
            assert agent_pid is not None
            [first] = _relays(agent_pid)
            os.kill(first.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                replaced = [p for p in _relays(agent_pid) if p.pid != first.pid]
                if replaced:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the agent did not fork a new relay")
            await asyncio.sleep(0.5)  # the subscribers reconnect to the same socket
            sink = EventQueue()
            result = await session.execute(CELL, sink=sink)
            assert not result.failures, result.failures
            return first.pid, replaced[0].pid, _lines(sink)
        finally:
            await session.shutdown()

    first, second, got = asyncio.run(scenario())
    assert first != second
    _check_every_line(got, 3)


def test_a_relay_that_dies_amid_a_cell_ends_it_and_the_next_cell_is_whole(
    session: Session, tmp_path: Path
) -> None:
    """The ranks' cell runs until the test lets it end, after the cell was cut: it was cut
    because its answers were lost, not because it ended."""
    go = tmp_path / "go"
    cell = (
        "import os, time\nprint('running', flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)"
    )

    async def scenario() -> tuple[CellResult, dict[int, list[str]]]:
        await session.start()
        try:
            agent_pid = session.status()["nodes"][0]["agent_pid"]
            assert agent_pid is not None
            [first] = _relays(agent_pid)
            said = EventQueue()
            running = asyncio.ensure_future(session.execute(cell, sink=said))
            heard: dict[int, list[str]] = {}
            while len(heard) < 3:  # every rank runs the cell
                assert not running.done(), running.result()
                await asyncio.sleep(0.05)
                for rank, lines in _lines(said).items():
                    heard.setdefault(rank, []).extend(lines)
            os.kill(first.pid, signal.SIGKILL)
            try:
                cut = await asyncio.wait_for(running, 60)
            finally:
                go.touch()
            while not [p for p in _relays(agent_pid) if p.pid != first.pid]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            sink = EventQueue()
            result = await session.execute(CELL, sink=sink)
            assert not result.failures, result.failures
            return cut, _lines(sink)
        finally:
            await session.shutdown()

    cut, got = asyncio.run(scenario())
    assert sorted(f.rank for f in cut.failures) == [0, 1, 2]
    assert {(f.kind, f.ename) for f in cut.failures} == {("stuck", "AnswerLost")}
    assert "relay" in cut.failures[0].evalue
    _check_every_line(got, 3)


def test_with_the_relay_off_each_rank_is_read_on_its_own(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NODE_RELAY_VAR, "off")

    async def scenario() -> tuple[set[str], dict[int, list[str]], int]:
        await session.start()
        try:
            fan_in = session._iopub
            assert fan_in is not None
            sink = EventQueue()
            result = await session.execute(CELL, sink=sink)
            assert not result.failures, result.failures
            assert not session._shells
            return fan_in.endpoints, _lines(sink), fan_in.batches
        finally:
            await session.shutdown()

    endpoints, got, batches = asyncio.run(scenario())
    assert len(endpoints) == 3 and not any(url.endswith("/relay-iopub") for url in endpoints)
    assert batches == 0
    _check_every_line(got, 3)


def test_a_bad_relay_setting_names_the_value_and_the_choices() -> None:
    assert node_relay({}) and node_relay({NODE_RELAY_VAR: "On"})
    assert not node_relay({NODE_RELAY_VAR: "off"})
    with pytest.raises(SpecError, match=r"JUPYTER_DIST_NODE_RELAY='maybe': expected on or off"):
        node_relay({NODE_RELAY_VAR: "maybe"})
