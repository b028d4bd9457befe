"""Records of a server's live sessions, so that its successor can reap what it left behind.

The server extension keeps one file per server in the Jupyter runtime folder (where the
server's own ``jpserver-PID.json`` lives), ``jupyter_dist-sessions-PID.json``, mode 0600,
rewritten atomically whenever a session starts, restarts or stops, and removed when the
server stops cleanly. It names the server (pid and start time) and, for each session, the
processes it started on this machine (agents and rank kernels, each with its start time,
so that a reused pid is never mistaken for ours) and those on other nodes.

Agents kill their ranks when the server goes away, so leftovers only outlive a killed
server when an agent could not act (stopped, wedged). A starting server reads every record
whose server is gone (or whose pid now belongs to another process), stops the recorded
processes that still run (SIGTERM and SIGCONT to their process group, SIGKILL after a
grace), logs what it did, and deletes the record. Processes on other nodes are named in
the log but not checked: their agents lost their SSH connection and kill their ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import psutil

from jupyter_dist.common.payloads import ManagerEvent, SessionStatus

RECORD_PREFIX = "jupyter_dist-sessions-"
RECORD_VERSION = 1
#: psutil derives start times from the boot time, which Linux may report a second apart
CREATE_TIME_TOLERANCE_S = 1.0
REAP_GRACE_S = 5.0


def record_path(runtime_dir: Path, pid: int) -> Path:
    """The record file of the server with ``pid``."""
    return runtime_dir / f"{RECORD_PREFIX}{pid}.json"


# -- process identity -----------------------------------------------------------------------
def create_time(pid: int, parent: int | None = None) -> float | None:
    """When process ``pid`` started; None where it is gone, a zombie, or (with ``parent``)
    not a child of ``parent``."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if parent is not None and proc.ppid() != parent:
            return None
        return float(proc.create_time())
    except psutil.Error:
        return None


def same_process(pid: int, started: float) -> bool:
    """Whether ``pid`` still is the process that started at ``started``."""
    now = create_time(pid)
    return now is not None and abs(now - started) < CREATE_TIME_TOLERANCE_S


# -- the record -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedProcess:
    """A process a session started: on this machine with its start time, or on ``host``."""

    pid: int
    role: str  # "agent", "rank 3"
    create_time: float | None = None  # None: on another node
    host: str = ""

    def describe(self) -> str:
        where = f"{self.host} " if self.create_time is None and self.host else ""
        return f"{where}pid {self.pid} ({self.role})"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"pid": self.pid, "role": self.role}
        if self.create_time is not None:
            data["create_time"] = self.create_time
        if self.host:
            data["host"] = self.host
        return data

    @classmethod
    def from_json(cls, data: Any, local: bool) -> RecordedProcess:
        if not isinstance(data, dict):
            raise ValueError(f"a process entry is not an object: {data!r}")
        pid, role = data.get("pid"), data.get("role", "")
        started, host = data.get("create_time"), data.get("host", "")
        if not _is_int(pid) or pid <= 0:
            raise ValueError(f"bad pid {pid!r}")
        if not isinstance(role, str) or not isinstance(host, str):
            raise ValueError(f"bad role or host of pid {pid}")
        if not local:
            if started is not None:
                raise ValueError(f"pid {pid}: a process on another node has no create_time")
            return cls(pid, role, None, host)
        if not _is_number(started):
            raise ValueError(f"pid {pid}: bad create_time {started!r}")
        return cls(pid, role, float(started), host)


@dataclass(frozen=True)
class SessionRecord:
    """One session's processes: ``local`` ones can be checked and killed from here."""

    name: str
    local: tuple[RecordedProcess, ...] = ()
    remote: tuple[RecordedProcess, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "local": [p.to_json() for p in self.local],
            "remote": [p.to_json() for p in self.remote],
        }

    @classmethod
    def from_json(cls, data: Any) -> SessionRecord:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError(f"a session entry needs a name: {data!r}")
        parts: dict[str, tuple[RecordedProcess, ...]] = {}
        for key, local in (("local", True), ("remote", False)):
            entries = data.get(key, [])
            if not isinstance(entries, list):
                raise ValueError(f"session {data['name']!r}: {key!r} is not a list")
            parts[key] = tuple(RecordedProcess.from_json(e, local) for e in entries)
        return cls(data["name"], parts["local"], parts["remote"])


@dataclass(frozen=True)
class ServerRecord:
    """A server (pid and start time) and its live sessions."""

    pid: int
    create_time: float
    sessions: tuple[SessionRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "server": {"pid": self.pid, "create_time": self.create_time},
            "sessions": [s.to_json() for s in self.sessions],
        }

    @classmethod
    def from_json(cls, data: Any) -> ServerRecord:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown record version {data.get('version')!r}")
        server = data.get("server")
        if not isinstance(server, dict):
            raise ValueError("no 'server' entry")
        pid, started = server.get("pid"), server.get("create_time")
        if not _is_int(pid) or pid <= 0 or not _is_number(started):
            raise ValueError(f"bad server pid {pid!r} or create_time {started!r}")
        sessions = data.get("sessions", [])
        if not isinstance(sessions, list):
            raise ValueError("'sessions' is not a list")
        return cls(pid, float(started), tuple(SessionRecord.from_json(s) for s in sessions))

    def alive(self) -> bool:
        """Whether the recording server still runs (its pid, with its start time)."""
        return same_process(self.pid, self.create_time)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def write_record(path: Path, record: ServerRecord) -> None:
    """Write ``record`` to ``path`` atomically, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: mode 0600
            json.dump(record.to_json(), out, indent=1)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(path: Path) -> ServerRecord:
    """The record in ``path``; ValueError when it is not one, OSError when unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not text: {err}") from err
    return ServerRecord.from_json(data)  # json.JSONDecodeError is a ValueError


@dataclass(frozen=True)
class Orphaned:
    """The record, in ``path``, of a server that is gone."""

    path: Path
    record: ServerRecord


def find_orphaned(runtime_dir: Path, log: logging.Logger) -> list[Orphaned]:
    """The records in ``runtime_dir`` whose server no longer runs; records that cannot be
    read are logged and left alone, as are those of live servers."""
    found = []
    try:
        paths = sorted(runtime_dir.glob(f"{RECORD_PREFIX}*.json"))
    except OSError as err:
        log.warning("jupyter_dist: cannot list session records in %s: %s", runtime_dir, err)
        return []
    for path in paths:
        try:
            record = read_record(path)
        except FileNotFoundError:
            continue  # its server stopped (or another reaper took it) while we looked
        except (OSError, ValueError) as err:
            log.warning("jupyter_dist: skipping session record %s: %s", path, err)
            continue
        if not record.alive():
            found.append(Orphaned(path, record))
    return found


# -- building records from the manager's session status ----------------------------------
def session_record(status: SessionStatus, server_pid: int) -> SessionRecord:
    """The record of a session from its ``Session.status()``.

    Local processes are kept only while they are what the session started: the agent a
    child of the server, each rank a child of its agent; a process already gone is left
    out. Sessions on listed hosts (ssh, slurm) are remote, even when a host is this machine.
    """
    remote_session = bool(status.get("spec", {}).get("hosts"))
    agents: dict[int, int] = {}
    local: list[RecordedProcess] = []
    remote: list[RecordedProcess] = []

    def add(pid: int, role: str, host: str, parent: int) -> None:
        if remote_session:
            remote.append(RecordedProcess(pid, role, None, host))
        elif (started := create_time(pid, parent)) is not None:
            local.append(RecordedProcess(pid, role, started, host))

    for node in status.get("nodes", []):
        pid = node.get("agent_pid")
        if pid:
            agents[int(node["node_rank"])] = int(pid)
            add(int(pid), "agent", str(node.get("host", "")), server_pid)
    for rank in status.get("ranks", []):
        pid, agent = rank.get("pid"), agents.get(int(rank.get("node_rank", 0)))
        if pid and agent and rank.get("state") != "dead":
            add(int(pid), f"rank {rank['rank']}", str(rank.get("host", "")), agent)
    return SessionRecord(str(status["name"]), tuple(local), tuple(remote))


def _identity(status: SessionStatus) -> tuple[Any, ...]:
    """What in a status changes the record: the processes, not the cells run."""
    return (
        tuple((n.get("node_rank"), n.get("agent_pid")) for n in status.get("nodes", [])),
        tuple(
            (r.get("rank"), r.get("pid"), r.get("state") == "dead") for r in status.get("ranks", [])
        ),
    )


class SessionRecorder:
    """Keeps this server's record file in step with the manager's session events."""

    def __init__(self, runtime_dir: Path, log: logging.Logger, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        started = create_time(self.pid)
        self.create_time = started if started is not None else time.time()
        self.path = record_path(runtime_dir, self.pid)
        self.log = log
        self._sessions: dict[str, tuple[tuple[Any, ...], SessionRecord]] = {}
        self._failed = False

    def record(self) -> ServerRecord:
        sessions = tuple(self._sessions[name][1] for name in sorted(self._sessions))
        return ServerRecord(self.pid, self.create_time, sessions)

    def observe(self, event: ManagerEvent) -> None:
        """Take one `SessionManager` event; rewrite the record if its processes changed."""
        if event["type"] == "session":
            status = event["session"]
            name = str(status["name"])
            if status.get("state") == "stopped":
                changed = self._sessions.pop(name, None) is not None
            else:
                identity = _identity(status)
                known = self._sessions.get(name)
                changed = known is None or known[0] != identity
                if changed:
                    self._sessions[name] = (identity, session_record(status, self.pid))
        elif event["type"] == "removed":
            changed = self._sessions.pop(str(event["name"]), None) is not None
        else:
            return
        if changed:
            self.write()

    def write(self) -> None:
        """Write the record, or remove it when there is no session (logging, not raising,
        when the runtime folder refuses)."""
        try:
            if self._sessions:
                write_record(self.path, self.record())
            else:
                self.path.unlink(missing_ok=True)
            self._failed = False
        except OSError as err:
            if not self._failed:  # once, not on every change
                self.log.warning("jupyter_dist: cannot write %s: %s", self.path, err)
            self._failed = True

    def remove(self) -> None:
        """The server stops cleanly: its sessions are gone, and so is its record."""
        self._sessions.clear()
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)


# -- reaping --------------------------------------------------------------------------------
@dataclass
class ReapResult:
    """What became of one session's recorded processes."""

    killed: list[RecordedProcess]  # still ours and running: signalled, now gone
    survived: list[RecordedProcess]  # still ours and running after SIGKILL
    gone: list[RecordedProcess]  # exited already, or the pid now names another process


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(proc: psutil.Process, sig: int) -> None:
    """``sig`` to the process's group where it leads one (its workers go too), else to it;
    never to a pid that another process has taken since (`is_running` checks)."""
    try:
        if not proc.is_running():
            return
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except (OSError, psutil.Error):
        pass


def _wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still running after up to ``timeout`` seconds."""
    left = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in left if _running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def reap_processes(
    procs: Sequence[RecordedProcess], grace: float = REAP_GRACE_S
) -> tuple[list[RecordedProcess], list[RecordedProcess], list[RecordedProcess]]:
    """Stop the recorded local processes that still are ours: SIGTERM (and SIGCONT, so
    a stopped one can act on it), then SIGKILL after ``grace`` seconds.

    Returns (killed, survived, gone) as in `ReapResult`.
    """
    handles: dict[RecordedProcess, psutil.Process] = {}
    gone = []
    for rec in procs:
        if rec.create_time is None or not same_process(rec.pid, rec.create_time):
            gone.append(rec)
            continue
        try:
            handles[rec] = psutil.Process(rec.pid)
        except psutil.Error:
            gone.append(rec)
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for proc in handles.values():
            _signal(proc, sig)
    left = _wait_gone(handles.values(), grace)
    for proc in left:
        _signal(proc, signal.SIGKILL)
    left = _wait_gone(left, 5.0)
    survived = [rec for rec, proc in handles.items() if proc in left]
    killed = [rec for rec in handles if rec not in survived]
    return killed, survived, gone


def reap(orphaned: Orphaned, log: logging.Logger, grace: float = REAP_GRACE_S) -> None:
    """Stop what the dead server of ``orphaned`` left running, log one line per session,
    and delete its record."""
    record = orphaned.record
    every = [p for s in record.sessions for p in s.local]
    killed, survived, _gone = reap_processes(every, grace)
    for session in record.sessions:
        log_reaped(log, record.pid, session, killed, survived)
    try:
        orphaned.path.unlink(missing_ok=True)
    except OSError as err:
        log.warning("jupyter_dist: cannot remove %s: %s", orphaned.path, err)


def log_reaped(
    log: logging.Logger,
    server_pid: int,
    session: SessionRecord,
    killed: Sequence[RecordedProcess],
    survived: Sequence[RecordedProcess],
) -> None:
    """One line for one session of a dead server: a warning when something was left."""
    done = [p for p in killed if p in session.local]
    stuck = [p for p in survived if p in session.local]
    parts = []
    if done:
        parts.append("stopped its leftover processes " + ", ".join(p.describe() for p in done))
    if stuck:
        parts.append("could not stop " + ", ".join(p.describe() for p in stuck))
    if session.remote:
        parts.append(
            "did not check its processes on other nodes "
            + ", ".join(p.describe() for p in session.remote)
            + " (their agents stop them when the SSH connection drops)"
        )
    if not parts:
        log.info(
            "jupyter_dist: session %r of dead server pid %d left no process running",
            session.name,
            server_pid,
        )
        return
    log.warning(
        "jupyter_dist: reaped session %r of dead server pid %d: %s",
        session.name,
        server_pid,
        "; ".join(parts),
    )


__all__ = [
    "RECORD_PREFIX",
    "Orphaned",
    "RecordedProcess",
    "ServerRecord",
    "SessionRecord",
    "SessionRecorder",
    "find_orphaned",
    "read_record",
    "reap",
    "reap_processes",
    "record_path",
    "session_record",
    "write_record",
]
