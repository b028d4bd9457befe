"""An agent killed with SIGKILL cannot remove its private folder, where its ranks'
connection files hold the session's key: the next agent to start removes it, and nothing
that belongs to a live agent or to anyone else."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

pytestmark = pytest.mark.slow
WAIT_S = 120.0  # each agent imports torch first


class RealAgent:
    """``python -m jupyter_dist.node`` with its temporary folder in ``tmp``."""

    def __init__(self, tmp: Path, session: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dist.node", "--session", session],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes]) -> None:
        for line in out:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))

    def wait_for(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                got = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {event!r} from agent {self.process.pid}") from None
            if got.get("event") == event:
                return got

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()  # the agent's signal to stop
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short temporary folder: the ranks' Unix socket paths must stay short."""
    path = Path(tempfile.mkdtemp(prefix="jdt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_the_next_agent_removes_a_killed_agents_folder_and_nothing_else(tmp: Path) -> None:
    agents: list[RealAgent] = []
    try:
        live = RealAgent(tmp, "live")
        doomed = RealAgent(tmp, "doomed")
        agents += [live, doomed]
        live_dir = Path(live.wait_for("ready")["dir"])
        doomed_dir = Path(doomed.wait_for("ready")["dir"])
        key = "0123456789abcdef" * 4
        doomed.send({"op": "spawn", "rank": 0, "key": key, "env": {}, "cwd": str(tmp)})
        rank = psutil.Process(doomed.wait_for("spawned")["pid"])
        assert key in (doomed_dir / "rank-0.json").read_text()

        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait(30)
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.wait(30)  # PR_SET_PDEATHSIG
        assert (doomed_dir / "rank-0.json").exists()  # nobody was left to remove it

        # look-alikes that are not a dead agent's of ours: a link to a folder, and (as
        # root) a folder of another user's
        decoy = tmp / "decoy"
        decoy.mkdir()
        (decoy / "agent.lock").touch()
        link = tmp / f"jd-{dead_pid()}-link-aaaaaaaa"
        link.symlink_to(decoy)
        theirs = tmp / f"jd-{dead_pid()}-theirs-bbbbbbbb"
        if os.getuid() == 0:
            theirs.mkdir()
            (theirs / "agent.lock").touch()
            os.chown(theirs, 65534, 65534)

        new = RealAgent(tmp, "new")
        agents.append(new)
        new_dir = Path(new.wait_for("ready")["dir"])
        assert not doomed_dir.exists()
        assert live_dir.is_dir() and (live_dir / "agent.lock").exists()
        assert new_dir.is_dir() and new_dir.name.startswith(f"jd-{new.process.pid}-new-")
        assert link.is_symlink() and (decoy / "agent.lock").exists()
        if os.getuid() == 0:
            assert theirs.is_dir()
    finally:
        for agent in agents:
            agent.stop()
    # agents that stop as they should remove their own folders
    assert not live_dir.exists() and not new_dir.exists()
