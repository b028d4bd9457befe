"""A throwaway single-node Slurm on this machine, owned by the test run.

Three daemons, each with its own files in ``workdir``: ``munged`` (its own key and
socket), ``slurmctld`` and ``slurmd`` (a ``slurm.conf`` of their own on free ports; the
node is this machine, named by its short hostname, at 127.0.0.1). Client commands find
the cluster through ``SLURM_CONF``, which `SlurmCluster.env` sets; nothing of the
machine's own Slurm or munge configuration is read or touched.

Needs root (slurmd starts job steps as their user) and Debian's ``munge``,
``slurmctld``, ``slurmd`` and ``slurm-client``; ``.ci/setup-system`` installs them.

    with slurm_cluster(workdir=tmp_path) as cluster:
        subprocess.run(["sinfo"], env=cluster.env())
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SlurmCluster", "clean_environment", "missing_requirements", "slurm_cluster"]

SBIN = Path("/usr/sbin")
#: program -> Debian package
_TOOLS = {
    "munged": "munge",
    "munge": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmstepd": "slurmd",
    "srun": "slurm-client",
    "salloc": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
}
#: Unix socket paths (munge's, slurmstepd's in the spool folder) must fit in 108 bytes.
_MAX_WORKDIR = 70
#: A loaded two-core machine may take a while; a healthy start takes a few seconds.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class SlurmCluster:
    """A running single-node cluster: node ``node`` (this machine) in partition ``test``."""

    workdir: Path
    conf: Path
    node: str
    cpus: int
    pids: Mapping[str, int] = field(default_factory=dict)  # daemon name -> pid

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) without any other cluster's
        Slurm variables, and with ``SLURM_CONF`` naming this cluster's configuration."""
        env = clean_environment(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(
        self, argv: Sequence[str], *, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster, capturing its output."""
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"`{shlex.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def jobs(self) -> list[str]:
        """Ids of the jobs the controller still knows as pending or running."""
        return self.run(["squeue", "--noheader", "--format=%i"]).stdout.split()

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of every daemon's output, for error messages."""
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            text = _read(self.workdir / "log" / f"{name}.out")
            tail = "\n".join(text.splitlines()[-lines:]) or "(empty)"
            parts.append(f"--- {name}\n{tail}")
        return "\n".join(parts)

    def step_daemons(self) -> list[int]:
        """Pids of the slurmstepd processes of this cluster (they hold its slurmd log)."""
        return [pid for pid in self.processes() if _comm(pid) == "slurmstepd"]

    def processes(self) -> list[int]:
        """Every live process holding a file of this cluster open: the daemons, their
        helpers (slurmscriptd) and the job steps' slurmstepd."""
        return _holders_of(self.workdir)


def clean_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without Slurm's variables: an outer allocation must not leak into ours."""
    prefixes = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_", "SLURMD_")
    return {k: v for k, v in base.items() if not k.startswith(prefixes)}


def missing_requirements() -> list[str]:
    """What this machine lacks to run the cluster; empty when it can."""
    if sys.platform != "linux":
        return [f"needs Linux (this is {sys.platform})"]
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (slurmd starts job steps as their user)")
    for tool, package in _TOOLS.items():
        if _which(tool) is None:
            problems.append(f"`{tool}` not found (Debian package {package})")
    return problems


@contextlib.contextmanager
def slurm_cluster(*, workdir: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd; on exit cancel every job and stop them all.

    Configuration, keys, state and the daemons' logs (``log/NAME.out``, ``log/NAME.log``)
    live in ``workdir``. A daemon that does not come up raises RuntimeError with the last
    lines of every log.
    """
    problems = missing_requirements()
    if problems:
        raise RuntimeError("cannot start a test Slurm: " + "; ".join(problems))
    workdir = Path(workdir).absolute()
    if len(str(workdir)) > _MAX_WORKDIR or any(c in str(workdir) for c in " #\n"):
        raise ValueError(f"workdir must be short and plain (Unix socket paths): {workdir}")
    for sub in ("munge", "state", "spool", "log"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".", 1)[0]
    hardware = _node_hardware()
    conf = _write_config(workdir, node, hardware)
    pids: dict[str, int] = {}
    cluster = SlurmCluster(workdir, conf, node, _node_cpus(hardware), pids)
    try:
        _start(cluster, pids)
        yield cluster
    finally:
        _stop(cluster, pids)


# --- start ---------------------------------------------------------------------------------


def _start(cluster: SlurmCluster, pids: dict[str, int]) -> None:
    munge = cluster.workdir / "munge"
    munge.chmod(0o755)  # munged wants its socket's folder reachable by every user
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    pids["munged"] = _spawn(
        cluster,
        "munged",
        [
            _tool("munged"),
            "--foreground",
            "--force",
            f"--socket={munge / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
        ],
    )
    _wait(cluster, "munged", lambda: _munge_works(munge / "munge.socket"))
    pids["slurmctld"] = _spawn(cluster, "slurmctld", [_tool("slurmctld"), "-D", "-c"])
    _wait(cluster, "slurmctld", lambda: _ping(cluster))
    slurmd = [_tool("slurmd"), "-D", "-N", cluster.node]
    pids["slurmd"] = _spawn(cluster, "slurmd", slurmd)
    _wait(cluster, "slurmd", lambda: _node_state(cluster) == "idle")


def _write_config(workdir: Path, node: str, hardware: str) -> Path:
    ctld_port, slurmd_port = _free_ports(2)
    plugstack = workdir / "plugstack.conf"
    plugstack.write_text("# no SPANK plugins\n")
    log = workdir / "log"
    settings = {
        "ClusterName": "jdtest",
        "SlurmctldHost": f"{node}(127.0.0.1)",
        "SlurmctldPort": ctld_port,
        "SlurmdPort": slurmd_port,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={workdir / 'munge' / 'munge.socket'}",
        "StateSaveLocation": workdir / "state",
        "SlurmdSpoolDir": workdir / "spool",
        "SlurmctldPidFile": workdir / "slurmctld.pid",
        "SlurmdPidFile": workdir / "slurmd.pid",
        "SlurmctldLogFile": log / "slurmctld.log",
        "SlurmdLogFile": log / "slurmd.log",
        "PlugStackConfig": plugstack,
        "MailProg": "/bin/true",
        # Track a step's processes by parentage: the agent's ranks leave its process
        # group (setsid), which proctrack/pgid would lose; no cgroups needed.
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "SchedulerType": "sched/builtin",
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "JobCompType": "jobcomp/none",
        "MpiDefault": "none",
        "ReturnToService": 2,
        "InactiveLimit": 0,
        "KillWait": 5,
        # generous: the test machine may be busy with other tests
        "MessageTimeout": 60,
        "SlurmctldTimeout": 300,
        "SlurmdTimeout": 300,
    }
    lines = [f"# the jupyter_dist test cluster in {workdir} (generated)"]
    lines += [f"{key}={value}" for key, value in settings.items()]
    lines.append(f"NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN")
    lines.append(f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP")
    conf = workdir / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _node_hardware() -> str:
    """``CPUs=.. Boards=.. SocketsPerBoard=.. ... RealMemory=..`` as ``slurmd -C`` sees it."""
    result = subprocess.run(
        [_tool("slurmd"), "-C"], capture_output=True, text=True, timeout=60, check=False
    )
    first = result.stdout.splitlines()[0] if result.stdout.strip() else ""
    words = [w for w in first.split() if "=" in w and not w.startswith("NodeName=")]
    if result.returncode != 0 or not any(w.startswith("CPUs=") for w in words):
        return f"CPUs={os.cpu_count() or 1}"
    return " ".join(words)


def _node_cpus(hardware: str) -> int:
    for word in hardware.split():
        if word.startswith("CPUs="):
            return int(word.removeprefix("CPUs="))
    return os.cpu_count() or 1


def _spawn(cluster: SlurmCluster, name: str, argv: Sequence[str]) -> int:
    """Start a daemon in the foreground of a detached shell; its output goes to
    ``log/NAME.out`` (Slurm's daemons also keep ``log/NAME.log``, which slurmstepd shares).

    Its parent, a shell, exits at once, so it is nobody's child here (leak checks that
    walk this process's children see none of it), and a terminal's Ctrl-C misses it.
    """
    outer = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    log = cluster.workdir / "log" / f"{name}.out"
    result = subprocess.run(
        ["sh", "-c", outer, "sh", str(log), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=cluster.env(),
        start_new_session=True,
    )
    return int(result.stdout)


def _wait(cluster: SlurmCluster, name: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    pid = cluster.pids[name]
    while not ready():
        if not _running(pid):
            raise RuntimeError(f"{name} exited during start-up:\n{cluster.log_tails()}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{name} not ready after {START_TIMEOUT:.0f} s:\n{cluster.log_tails()}"
            )
        time.sleep(0.2)


def _munge_works(sock: Path) -> bool:
    if not sock.exists():
        return False
    argv = [_tool("munge"), f"--socket={sock}", "--no-input"]
    result = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    return result.returncode == 0


def _ping(cluster: SlurmCluster) -> bool:
    result = cluster.run(["scontrol", "ping"], check=False)
    return result.returncode == 0 and " is UP" in result.stdout


def _node_state(cluster: SlurmCluster) -> str:
    argv = ["sinfo", "--noheader", f"--nodes={cluster.node}", "--format=%T"]
    return cluster.run(argv, check=False).stdout.strip()


# --- stop ----------------------------------------------------------------------------------


def _stop(cluster: SlurmCluster, pids: Mapping[str, int]) -> None:
    """Cancel every job, stop the daemons in reverse order, kill any step left over.

    Keeps going through errors (and Ctrl-C, re-raised at the end); raises RuntimeError
    naming what survived.
    """
    interrupt: BaseException | None = None
    problems: list[str] = []
    steps: list[tuple[str, Callable[[], None]]] = [
        ("cancel jobs", lambda: _cancel_jobs(cluster, pids)),
        *((f"stop {name}", _stopper(pids[name])) for name in reversed(list(pids))),
        ("kill what is left", lambda: _kill_all(cluster.processes())),
    ]
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            problems.append(f"{what}: {exc}")
        except BaseException as exc:  # KeyboardInterrupt: finish cleaning up first
            interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt
    left = [pid for pid in {*pids.values(), *cluster.processes()} if _running(pid)]
    if problems or left:
        raise RuntimeError(f"test Slurm cleanup failed: {problems}; still running: {left}")


def _cancel_jobs(cluster: SlurmCluster, pids: Mapping[str, int]) -> None:
    if "slurmctld" not in pids or not _running(pids["slurmctld"]):
        return
    jobs = cluster.jobs()
    if jobs:
        cluster.run(["scancel", *jobs], check=False)
    deadline = time.monotonic() + STOP_TIMEOUT
    while cluster.jobs() or cluster.step_daemons():
        if time.monotonic() > deadline:
            return  # what is left is killed below
        time.sleep(0.2)


def _stopper(pid: int) -> Callable[[], None]:
    return lambda: _kill_all([pid], signal.SIGTERM)


def _kill_all(pids: Sequence[int], first: signal.Signals = signal.SIGKILL) -> None:
    """Send ``first`` to ``pids``; SIGKILL those still there after a while."""
    for pid in pids:
        _signal(pid, first)
    deadline = time.monotonic() + STOP_TIMEOUT
    while alive := [pid for pid in pids if _running(pid)]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {alive} survive SIGKILL")
        if first != signal.SIGKILL and time.monotonic() > deadline - STOP_TIMEOUT / 2:
            for pid in alive:
                _signal(pid, signal.SIGKILL)
        time.sleep(0.05)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


# --- small helpers -------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def _holders_of(folder: Path) -> list[int]:
    """Live processes (other than this one) with a file in ``folder`` open."""
    found = []
    prefix = f"{folder}/"
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            fds = Path(f"/proc/{name}/fd").iterdir()
            if any(os.readlink(fd).startswith(prefix) for fd in fds) and _running(int(name)):
                found.append(int(name))
    return found


def _comm(pid: int) -> str:
    return _read(Path(f"/proc/{pid}/comm")).strip()


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports nobody listens on right now."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path=str(SBIN))


def _tool(name: str) -> str:
    path = _which(name)
    if path is None:
        raise RuntimeError(f"`{name}` not found (Debian package {_TOOLS[name]})")
    return path


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
