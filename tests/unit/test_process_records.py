"""The server's session records: writing, reading, finding a dead server's, reaping."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_dist.common.proc_titles import is_ours
from jupyter_dist.server.process_records import (
    Machine,
    Orphaned,
    RecordedProcess,
    ServerRecord,
    SessionRecord,
    SessionRecorder,
    find_orphaned,
    identify,
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


def titled(title: str, *argv: str) -> list[str]:
    """``argv`` run under ``title``, as an agent or rank shows (`is_ours`)."""
    return ["bash", "-c", 'exec -a "$0" "$@"', title, *argv]


#: two stand-in ranks, titled as real ones are
RANKS_SCRIPT = (
    "(exec -a 'jupyter_dist rank 0/2 session doomed' sleep 600) & "
    "(exec -a 'jupyter_dist rank 1/2 session doomed' sleep 600) & wait"
)


def two_children(pid: int) -> list[psutil.Process]:
    """The two children ``pid`` starts, once both are there (30 s at most)."""
    deadline = time.monotonic() + 30
    kids: list[psutil.Process] = []
    while len(kids) < 2 and time.monotonic() < deadline:
        kids = psutil.Process(pid).children()
        time.sleep(0.02)
    assert len(kids) == 2
    return kids


@pytest.fixture
def family() -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """A stand-in agent (its own process group, a child of this process) with two
    stand-in ranks (its children), titled as real ones are."""
    agent = subprocess.Popen(
        titled("jupyter_dist agent node 0 session doomed", "bash", "-c", RANKS_SCRIPT),
        start_new_session=True,
    )
    kids = two_children(agent.pid)
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
    host = hosts[0] if hosts else socket.gethostname()  # what a local agent reports
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


AGENT_CMD = ("jupyter_dist agent node 0 session train",)
BOX = Machine("box", "0e867495-bd13-42eb-8517-e05992d39608", "pid:[4026531836]")


def sample() -> ServerRecord:
    return ServerRecord(
        4242,
        1700000000.25,
        (
            SessionRecord(
                "train",
                (
                    RecordedProcess(11, "agent", 1700000001.5, "box", 1000, AGENT_CMD),
                    RecordedProcess(12, "rank 0", 1700000002.0, "box", 1000, ("python", "-m", "x")),
                ),
            ),
            SessionRecord("far", (), (RecordedProcess(99, "agent", None, "gpu1"),)),
        ),
        BOX,
    )


def test_a_record_round_trips_atomically_and_privately(tmp_path: Path) -> None:
    path = record_path(tmp_path / "runtime", 4242, "box")
    assert path.name == "jupyter_dist-sessions-box-4242.json"
    write_record(path, sample())
    assert read_record(path) == sample()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_record(path, ServerRecord(4242, 1.0))
    assert read_record(path) == ServerRecord(4242, 1.0, (), Machine.here())
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


SERVER = b'"server": {"pid": 5, "create_time": 1, "host": "h", "boot_id": "b", "pid_namespace": ""}'


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "Expecting property name"),
        (b"\xff\xfe\x00binary", "not text"),
        (b"[]", "not a JSON object"),
        (b'{"version": 99}', "unknown record version 99"),
        (b'{"version": 1, "server": {"pid": 5, "create_time": 1}}', "unknown record version 1"),
        (b'{"version": 2}', "no 'server' entry"),
        (b'{"version": 2, "server": {"pid": "x", "create_time": 1}}', "bad server pid 'x'"),
        (b'{"version": 2, "server": {"pid": 5, "create_time": 1}}', "bad server host None"),
        (
            b'{"version": 2, "server": {"pid": 5, "create_time": 1, "host": "", "boot_id": "b", '
            b'"pid_namespace": ""}}',
            "host or boot_id is empty",
        ),
        (b'{"version": 2, ' + SERVER + b', "sessions": {}}', "not a list"),
        (b'{"version": 2, ' + SERVER + b', "sessions": [{}]}', "needs a name"),
        (
            b'{"version": 2, ' + SERVER + b', "sessions": '
            b'[{"name": "s", "local": [{"pid": 7, "role": "agent"}]}]}',
            "pid 7: bad create_time None",
        ),
        (
            b'{"version": 2, ' + SERVER + b', "sessions": '
            b'[{"name": "s", "local": [{"pid": 7, "role": "agent", "create_time": 1}]}]}',
            "pid 7: bad uid None",
        ),
        (
            b'{"version": 2, ' + SERVER + b', "sessions": [{"name": "s", "local": '
            b'[{"pid": 7, "role": "agent", "create_time": 1, "uid": 0, "cmdline": []}]}]}',
            "pid 7: bad cmdline []",
        ),
        (
            b'{"version": 2, ' + SERVER + b', "sessions": [{"name": "s", "remote": '
            b'[{"pid": 7, "role": "agent", "uid": 0}]}]}',
            "pid 7: a process on another node has no identity here",
        ),
        (
            b'{"version": 2, ' + SERVER + b', "sessions": '
            b'[{"name": "s", "local": [{"pid": -1, "role": "agent", "create_time": 1}]}]}',
            "bad pid -1",
        ),
    ],
)
def test_a_bad_record_is_skipped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, reason: str
) -> None:
    bad = tmp_path / "jupyter_dist-sessions-x-1.json"
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
    assert record.machine == Machine.here()
    assert [(p.pid, p.role) for p in session.local] == [
        (agent.pid, "agent"),
        (ranks[0], "rank 0"),
        (ranks[1], "rank 1"),
    ]
    assert session.local[0].create_time == psutil.Process(agent.pid).create_time()
    assert {p.uid for p in session.local} == {os.getuid()}
    assert [p.cmdline[0] for p in session.local] == [
        "jupyter_dist agent node 0 session doomed",
        "jupyter_dist rank 0/2 session doomed",
        "jupyter_dist rank 1/2 session doomed",
    ]
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
            "from jupyter_dist.common.proc_titles import set_title; "
            "assert set_title('jupyter_dist agent node 0 session stubborn', 'jd-agent-0'); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
    )
    bystander = subprocess.Popen(titled("jupyter_dist rank 0/1 session old", "sleep", "600"))
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        me = identify(stubborn.pid)
        assert me is not None
        byst = identify(bystander.pid)
        assert byst is not None
        assert is_ours(byst.cmdline)  # left alone for its start time alone
        # the pid was reused since
        other = replace(byst, create_time=byst.create_time - 3600)
        record = ServerRecord(
            4242,
            1.0,
            (
                SessionRecord("stubborn", (RecordedProcess.local(stubborn.pid, "agent", me),)),
                SessionRecord(
                    "old",
                    (RecordedProcess.local(bystander.pid, "rank 0", other),),
                    (RecordedProcess(55, "agent", None, "gpu1"),),
                ),
                SessionRecord("quiet", (RecordedProcess.local(bystander.pid, "agent", other),)),
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
    assert data["version"] == 2
    assert data["server"] == {
        "pid": 4242,
        "create_time": 1700000000.25,
        "host": "box",
        "boot_id": "0e867495-bd13-42eb-8517-e05992d39608",
        "pid_namespace": "pid:[4026531836]",
    }
    assert data["sessions"][0]["local"][0] == {
        "pid": 11,
        "role": "agent",
        "create_time": 1700000001.5,
        "host": "box",
        "uid": 1000,
        "cmdline": ["jupyter_dist agent node 0 session train"],
    }
    assert data["sessions"][1]["remote"] == [{"pid": 99, "role": "agent", "host": "gpu1"}]


# -- records that are not this machine's, or name processes that are not ours ------------------
@pytest.fixture
def bystanders() -> Iterator[list[psutil.Process]]:
    """An unrelated process group of this user's: bash and two sleeps, in their own
    session, as an interactive job would run."""
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True
    )
    kids = two_children(leader.pid)
    yield [psutil.Process(leader.pid), *kids]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()


def dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def reap_as_a_new_server(runtime: Path) -> None:
    """What `DistServerApp` does at start, with a short grace."""
    for found in find_orphaned(runtime, log):
        reap(found, log, grace=0.5)


def entry(proc: psutil.Process, role: str, host: str) -> dict[str, Any]:
    return {
        "pid": proc.pid,
        "role": role,
        "create_time": proc.create_time(),
        "host": host,
        "uid": proc.uids().real,
        "cmdline": [a for a in proc.cmdline() if a],
    }


def hand_written(procs: list[psutil.Process], **changes: Any) -> dict[str, Any]:
    """A record of a dead server on this machine naming ``procs`` exactly as they are,
    written by hand; ``changes`` replace its server's fields or every process's."""
    here = Machine.here()
    server = {
        "pid": dead_pid(),
        "create_time": time.time() - 60,
        "host": here.host,
        "boot_id": here.boot_id,
        "pid_namespace": here.pid_namespace,
    }
    local = [
        entry(p, "agent" if i == 0 else f"rank {i - 1}", here.host) for i, p in enumerate(procs)
    ]
    for key, value in changes.items():
        if key in server:
            server[key] = value
        else:
            for e in local:
                e[key] = value
    return {"version": 2, "server": server, "sessions": [{"name": "hand", "local": local}]}


def test_a_hand_written_record_of_another_host_naming_an_unrelated_group_kills_nothing(
    tmp_path: Path, bystanders: list[psutil.Process]
) -> None:
    """The audit's record: bash and two sleeps of this user's, each with its true start
    time, marked as another login node's, in the format servers before host checks wrote."""
    record = {
        "version": 1,
        "server": {"pid": dead_pid(), "create_time": time.time() - 60, "host": "login2"},
        "sessions": [
            {
                "name": "x",
                "local": [
                    {
                        "pid": p.pid,
                        "role": "agent",
                        "create_time": p.create_time(),
                        "host": "login2",
                    }
                    for p in bystanders
                ],
            }
        ],
    }
    path = tmp_path / "jupyter_dist-sessions-77777.json"
    path.write_text(json.dumps(record))
    reap_as_a_new_server(tmp_path)
    assert all(alive(p.pid) for p in bystanders)
    assert path.exists()  # not this machine's to delete either


@pytest.mark.parametrize(
    ("changes", "what"),
    [
        ({"host": "login2"}, "the server ran on another host"),
        ({"boot_id": "5a1e1b7e-0000-4000-8000-000000000000"}, "before this machine restarted"),
        ({"pid_namespace": "pid:[4026532999]"}, "in another container"),
        ({"uid": os.getuid() + 1}, "another user's processes"),
        ({"cmdline": ["jupyter_dist agent node 0 session other"]}, "not the command recorded"),
    ],
)
def test_a_record_is_not_acted_on_unless_machine_and_processes_are_the_ones_recorded(
    tmp_path: Path,
    family: tuple[subprocess.Popen[bytes], list[int]],
    changes: dict[str, Any],
    what: str,
) -> None:
    agent, ranks = family
    procs = [psutil.Process(p) for p in [agent.pid, *ranks]]
    write = tmp_path / "jupyter_dist-sessions-h-1.json"
    write.write_text(json.dumps(hand_written(procs, **changes)))
    reap_as_a_new_server(tmp_path)
    assert all(alive(p.pid) for p in procs), what

    # the same record with nothing changed: those processes are reaped
    write.write_text(json.dumps(hand_written(procs)))
    reap_as_a_new_server(tmp_path)
    assert not any(alive(p.pid) for p in procs)
    assert not write.exists()


def test_processes_that_are_not_agents_or_ranks_are_never_reaped(
    tmp_path: Path, bystanders: list[psutil.Process]
) -> None:
    """Even recorded exactly (start time, owner, command line) on this machine."""
    path = tmp_path / "jupyter_dist-sessions-h-1.json"
    path.write_text(json.dumps(hand_written(bystanders)))
    reap_as_a_new_server(tmp_path)
    assert all(alive(p.pid) for p in bystanders)
    assert not path.exists()  # this machine's dead server's: read, and done with


def test_a_local_process_recorded_on_another_host_is_left_alone(
    tmp_path: Path, family: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    agent, ranks = family
    procs = [psutil.Process(p) for p in [agent.pid, *ranks]]
    record = hand_written(procs)
    for e in record["sessions"][0]["local"]:
        e["host"] = "login2"
    (tmp_path / "jupyter_dist-sessions-h-1.json").write_text(json.dumps(record))
    reap_as_a_new_server(tmp_path)
    assert all(alive(p.pid) for p in procs)


def test_records_of_the_same_pid_on_two_hosts_are_two_files(tmp_path: Path) -> None:
    """A shared runtime folder: a server here must not overwrite, nor delete as its own
    predecessor's, the record of a server with its pid on another machine."""
    theirs = record_path(tmp_path, ME.pid, "login2")
    write_record(theirs, ServerRecord(ME.pid, 1.0, (), Machine("login2", "b", "")))
    recorder = SessionRecorder(tmp_path, log, pid=ME.pid)
    assert recorder.path != theirs and recorder.path == record_path(tmp_path, ME.pid)
    assert find_orphaned(tmp_path, log) == []  # another machine's: not ours to judge
    recorder.remove()
    assert theirs.exists()


def run_bounded(target: Any, timeout: float, unblock: Path | None = None) -> bool:
    """Run ``target`` in a thread; whether it finished within ``timeout`` s. A reader left
    blocked on the FIFO ``unblock`` is released afterwards."""
    import threading

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    finished = not thread.is_alive()
    if not finished and unblock is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
    return finished


def test_a_fifo_or_link_named_like_a_record_is_skipped_without_hanging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fifo = tmp_path / "jupyter_dist-sessions-h-1.json"
    os.mkfifo(fifo)
    real = record_path(tmp_path / "elsewhere", 2)
    write_record(real, ServerRecord(2, 1.0))  # a dead server's record of this machine
    link = tmp_path / "jupyter_dist-sessions-h-3.json"
    link.symlink_to(real)
    dead = ServerRecord(ME.pid, ME.create_time() - 1000)
    write_record(record_path(tmp_path, 4), dead)
    found: list[Orphaned] = []
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert run_bounded(lambda: found.extend(find_orphaned(tmp_path, log)), 20, fifo)
    assert found == [Orphaned(record_path(tmp_path, 4), dead)]
    lines = sorted(r.getMessage() for r in caplog.records)
    assert len(lines) == 2, lines
    assert str(fifo) in lines[0] and "not a regular file" in lines[0], lines
    assert str(link) in lines[1] and "not a regular file" in lines[1], lines
    assert fifo.exists() and link.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_record_owned_by_another_user_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = record_path(tmp_path, 5)
    write_record(path, ServerRecord(5, 1.0))
    os.chown(path, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert find_orphaned(tmp_path, log) == []
    [line] = [r.getMessage() for r in caplog.records]
    assert "owned by uid 65534, not by this user" in line, line
    assert path.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user")
def test_another_users_process_is_never_reaped(tmp_path: Path) -> None:
    """A server run as root must not kill another user's process, even one recorded."""
    other = subprocess.Popen(
        titled("jupyter_dist agent node 0 session theirs", "sleep", "600"),
        user=65534,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(other.pid).cmdline()[0].startswith("jupyter_dist"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc = psutil.Process(other.pid)
        record = hand_written([proc])  # its uid, 65534, recorded as it is
        assert record["sessions"][0]["local"][0]["uid"] == 65534
        (tmp_path / "jupyter_dist-sessions-h-1.json").write_text(json.dumps(record))
        reap_as_a_new_server(tmp_path)
        assert alive(other.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_the_runtime_folder_is_made_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = record_path(tmp_path / "runtime", 4242)
        write_record(path, sample())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
