"""A server that finds what a killed predecessor's sessions left running stops it.

Agents stop their ranks when the server goes away, so leftovers need an agent that cannot
act: the test stops one with SIGSTOP, SIGKILLs its server, and starts another server on
the same runtime folder, next to a third, live one whose session must be left alone. The
folder also holds what a shared one may: records another machine wrote, naming processes
that are not ours here, and a FIFO named like a record; none stops the new server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_dist.server.process_records import Machine, record_path

from .server_process import API, Server, kill_server, start_server_in, stop_server

pytestmark = pytest.mark.slow
WAIT_S = 120.0  # a loaded two-core machine runs three servers and five rank processes


def record_of(server: Server) -> Path:
    return record_path(server.runtime_dir, server.process.pid)


def unrelated_group() -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """bash and two sleeps of this user's, in their own process group."""
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True
    )
    kids: list[psutil.Process] = []
    deadline = time.monotonic() + 30
    while len(kids) < 2 and time.monotonic() < deadline:
        kids = psutil.Process(leader.pid).children()
        time.sleep(0.02)
    assert len(kids) == 2
    return leader, [psutil.Process(leader.pid), *kids]


def other_machines_records(runtime: Path, procs: list[psutil.Process]) -> list[Path]:
    """What servers on another login node sharing this runtime folder could have left:
    records (in this version's format and the one before) whose pids are those of
    ``procs`` here, each entry true to its process (start time, owner, command line)."""
    here = Machine.here()
    local = [
        {
            "pid": p.pid,
            "role": "agent",
            "create_time": p.create_time(),
            "host": "login2",
            "uid": p.uids().real,
            "cmdline": p.cmdline(),
        }
        for p in procs
    ]
    server = {"pid": 999999, "create_time": 1.0, "host": "login2"}
    records = {
        "jupyter_dist-sessions-login2-999999.json": {
            "version": 2,
            "server": {**server, "boot_id": "elsewhere", "pid_namespace": here.pid_namespace},
            "sessions": [{"name": "theirs", "local": local}],
        },
        "jupyter_dist-sessions-999998.json": {
            "version": 1,
            "server": server,
            "sessions": [{"name": "old", "local": local}],
        },
    }
    paths = []
    for name, record in records.items():
        paths.append(runtime / name)
        paths[-1].write_text(json.dumps(record))
    return paths


def recorded_pids(server: Server) -> dict[str, set[int]]:
    """Each session's local pids in the server's record (empty where there is none)."""
    try:
        data = json.loads(record_of(server).read_text())
    except (OSError, ValueError):
        return {}
    return {s["name"]: {p["pid"] for p in s["local"]} for s in data["sessions"]}


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


def running(proc: psutil.Process) -> bool:
    """Still there and not a zombie waiting for a parent that may never reap it."""
    try:
        return bool(proc.is_running()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def session_pids(created: dict[str, Any]) -> set[int]:
    return {n["agent_pid"] for n in created["nodes"]} | {r["pid"] for r in created["ranks"]}


def log_of(root: Path) -> str:
    return (root / "server.log").read_text(errors="replace")


def test_a_new_server_reaps_a_killed_servers_leftovers_and_leaves_live_ones_alone(
    tmp_path: Path,
) -> None:
    runtime = tmp_path / "runtime"
    roots = {name: tmp_path / name for name in ("live", "doomed", "new")}
    for root in roots.values():
        root.mkdir()
    servers: list[Server] = []
    leftovers: list[psutil.Process] = []
    leader, bystanders = unrelated_group()
    try:
        live = start_server_in(roots["live"], runtime)
        servers.append(live)
        status, kept = live.call("POST", f"{API}/sessions", {"name": "kept", "procs": 1})
        assert status == 201, kept
        kept_pids = session_pids(kept)
        wait_for(lambda: recorded_pids(live) == {"kept": kept_pids}, "the live server's record")
        assert record_of(live).stat().st_mode & 0o777 == 0o600

        doomed = start_server_in(roots["doomed"], runtime)
        servers.append(doomed)
        status, created = doomed.call("POST", f"{API}/sessions", {"name": "doomed", "procs": 2})
        assert status == 201, created
        doomed_pids = session_pids(created)
        assert len(doomed_pids) == 3  # the agent and two ranks
        leftovers = [psutil.Process(p) for p in doomed_pids]
        wait_for(lambda: recorded_pids(doomed) == {"doomed": doomed_pids}, "the doomed record")
        kept_record = record_of(live).read_bytes()

        agent_pid = created["nodes"][0]["agent_pid"]
        os.kill(agent_pid, signal.SIGSTOP)  # wedged: it cannot stop its ranks any more
        kill_server(doomed)
        time.sleep(1)  # a while without their server (the reap below proves the rest)
        assert all(running(p) for p in leftovers), "the injected leftovers went away by themselves"
        assert record_of(doomed).exists()
        theirs = other_machines_records(runtime, bystanders)
        fifo = runtime / "jupyter_dist-sessions-fifo-1.json"
        os.mkfifo(fifo)

        new = start_server_in(roots["new"], runtime)
        servers.append(new)
        wait_for(lambda: not any(running(p) for p in leftovers), "the leftovers to be stopped")
        wait_for(lambda: "reaped session 'doomed'" in log_of(roots["new"]), "the reaping line")
        [line] = [ln for ln in log_of(roots["new"]).splitlines() if "reaped session" in ln]
        assert f"of dead server pid {doomed.process.pid}" in line, line
        assert f"pid {agent_pid} (agent)" in line, line
        for rank in created["ranks"]:
            assert f"pid {rank['pid']} (rank {rank['rank']})" in line, line
        wait_for(lambda: not record_of(doomed).exists(), "the dead server's record to go")
        assert all(running(p) for p in bystanders), "killed what another machine recorded"
        assert all(path.exists() for path in [*theirs, fifo])
        log = log_of(roots["new"])
        assert "'theirs'" not in log and "'old'" not in log
        assert f"skipping session record {fifo}: not a regular file" in log

        # the live server: neither the doomed one nor the new one touched its session
        for root in (roots["doomed"], roots["new"]):
            assert "'kept'" not in log_of(root)
        assert record_of(live).read_bytes() == kept_record
        assert all(running(psutil.Process(p)) for p in kept_pids)
        status, listed = live.call("GET", f"{API}/sessions/kept")
        assert (status, listed["state"]) == (200, "ready"), listed
        assert not record_of(new).exists()  # no session of its own, no record
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for server in servers:
            if server.process.poll() is None:
                stop_server(server)
    # a clean stop removes the server's record with its sessions
    assert not record_of(live).exists()
    assert not any(running(psutil.Process(p)) for p in kept_pids if psutil.pid_exists(p))
