"""The agent reaps a rank's previous process before it starts the rank again, and names
the rank in every error: a real `Agent` object with a real child process standing for the
old rank (the fork of a new rank kernel is recorded instead of done)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.payloads import SpawnCommand
from jupyter_dist.node import agent as agent_module
from jupyter_dist.node.agent import Agent, RankChild

SPAWN: SpawnCommand = {
    "op": "spawn",
    "rank": 0,
    "local_rank": 0,
    "env": {},
    "key": "k",
    "cwd": "/",
}


class Harness:
    def __init__(self, agent: Agent, events_fd: int, old_pid: int) -> None:
        self.agent = agent
        self.events_fd = events_fd
        self.old_pid = old_pid
        self.forked: list[int] = []

    def events(self) -> list[dict[str, Any]]:
        os.set_blocking(self.events_fd, False)
        try:
            data = os.read(self.events_fd, 1 << 16)
        except BlockingIOError:
            return []
        return [json.loads(line) for line in data.splitlines() if line]


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(agent_module, "RESPAWN_WAIT_S", 0.5)
    read_fd, write_fd = os.pipe()
    agent = Agent(write_fd, "respawn")
    old = os.fork()
    if old == 0:  # the rank's previous process, in its own process group as a rank is
        try:
            os.setpgid(0, 0)
            time.sleep(60)
        finally:
            os._exit(0)
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.setpgid(old, old)  # whichever of the two comes first
    log = str(tmp_path / "rank-0.log")
    agent.children[old] = RankChild(0, old, log, str(tmp_path / "rank-0.json"))
    made = Harness(agent, read_fd, old)
    monkeypatch.setattr(agent, "_fork_rank", lambda cmd: made.forked.append(int(cmd["rank"])))
    yield made
    for pid in (old,):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    os.close(read_fd)
    os.close(write_fd)


def test_a_spawn_waits_for_the_previous_process_to_be_reaped(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = harness.agent
    agent.kill({0}, grace=0.0)  # SIGKILL: it goes, but not before the spawn arrives
    agent.spawn(SPAWN)
    assert harness.forked == [0] or 0 in agent.waiting_spawns
    deadline = time.monotonic() + 5
    while not harness.forked and time.monotonic() < deadline:
        agent._reap()
        agent._retry_spawns()
        time.sleep(0.01)
    assert harness.forked == [0]
    assert not agent.waiting_spawns
    assert [e["event"] for e in harness.events()] == ["exited"]


def test_a_previous_process_that_outlives_sigkill_fails_the_spawn_naming_the_rank(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a process in the D state does (in a GPU driver, on NFS)."""
    agent = harness.agent
    monkeypatch.setattr(os, "killpg", lambda pid, sig: None)  # no signal reaches it
    agent.kill({0}, grace=0.0)
    agent.spawn(SPAWN)
    assert 0 in agent.waiting_spawns and not harness.forked
    time.sleep(0.6)
    agent._reap()
    agent._retry_spawns()
    assert not harness.forked and not agent.waiting_spawns
    (error,) = harness.events()
    assert error["event"] == "error" and error["rank"] == 0
    assert re.match(
        rf"rank 0: its previous process \(pid {harness.old_pid}, state [A-Z] \(\w+\)\) was "
        r"still there 0\.5 s after SIGKILL, so no new rank was started",
        error["message"],
    )


def test_a_kill_withdraws_a_waiting_spawn_with_the_rank_named(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = harness.agent
    monkeypatch.setattr(os, "killpg", lambda pid, sig: None)
    agent.kill({0}, grace=0.0)
    agent.spawn(SPAWN)
    agent.kill(None, grace=0.0)
    (error,) = harness.events()
    assert (error["event"], error["rank"]) == ("error", 0)
    assert "its start was withdrawn" in error["message"]


def test_a_spawn_of_a_rank_still_running_is_refused_with_its_rank(harness: Harness) -> None:
    """Not being killed: a second spawn of a live rank is an error, named."""
    harness.agent._handle(json.dumps(SPAWN).encode())
    (error,) = harness.events()
    assert error["rank"] == 0
    assert error["message"] == (
        f"rank 0: RuntimeError: rank 0 is already running on this node (pid {harness.old_pid})"
    )


def test_the_owner_going_silent_stops_the_agent(harness: Harness) -> None:
    agent = harness.agent
    agent._handle(json.dumps({"op": "ping", "seq": 1, "deadline_s": 0.2}).encode())
    assert harness.events() == [{"event": "pong", "seq": 1}]
    agent.last_heard = time.monotonic()
    agent._check_owner()
    assert not agent.stopping
    time.sleep(0.25)
    agent._check_owner()
    assert agent.stopping


def slow_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """A module ``name`` whose import waits until the returned gate file exists (as
    torch's compiler stack keeps a loaded machine's CPU for seconds)."""
    gate = tmp_path / f"{name}.gate"
    (tmp_path / f"{name}.py").write_text(
        "import os, time\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return gate


def test_the_agent_answers_pings_while_it_warms_up_and_holds_spawns_until_done(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The late imports run beside the agent's loop, not in it: an agent that stopped
    answering for their seconds was taken for a lost node. No rank is forked meanwhile
    (a fork beside an import hands the child a held import lock)."""
    gate = slow_import(tmp_path, monkeypatch, "jd_slow_warm_a")
    agent = harness.agent
    agent.kill({0}, grace=0.0)
    agent._reap()
    deadline = time.monotonic() + 5
    while agent.children and time.monotonic() < deadline:
        agent._reap()
        time.sleep(0.01)
    harness.events()
    agent.warm = agent_module.WarmImports(["jd_slow_warm_a"], agent._wake_w)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    agent.warm_due = time.monotonic()
    agent._warm_up()
    assert agent.warm.busy
    agent._handle(json.dumps({"op": "ping", "seq": 7, "deadline_s": 20}).encode())
    assert harness.events() == [{"event": "pong", "seq": 7}]
    agent._handle(json.dumps(SPAWN).encode())
    agent._release_held_spawns()
    assert not harness.forked and [c["rank"] for c in agent.held_spawns] == [0]
    gate.touch()
    deadline = time.monotonic() + 30
    while agent.warm.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not agent.warm.busy and "jd_slow_warm_a" in sys.modules
    assert os.read(agent._wake_r, 16)  # the loop is woken to fork what waited
    agent._release_held_spawns()
    assert harness.forked == [0] and not agent.held_spawns


def test_a_kill_withdraws_a_spawn_held_during_the_warm_up(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = slow_import(tmp_path, monkeypatch, "jd_slow_warm_b")
    agent = harness.agent
    agent.warm = agent_module.WarmImports(["jd_slow_warm_b"], agent._wake_w)
    agent.warm.start()
    try:
        agent.spawn({**SPAWN, "rank": 1})
        assert [c["rank"] for c in agent.held_spawns] == [1]
        agent.kill({1}, grace=0.0)
        (error,) = harness.events()
        assert (error["event"], error["rank"]) == ("error", 1)
        assert "its start was withdrawn" in error["message"]
        assert not agent.held_spawns
    finally:
        gate.touch()
