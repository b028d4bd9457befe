"""Records of a server's live sessions, so that its successor can reap what it left behind.

The server extension keeps one file per server in the Jupyter runtime folder (where the
server's own ``jpserver-PID.json`` lives), ``jupyter_dist-sessions-HOST-PID.json``, mode
0600, rewritten atomically whenever a session starts, restarts or stops, and removed when
the server stops cleanly. It names the server (pid and start time) and the machine it
runs on (host name, boot id, pid namespace) and, for each session, the processes it
started on this machine (agents and rank kernels, each with its start time, owner and
command line, so that a reused pid is never mistaken for ours) and those on other nodes.

Agents kill their ranks when the server goes away, so leftovers only outlive a killed
server when an agent could not act (stopped, wedged). A starting server reads every record
whose server is gone (or whose pid now belongs to another process), stops the recorded
processes that still run (SIGTERM and SIGCONT to their process group, SIGKILL after a
grace), logs what it did, and deletes the record. Processes on other nodes are named in
the log but not checked: their agents lost their SSH connection and kill their ranks.

The runtime folder is often shared (a home folder on NFS seen by several login nodes, a
volume mounted into several containers), so a record is acted on only by a server on the
machine that wrote it: same host name, same boot, same pid namespace; records of other
machines are left alone. A recorded process is signalled only while it still is the one
recorded: same start time, owned by this user, the same command line, and that command
line one of ours (`common.proc_titles.is_ours`). Files that are not regular files owned by
this user are skipped without being opened for reading in a way that could block.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import psutil

from jupyter_dist.common.payloads import ClusterHold, ManagerEvent, SessionStatus
from jupyter_dist.common.private_files import read_private_file
from jupyter_dist.common.proc_titles import command_line, is_ours
from jupyter_dist.common.spec import CLUSTER_LAUNCHERS

RECORD_PREFIX = "jupyter_dist-sessions-"
RECORD_VERSION = 2
#: psutil derives start times from the boot time, which Linux may report a second apart
CREATE_TIME_TOLERANCE_S = 1.0
REAP_GRACE_S = 5.0
#: a record is a few hundred bytes a process; anything far larger is not one of ours
MAX_RECORD_BYTES = 4 << 20
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def server_tag(pid: int, host: str | None = None) -> str:
    """``HOST-PID``, what names the files of the server with ``pid`` on ``host`` (this
    machine by default): servers on machines that share the runtime folder may have the
    same pid."""
    name = _UNSAFE.sub("_", socket.gethostname() if host is None else host)[:64] or "_"
    return f"{name}-{pid}"


def record_path(runtime_dir: Path, pid: int, host: str | None = None) -> Path:
    """The record file of the server with ``pid`` on ``host`` (this machine by default)."""
    return runtime_dir / f"{RECORD_PREFIX}{server_tag(pid, host)}.json"


# -- the machine ----------------------------------------------------------------------------
def boot_id() -> str:
    """This boot's id ("" where Linux does not say): pids of another boot mean nothing."""
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as f:
            return f.read(64).strip()
    except (OSError, ValueError):
        return ""


def pid_namespace() -> str:
    """This process's pid namespace, ``pid:[4026531836]`` ("" where unknown): containers
    on one machine share its boot id but not their pids."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class Machine:
    """Where pids were recorded; they name the same processes only on the same machine
    since the same boot, in the same pid namespace."""

    host: str
    boot_id: str
    pid_namespace: str

    @classmethod
    def here(cls) -> Machine:
        return cls(socket.gethostname(), boot_id(), pid_namespace())

    def describe(self) -> str:
        return f"host {self.host!r}, boot {self.boot_id!r}, pid namespace {self.pid_namespace!r}"


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


@dataclass(frozen=True)
class Identity:
    """What tells a process from a later one with its pid: start time, owner (real uid),
    command line."""

    create_time: float
    uid: int
    cmdline: tuple[str, ...]


def identify(pid: int, parent: int | None = None) -> Identity | None:
    """Process ``pid``'s `Identity`; None where it is gone, a zombie, or (with ``parent``)
    not a child of ``parent``."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if parent is not None and proc.ppid() != parent:
                return None
            return Identity(
                float(proc.create_time()), int(proc.uids().real), command_line(proc.cmdline())
            )
    except psutil.Error:
        return None


# -- the record -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedProcess:
    """A process a session started: on this machine with its start time, owner and command
    line, or on ``host``."""

    pid: int
    role: str  # "agent", "rank 3"
    create_time: float | None = None  # None: on another node
    host: str = ""
    uid: int | None = None  # None: on another node
    cmdline: tuple[str, ...] = ()

    @classmethod
    def local(cls, pid: int, role: str, identity: Identity, host: str = "") -> RecordedProcess:
        return cls(pid, role, identity.create_time, host, identity.uid, identity.cmdline)

    def describe(self) -> str:
        where = f"{self.host} " if self.create_time is None and self.host else ""
        return f"{where}pid {self.pid} ({self.role})"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"pid": self.pid, "role": self.role}
        if self.create_time is not None:
            data["create_time"] = self.create_time
        if self.host:
            data["host"] = self.host
        if self.uid is not None:
            data["uid"] = self.uid
        if self.cmdline:
            data["cmdline"] = list(self.cmdline)
        return data

    @classmethod
    def from_json(cls, data: Any, local: bool) -> RecordedProcess:
        if not isinstance(data, dict):
            raise ValueError(f"a process entry is not an object: {data!r}")
        pid, role = data.get("pid"), data.get("role", "")
        started, host = data.get("create_time"), data.get("host", "")
        uid, cmdline = data.get("uid"), data.get("cmdline")
        if not _is_int(pid) or pid <= 0:
            raise ValueError(f"bad pid {pid!r}")
        if not isinstance(role, str) or not isinstance(host, str):
            raise ValueError(f"bad role or host of pid {pid}")
        if not local:
            if started is not None or uid is not None or cmdline is not None:
                raise ValueError(f"pid {pid}: a process on another node has no identity here")
            return cls(pid, role, None, host)
        if not _is_number(started):
            raise ValueError(f"pid {pid}: bad create_time {started!r}")
        if not _is_int(uid) or uid < 0:
            raise ValueError(f"pid {pid}: bad uid {uid!r}")
        if (
            not isinstance(cmdline, list)
            or not cmdline
            or not all(isinstance(a, str) for a in cmdline)
        ):
            raise ValueError(f"pid {pid}: bad cmdline {cmdline!r}")
        return cls(pid, role, float(started), host, uid, tuple(cmdline))


@dataclass(frozen=True)
class ClusterRecord:
    """What a session holds on a cluster manager (`common.payloads.ClusterHold`): on
    ``kind``'s cluster at ``address``, everything named under ``owner``; on Kubernetes, in
    ``namespace``, reached through the kubeconfig's ``context``."""

    kind: str
    address: str
    owner: str
    namespace: str | None = None
    context: str | None = None

    def to_json(self) -> ClusterHold:
        out: ClusterHold = {"kind": self.kind, "address": self.address, "owner": self.owner}
        if self.namespace is not None:
            out["namespace"] = self.namespace
            out["context"] = self.context
        return out

    @classmethod
    def from_json(cls, data: Any) -> ClusterRecord:
        if not isinstance(data, dict):
            raise ValueError(f"a cluster entry is not an object: {data!r}")
        kind, address, owner = (data.get(k) for k in ("kind", "address", "owner"))
        if not all(isinstance(v, str) and v for v in (kind, address, owner)):
            raise ValueError(f"bad cluster kind {kind!r}, address {address!r} or owner {owner!r}")
        namespace, context = data.get("namespace"), data.get("context")
        if not all(v is None or isinstance(v, str) for v in (namespace, context)):
            raise ValueError(f"bad cluster namespace {namespace!r} or context {context!r}")
        return cls(str(kind), str(address), str(owner), namespace, context)


@dataclass(frozen=True)
class SessionRecord:
    """One session's processes: ``local`` ones can be checked and killed from here; and
    what it holds on a cluster manager, if anything."""

    name: str
    local: tuple[RecordedProcess, ...] = ()
    remote: tuple[RecordedProcess, ...] = ()
    cluster: ClusterRecord | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "local": [p.to_json() for p in self.local],
            "remote": [p.to_json() for p in self.remote],
        }
        if self.cluster is not None:
            data["cluster"] = self.cluster.to_json()
        return data

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
        held = data.get("cluster")
        cluster = None if held is None else ClusterRecord.from_json(held)
        return cls(data["name"], parts["local"], parts["remote"], cluster)


@dataclass(frozen=True)
class ServerRecord:
    """A server (pid and start time, on ``machine``: this one by default) and its live
    sessions."""

    pid: int
    create_time: float
    sessions: tuple[SessionRecord, ...] = ()
    machine: Machine = field(default_factory=Machine.here)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "server": {
                "pid": self.pid,
                "create_time": self.create_time,
                "host": self.machine.host,
                "boot_id": self.machine.boot_id,
                "pid_namespace": self.machine.pid_namespace,
            },
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
        host, boot, pid_ns = (server.get(k) for k in ("host", "boot_id", "pid_namespace"))
        if not (isinstance(host, str) and isinstance(boot, str) and isinstance(pid_ns, str)):
            raise ValueError(f"bad server host {host!r}, boot_id {boot!r} or pid_namespace")
        if not host or not boot:
            raise ValueError("the server's host or boot_id is empty")
        sessions = data.get("sessions", [])
        if not isinstance(sessions, list):
            raise ValueError("'sessions' is not a list")
        return cls(
            pid,
            float(started),
            tuple(SessionRecord.from_json(s) for s in sessions),
            Machine(host, boot, pid_ns),
        )

    def alive(self) -> bool:
        """Whether the recording server still runs (its pid, with its start time); only
        asked of a record of this machine."""
        return same_process(self.pid, self.create_time)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def write_record(path: Path, record: ServerRecord, extra: Mapping[str, Any] | None = None) -> None:
    """Write ``record`` (with the ``extra`` keys beside its own) to ``path`` atomically,
    readable by this user only (in a folder only this user can enter, where it makes one)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: mode 0600
            json.dump({**(extra or {}), **record.to_json()}, out, indent=1)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(path: Path) -> ServerRecord:
    """The record in ``path``; ValueError when it is not one (or not a regular file of
    this user's), OSError when unreadable."""
    return read_record_with_extra(path)[0]


def read_record_with_extra(path: Path) -> tuple[ServerRecord, dict[str, Any]]:
    """The record in ``path`` and the whole JSON object it is in (where `write_record`
    put its ``extra`` keys); raises as `read_record`."""
    raw = read_private_file(path, MAX_RECORD_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not text: {err}") from err
    return ServerRecord.from_json(data), data  # json.JSONDecodeError is a ValueError


@dataclass(frozen=True)
class Orphaned:
    """The record, in ``path``, of a server that is gone."""

    path: Path
    record: ServerRecord


def find_orphaned(runtime_dir: Path, log: logging.Logger) -> list[Orphaned]:
    """The records in ``runtime_dir`` of this machine whose server no longer runs; records
    that cannot be read are logged and left alone, as are those of live servers and those
    of other machines (or of this one before it restarted)."""
    found: list[Orphaned] = []
    here = Machine.here()
    if not here.boot_id:
        log.info("jupyter_dist: no boot id in %s: session records are left alone", BOOT_ID_FILE)
        return found
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
        if record.machine != here:
            log.debug("jupyter_dist: %s is another machine's (%s)", path, record.machine.describe())
            continue
        if not record.alive():
            found.append(Orphaned(path, record))
    return found


# -- building records from the manager's session status ----------------------------------
def session_record(status: SessionStatus, server_pid: int) -> SessionRecord:
    """The record of a session from its ``Session.status()``.

    Local processes are kept only while they are what the session started: the agent a
    child of the server, each rank a child of its agent; a process already gone is left
    out. Sessions on listed hosts (ssh, slurm) or placed by a cluster manager (ray) are
    remote, even when a node is this machine; what a session holds on a cluster is kept.
    """
    spec = status.get("spec", {})
    remote_session = bool(spec.get("hosts")) or spec.get("launcher") in CLUSTER_LAUNCHERS
    held = status.get("cluster")
    cluster = None if not held else ClusterRecord.from_json(held)
    agents: dict[int, int] = {}
    local: list[RecordedProcess] = []
    remote: list[RecordedProcess] = []

    def add(pid: int, role: str, host: str, parent: int) -> None:
        if remote_session:
            remote.append(RecordedProcess(pid, role, None, host))
        elif (identity := identify(pid, parent)) is not None:
            local.append(RecordedProcess.local(pid, role, identity, host))

    for node in status.get("nodes", []):
        pid = node.get("agent_pid")
        if pid:
            agents[int(node["node_rank"])] = int(pid)
            add(int(pid), "agent", str(node.get("host", "")), server_pid)
    for rank in status.get("ranks", []):
        pid, agent = rank.get("pid"), agents.get(int(rank.get("node_rank", 0)))
        if pid and agent and rank.get("state") != "dead":
            add(int(pid), f"rank {rank['rank']}", str(rank.get("host", "")), agent)
    return SessionRecord(str(status["name"]), tuple(local), tuple(remote), cluster)


def _identity(status: SessionStatus) -> tuple[Any, ...]:
    """What in a status changes the record: the processes and what the session holds on
    a cluster, not the cells run."""
    return (
        tuple(sorted((status.get("cluster") or {}).items())),
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
        self.machine = Machine.here()
        self.path = record_path(runtime_dir, self.pid, self.machine.host)
        self.log = log
        self._sessions: dict[str, tuple[tuple[Any, ...], SessionRecord]] = {}
        self._failed = False

    def record(self) -> ServerRecord:
        sessions = tuple(self._sessions[name][1] for name in sorted(self._sessions))
        return ServerRecord(self.pid, self.create_time, sessions, self.machine)

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


def still_ours(rec: RecordedProcess) -> psutil.Process | None:
    """The process ``rec`` names when it still is the one recorded: started then, owned
    by this user, with the command line recorded, which is one of ours; else None."""
    if rec.create_time is None or rec.uid is None or rec.uid != os.getuid():
        return None
    if not is_ours(rec.cmdline):
        return None
    try:
        proc = psutil.Process(rec.pid)
    except psutil.Error:
        return None
    now = identify(rec.pid)
    if now is None or abs(now.create_time - rec.create_time) >= CREATE_TIME_TOLERANCE_S:
        return None
    if now.uid != rec.uid or now.cmdline != rec.cmdline:
        return None
    return proc


def reap_processes(
    procs: Sequence[RecordedProcess], grace: float = REAP_GRACE_S, host: str | None = None
) -> tuple[list[RecordedProcess], list[RecordedProcess], list[RecordedProcess]]:
    """Stop the recorded local processes that still are ours (`still_ours`; with
    ``host``, recorded on it): SIGTERM (and SIGCONT, so a stopped one can act on it), then
    SIGKILL after ``grace`` seconds.

    Returns (killed, survived, gone) as in `ReapResult`.
    """
    handles: dict[RecordedProcess, psutil.Process] = {}
    gone = []
    for rec in procs:
        proc = None if host is not None and rec.host not in ("", host) else still_ours(rec)
        if proc is None:
            gone.append(rec)
        else:
            handles[rec] = proc
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
    if record.machine != Machine.here():  # find_orphaned returns none such
        log.warning("jupyter_dist: not reaping %s: another machine's record", orphaned.path)
        return
    every = [p for s in record.sessions for p in s.local]
    killed, survived, _gone = reap_processes(every, grace, record.machine.host)
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
        how = (
            "their agents stop them when the SSH connection drops"
            if session.cluster is None
            else f"they end with the session's {session.cluster.kind} actors"
        )
        parts.append(
            "did not check its processes on other nodes "
            + ", ".join(p.describe() for p in session.remote)
            + f" ({how})"
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
    "ClusterRecord",
    "Identity",
    "Machine",
    "Orphaned",
    "RecordedProcess",
    "ServerRecord",
    "SessionRecord",
    "SessionRecorder",
    "find_orphaned",
    "identify",
    "read_record",
    "read_record_with_extra",
    "reap",
    "reap_processes",
    "record_path",
    "server_tag",
    "session_record",
    "still_ours",
    "write_record",
]
