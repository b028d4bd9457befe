"""The server's session records: writing, reading, finding a dead server's, reaping."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_dist.server.process_records import (
    Orphaned,
    RecordedProcess,
    ServerRecord,
    SessionRecord,
    SessionRecorder,
    find_orphaned,
    read_record,
    reap,
    record_path,
    write_record,
)

log = logging.getLogger("test_session_records")
ME = psutil.Process()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def family() -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """A stand-in agent (its own process group, a child of this process) with two
    stand-in ranks (its children)."""
    agent = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True)
    deadline = time.monotonic() + 30
    kids: list[psutil.Process] = []
    while len(kids) < 2 and time.monotonic() < deadline:
        kids = psutil.Process(agent.pid).children()
        time.sleep(0.02)
    assert len(kids) == 2
    yield agent, sorted(k.pid for k in kids)
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            kid.kill()  # psutil checks that the pid still is that process
    agent.kill()
    agent.wait()


def status(
    name: str, agent: int, ranks: list[int], hosts: tuple[str, ...] = (), **extra: Any
) -> dict[str, Any]:
    """What `Session.status()` says, as far as records care."""
    host = hosts[0] if hosts else "here"
    return {
        "name": name,
        "state": "ready",
        "spec": {"name": name, "hosts": [{"name": h} for h in hosts]},
        "nodes": [{"node_rank": 0, "host": host, "agent_pid": agent}],
        "ranks": [
            {"rank": i, "node_rank": 0, "host": host, "pid": pid, "state": "idle"}
            for i, pid in enumerate(ranks)
        ],
        **extra,
    }


def sample() -> ServerRecord:
    return ServerRecord(
        4242,
        1700000000.25,
        (
            SessionRecord(
                "train",
                (
                    RecordedProcess(11, "agent", 1700000001.5, "box"),
                    RecordedProcess(12, "rank 0", 1700000002.0, "box"),
                ),
            ),
            SessionRecord("far", (), (RecordedProcess(99, "agent", None, "gpu1"),)),
        ),
    )


def test_a_record_round_trips_atomically_and_privately(tmp_path: Path) -> None:
    path = record_path(tmp_path / "runtime", 4242)
    assert path.name == "jupyter_dist-sessions-4242.json"
    write_record(path, sample())
    assert read_record(path) == sample()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_record(path, ServerRecord(4242, 1.0))
    assert read_record(path) == ServerRecord(4242, 1.0)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "Expecting property name"),
        (b"\xff\xfe\x00binary", "not text"),
        (b"[]", "not a JSON object"),
        (b'{"version": 99}', "unknown record version 99"),
        (b'{"version": 1}', "no 'server' entry"),
        (b'{"version": 1, "server": {"pid": "x", "create_time": 1}}', "bad server pid 'x'"),
        (b'{"version": 1, "server": {"pid": 5, "create_time": 1}, "sessions": {}}', "not a list"),
        (
            b'{"version": 1, "server": {"pid": 5, "create_time": 1}, "sessions": [{}]}',
            "needs a name",
        ),
        (
            b'{"version": 1, "server": {"pid": 5, "create_time": 1}, "sessions": '
            b'[{"name": "s", "local": [{"pid": 7, "role": "agent"}]}]}',
            "pid 7: bad create_time None",
        ),
        (
            b'{"version": 1, "server": {"pid": 5, "create_time": 1}, "sessions": '
            b'[{"name": "s", "local": [{"pid": -1, "role": "agent", "create_time": 1}]}]}',
            "bad pid -1",
        ),
    ],
)
def test_a_bad_record_is_skipped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, reason: str
) -> None:
    bad = tmp_path / "jupyter_dist-sessions-1.json"
    bad.write_bytes(content)
    dead = ServerRecord(ME.pid, ME.create_time() - 1000)  # our pid, another start: gone
    write_record(record_path(tmp_path, 2), dead)
    with caplog.at_level(logging.WARNING, logger=log.name):
        found = find_orphaned(tmp_path, log)
    assert found == [Orphaned(record_path(tmp_path, 2), dead)]
    [line] = [r.getMessage() for r in caplog.records]
    assert str(bad) in line and reason in line, line
    assert bad.exists()  # not ours to delete: it may be a newer version's


def test_only_records_of_servers_that_are_gone_are_orphaned(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    records = {
        "live": ServerRecord(ME.pid, ME.create_time()),
        "exited": ServerRecord(gone.pid, time.time() - 5),
        "pid reused": ServerRecord(ME.pid, ME.create_time() - 3600),
    }
    for i, record in enumerate(records.values()):
        write_record(record_path(tmp_path, 1000 + i), record)
    (tmp_path / "jpserver-1.json").write_text("{}")  # the server's own files: not ours
    found = {o.record for o in find_orphaned(tmp_path, log)}
    assert found == {records["exited"], records["pid reused"]}
    assert find_orphaned(tmp_path / "missing", log) == []


def test_the_recorder_follows_sessions_and_leaves_out_what_is_not_theirs(
    tmp_path: Path, family: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    agent, ranks = family
    recorder = SessionRecorder(tmp_path, log, pid=ME.pid)  # the test stands in for the server
    assert recorder.path == record_path(tmp_path, ME.pid)
    recorder.observe({"type": "progress", "name": "a", "text": "starting"})
    assert not recorder.path.exists()

    stranger = ME.pid  # a live process that is no child of the agent
    pids = [*ranks, stranger]
    recorder.observe({"type": "session", "session": status("a", agent.pid, pids)})
    record = read_record(recorder.path)
    assert (record.pid, record.create_time) == (ME.pid, ME.create_time())
    [session] = record.sessions
    assert [(p.pid, p.role) for p in session.local] == [
        (agent.pid, "agent"),
        (ranks[0], "rank 0"),
        (ranks[1], "rank 1"),
    ]
    assert session.local[0].create_time == psutil.Process(agent.pid).create_time()
    assert session.remote == ()

    recorder.path.unlink()  # a cell ran: the processes did not change, nor does the file
    recorder.observe(
        {"type": "session", "session": status("a", agent.pid, pids, cells_run=3, state="busy")}
    )
    assert not recorder.path.exists()

    recorder.observe({"type": "session", "session": status("far", 77, [78, 79], hosts=("gpu1",))})
    far = read_record(recorder.path).sessions[1]
    assert far.name == "far" and far.local == ()
    assert [(p.pid, p.host, p.create_time) for p in far.remote] == [
        (77, "gpu1", None),
        (78, "gpu1", None),
        (79, "gpu1", None),
    ]
    assert [s.name for s in read_record(recorder.path).sessions] == ["a", "far"]

    recorder.observe({"type": "removed", "name": "far"})
    assert [s.name for s in read_record(recorder.path).sessions] == ["a"]
    recorder.observe({"type": "session", "session": status("a", agent.pid, ranks, state="stopped")})
    assert not recorder.path.exists()  # no session, no record

    recorder.observe({"type": "session", "session": status("a", agent.pid, ranks)})
    assert recorder.path.exists()
    recorder.remove()
    assert not recorder.path.exists()


def test_reaping_stops_a_stopped_agent_and_its_ranks_and_deletes_the_record(
    tmp_path: Path,
    family: tuple[subprocess.Popen[bytes], list[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, ranks = family
    recorder = SessionRecorder(tmp_path, log, pid=ME.pid)
    recorder.observe({"type": "session", "session": status("doomed", agent.pid, ranks)})
    os.kill(agent.pid, signal.SIGSTOP)  # wedged, it could not stop its ranks itself
    dead = ServerRecord(4242, 1.0, read_record(recorder.path).sessions)
    write_record(recorder.path, dead)
    with caplog.at_level(logging.INFO, logger=log.name):
        reap(Orphaned(recorder.path, dead), log, grace=30)
    assert not any(alive(p) for p in [agent.pid, *ranks])
    assert not recorder.path.exists()
    [line] = [r for r in caplog.records]
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    assert "reaped session 'doomed' of dead server pid 4242" in text, text
    for pid, role in [(agent.pid, "agent"), (ranks[0], "rank 0"), (ranks[1], "rank 1")]:
        assert f"pid {pid} ({role})" in text, text


def test_reaping_kills_what_ignores_sigterm_but_never_a_reused_pid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
    )
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        started = psutil.Process(stubborn.pid).create_time()
        other = psutil.Process(bystander.pid).create_time() - 3600  # the pid was reused since
        record = ServerRecord(
            4242,
            1.0,
            (
                SessionRecord("stubborn", (RecordedProcess(stubborn.pid, "agent", started),)),
                SessionRecord(
                    "old",
                    (RecordedProcess(bystander.pid, "rank 0", other),),
                    (RecordedProcess(55, "agent", None, "gpu1"),),
                ),
                SessionRecord("quiet", (RecordedProcess(bystander.pid, "agent", other),)),
            ),
        )
        path = record_path(tmp_path, 4242)
        write_record(path, record)
        with caplog.at_level(logging.INFO, logger=log.name):
            reap(Orphaned(path, record), log, grace=0.5)
        assert stubborn.wait(30) == -9
        assert alive(bystander.pid)
        lines = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert lines[0][0] == logging.WARNING
        assert (
            f"'stubborn' of dead server pid 4242: stopped its leftover processes pid {stubborn.pid}"
            in (lines[0][1])
        )
        assert lines[1][0] == logging.WARNING
        assert "'old'" in lines[1][1] and "did not check" in lines[1][1]
        assert "gpu1 pid 55 (agent)" in lines[1][1] and str(bystander.pid) not in lines[1][1]
        assert lines[2] == (
            logging.INFO,
            "jupyter_dist: session 'quiet' of dead server pid 4242 left no process running",
        )
        assert len(lines) == 3
        assert not path.exists()
    finally:
        for proc in (stubborn, bystander):
            proc.kill()
            proc.wait()
        if stubborn.stdout is not None:
            stubborn.stdout.close()


def test_a_record_is_plain_json(tmp_path: Path) -> None:
    path = record_path(tmp_path, 4242)
    write_record(path, sample())
    data = json.loads(path.read_text())
    assert data["server"] == {"pid": 4242, "create_time": 1700000000.25}
    assert data["sessions"][0]["local"][0] == {
        "pid": 11,
        "role": "agent",
        "create_time": 1700000001.5,
        "host": "box",
    }
    assert data["sessions"][1]["remote"] == [{"pid": 99, "role": "agent", "host": "gpu1"}]
