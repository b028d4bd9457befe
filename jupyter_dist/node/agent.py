"""The per-node agent: spawns this node's rank kernels and watches them.

Run as ``python -m jupyter_dist.node`` by a launcher (`control.launchers`: a local
subprocess, or over SSH or srun for other nodes), it talks JSON lines on stdin/stdout (see
`common.agent_protocol`; the messages are typed in `common.payloads`).

The agent imports torch and ipykernel once, before any rank exists, and then forks each
rank kernel from that warm process: a rank starts in a fraction of the time a fresh
interpreter needs, and a restart of the session costs only the fork. For fork to be
safe the agent stays single-threaded and never initialises CUDA (GPUs are counted
through NVML).

With the first rank it also forks the node's relay (`node.relay`), which carries every
rank's IOPub and shell to and from the notebook side in batches, on two sockets a node
(``relay_iopub`` and ``relay_shell`` in each ``spawned`` event's connection). It tells the
relay on a pipe which ranks to serve, and forks a new one if it dies.

It guarantees no orphans: each rank gets ``PR_SET_PDEATHSIG`` and ``JPY_PARENT_PID`` so
it dies with the agent, and the agent kills every rank when its stdin closes (the
notebook kernel or the SSH connection went away), on ``shutdown``, on SIGTERM, or when its
owner, which pings it, has said nothing for the ping's deadline (a link lost without a
reset closes nothing: `common.agent_protocol.Heartbeat`). What a rank started goes with
it, even a program that left the rank's process group (`node.rank_trees`: the agent is a
child subreaper, so a dead rank's orphans become its children).

Its private folder (``jd-PID-SESSION-XXXXXXXX`` in the temporary folder, 0700: the ranks'
connection files with the session's key, their sockets and logs) goes when it stops; an
agent that was SIGKILLed cannot remove it, so each agent first removes the folders of
this user's agents that are gone (their pid is dead and nobody holds their lock).

Agents, ranks and relays show what they are in ``ps`` and ``top`` (`common.proc_titles`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import importlib
import os
import re
import select
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from jupyter_dist.common.agent_protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    STACKS_SIGNAL,
    as_command,
    decode,
    describe_returncode,
    encode,
)
from jupyter_dist.common.payloads import (
    AgentErrorEvent,
    AgentEvent,
    KernelConnection,
    ReadLogCommand,
    ReadLogReply,
    ReplyFields,
    SpawnCommand,
)
from jupyter_dist.common.proc_titles import (
    NODE_RANK_VAR,
    agent_short_name,
    agent_title,
    rank_short_name,
    rank_title,
    relay_short_name,
    relay_title,
    set_title,
)
from jupyter_dist.common.process_folders import pid_alive
from jupyter_dist.common.process_tree import become_subreaper, unblock_signals
from jupyter_dist.common.temp_space import unwritable
from jupyter_dist.node.rank_trees import RankTrees
from jupyter_dist.node.relay import IOPUB_SOCKET, SHELL_SOCKET
from jupyter_dist.node.warm_imports import WarmImports
from jupyter_dist.rank.output_log import read_output, remove_parts
from jupyter_dist.rank.stack_dumps import FREE_REQUEST

if TYPE_CHECKING:
    from jupyter_dist.node.samples import Sampler

#: what every rank imports, imported once by the agent so that forked ranks start warm.
#: From ``ipykernel.debugger`` on: what a kernel imports as it initialises (debugpy alone
#: is 60-80 ms of CPU a rank, the rest 10-15 ms), which many ranks on few cores pay one
#: after another. A module missing here (another IPython) only goes unpreloaded.
PRELOAD = (
    "torch",
    "torch.distributed",
    "cloudpickle",
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.debugger",
    "IPython.core.debugger",
    "IPython.core.oinspect",
    "IPython.core.completerlib",
    "IPython.extensions.storemagic",
    "sqlite3",
    "tornado.platform.asyncio",
    "jupyter_dist.rank.bootstrap",
    "jupyter_dist.rank.kernel_app",
)
#: imported once the agent's first ranks run and it has been idle `WARM_AFTER_S`, off the
#: start's path: what a rank pays the first time a cell builds an optimizer (torch's
#: compiler stack, about 1 s of CPU), so that a rank forked later, to replace one that
#: died, is back to training as soon as the ranks that kept their state
LATE_PRELOAD = ("torch._dynamo",)
WARM_AFTER_S = 3.0
#: debugpy warns on stderr as it is imported that frozen modules may hide breakpoints
#: (about the interpreter, not the ranks' code): the agent's stderr is what a failed
#: start shows, so the check is off while the agent imports it (ranks' environment
#: is left as it was)
_QUIET_IMPORT_ENV = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}
_PR_SET_PDEATHSIG = 1
LOG_TAIL_BYTES = 16384
#: seconds a spawn waits for the rank's previous process, already being killed, to be
#: reaped (one stuck in the kernel, in a GPU driver or on NFS, outlives SIGKILL)
RESPAWN_WAIT_S = 15.0
STACKS_READ_LIMIT = 256 * 1024
#: an agent's private folder: ``jd-PID-SESSION-XXXXXXXX``, holding `LOCK_NAME`
DIR_PREFIX = "jd-"
_DIR_NAME = re.compile(r"jd-([0-9]{1,10})-.+")
#: held (flock) by the agent for its whole life: a folder whose lock is free is nobody's
LOCK_NAME = "agent.lock"


class SpawnRefused(Exception):
    """A spawn the node cannot carry out, said in words a user can act on (its error event
    carries the message alone, not the exception's type)."""


def described(err: Exception) -> str:
    """``err`` for an error event: a `SpawnRefused`'s words, else its type and message."""
    return str(err) if isinstance(err, SpawnRefused) else f"{type(err).__name__}: {err}"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block (a variable already set is left alone),
    then the environment as it was."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


@dataclass
class RelayChild:
    """The node's relay (`node.relay`), a forked child of the agent."""

    pid: int
    #: the agent's end of the pipe that tells it which ranks to read
    commands_fd: int
    key: bytes

    def tell(self, line: str) -> None:
        try:
            os.write(self.commands_fd, line.encode() + b"\n")
        except OSError as err:  # a dead relay: the agent forks a new one when it reaps it
            print(f"agent: the relay did not take {line!r}: {err}", file=sys.stderr)

    def close(self) -> None:
        if self.commands_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.commands_fd)
            self.commands_fd = -1


@dataclass
class RankChild:
    rank: int
    pid: int
    log: str
    connection_file: str
    #: the agent's end of the pipe a byte on which asks the rank for its stacks
    #: (`rank.stack_dumps`); -1 once closed
    stacks_fd: int = -1
    #: what the node's relay is told to serve the rank (`node.relay`)
    relay_line: str = ""

    def close(self) -> None:
        if self.stacks_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.stacks_fd)
            self.stacks_fd = -1


class Agent:
    """One node's agent; see the module docstring."""

    def __init__(self, out_fd: int, session: str, node: int | None = None) -> None:
        self.out_fd = out_fd
        self.pid = os.getpid()
        self.session = session
        self.node = node
        self.title = (agent_title(session, node), agent_short_name(node))
        self.base_env = dict(os.environ)
        try:  # a full or read-only temporary folder is said as such, not as a traceback
            prune_dead_agent_dirs(tempfile.gettempdir())
            # short: Unix socket paths inside it must stay under ~100 bytes
            self.dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{self.pid}-{session[:16]}-")
        except OSError as err:
            where = os.path.dirname(err.filename or "")
            raise SystemExit(f"agent: cannot make its folder: {unwritable(where, err)}") from None
        self._lock_fd = hold_lock(self.dir)
        self.children: dict[int, RankChild] = {}  # by pid
        self.relay: RelayChild | None = None  # forked with the first rank (its key)
        self.sampler: Sampler | None = None  # made on the first ``sample`` command
        self.kill_deadlines: dict[int, float] = {}  # pid -> when to SIGKILL
        self.trees = RankTrees(self.pid)  # what the ranks started
        #: rank -> (its spawn, when to give up): spawns waiting for the rank's previous
        #: process to be reaped
        self.waiting_spawns: dict[int, tuple[SpawnCommand, float]] = {}
        #: when to import `LATE_PRELOAD` (None: not yet due, or done)
        self.warm_due: float | None = None
        self.warmed = False
        self.stopping = False
        #: seconds of silence from the owner after which the ranks are stopped (set by
        #: its first ``ping``; 0: the owner does not ping)
        self.owner_deadline_s = 0.0
        self.last_heard = time.monotonic()
        self.preload_errors: dict[str, str] = {}
        self._inbuf = b""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        #: `LATE_PRELOAD`'s imports, and the spawns held while they run
        self.warm = WarmImports(LATE_PRELOAD, self._wake_w)
        self.held_spawns: list[SpawnCommand] = []

    # -- output ---------------------------------------------------------------------
    def emit(self, message: AgentEvent) -> None:
        data = encode(message)
        while data:
            try:
                data = data[os.write(self.out_fd, data) :]
            except BrokenPipeError:
                self.stopping = True
                return

    # -- start-up -------------------------------------------------------------------
    def preload(self) -> None:
        with _environment(_QUIET_IMPORT_ENV):
            for name in PRELOAD:
                try:
                    importlib.import_module(name)
                except Exception as err:  # reported to the launcher, which names the node
                    self.preload_errors[name] = f"{type(err).__name__}: {err}"

    def ready(self) -> None:
        from jupyter_dist._version import __version__
        from jupyter_dist.common.gpus import discover_gpus
        from jupyter_dist.common.ports import PORTS_VAR, free_port, parse_port_range

        torch_mod = sys.modules.get("torch")
        ports = os.environ.get(PORTS_VAR, "")
        self.emit(
            {
                "event": "ready",
                "protocol": PROTOCOL_VERSION,
                "host": socket.gethostname(),
                "pid": self.pid,
                "python": sys.executable,
                "dir": self.dir,
                "gpus": [g.to_json() for g in discover_gpus()],
                # any interface: other nodes connect here
                "free_port": free_port("", parse_port_range(ports) if ports else None),
                "versions": {
                    "jupyter_dist": __version__,
                    "torch": getattr(torch_mod, "__version__", None),
                    "python": sys.version.split()[0],
                },
                "preload_errors": self.preload_errors,
            }
        )

    # -- main loop ------------------------------------------------------------------
    def run(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        poller = select.poll()
        poller.register(0, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not (self.stopping and not self.children):
                timeout = self._next_timeout()
                try:
                    ready = poller.poll(timeout)
                except InterruptedError:
                    ready = []
                for fd, _ in ready:
                    if fd == 0:
                        self._read_commands()
                    else:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                self._reap()
                self._enforce_deadlines()
                self._release_held_spawns()
                self._retry_spawns()
                self._warm_up()
                self._check_owner()
                if self.stopping and self.children and not self.kill_deadlines:
                    self.kill(None, grace=2.0)
        finally:
            self._cleanup()

    def _on_term(self, *_: object) -> None:
        self.stopping = True

    def _warm_up(self) -> None:
        """`LATE_PRELOAD`, once, when due and nothing waits, imported in a thread of its
        own (`WarmImports`: spawns are held meanwhile, no fork happens beside it)."""
        if self.warm_due is None or self.waiting_spawns or time.monotonic() < self.warm_due:
            return
        self.warm_due, self.warmed = None, True
        if "torch" in sys.modules:
            self.warm.start()  # off this thread: pings are answered meanwhile

    def _release_held_spawns(self) -> None:
        """Fork the spawns held while `warm` imported (no fork beside an import)."""
        if self.warm.busy:
            return
        while self.held_spawns:
            cmd = self.held_spawns.pop(0)
            try:
                self.spawn(cmd)
            except Exception as err:
                rank = cmd["rank"]
                self.emit({"event": "error", "message": f"rank {rank}: {err}", "rank": rank})

    def _next_timeout(self) -> int | None:
        deadlines = [*self.kill_deadlines.values()]
        if self.warm_due is not None:
            deadlines.append(self.warm_due)
        # a waiting spawn goes on when its rank's old process is reaped (SIGCHLD wakes
        # the loop), or gives up at its deadline
        deadlines.extend(when for _, when in self.waiting_spawns.values())
        if self.owner_deadline_s and not self.stopping:
            deadlines.append(self.last_heard + self.owner_deadline_s)
        if not deadlines:
            return 1000 if self.stopping else None
        wait = min(deadlines) - time.monotonic()
        return max(0, int(wait * 1000) + 1)

    def _check_owner(self) -> None:
        """Stop every rank once the owner, which pings, has said nothing for its deadline:
        the link went down without a reset, or the owner is wedged; nobody can use these
        ranks any more, and they would hold their GPUs until TCP gives up (hours)."""
        if not self.owner_deadline_s or self.stopping:
            return
        silent = time.monotonic() - self.last_heard
        if silent >= self.owner_deadline_s:
            print(
                f"agent: no word from the notebook side for {silent:.0f} s "
                f"(deadline {self.owner_deadline_s:.0f} s); stopping every rank",
                file=sys.stderr,
            )
            self.stopping = True

    def _read_commands(self) -> None:
        chunk = os.read(0, 1 << 16)
        if not chunk:  # launcher gone: nobody may use these ranks any more
            self.stopping = True
            return
        self.last_heard = time.monotonic()
        self._inbuf += chunk
        *lines, self._inbuf = self._inbuf.split(b"\n")
        for line in lines:
            if line.strip():
                self._handle(line)
        if len(self._inbuf) > MAX_LINE_BYTES:  # no command is that long: not the protocol
            head = self._inbuf[:200]
            self._inbuf = b""
            message = f"a command line over {MAX_LINE_BYTES} bytes was dropped: {head!r}"
            self.emit({"event": "error", "message": message, "rank": None})

    def _handle(self, line: bytes) -> None:
        data: dict[str, Any] = {}
        try:
            data = decode(line)
            cmd = as_command(data)
            if cmd is None:
                message = f"unknown op {data.get('op')!r}"
                self.emit({"event": "error", "message": message, "rank": None})
            elif cmd["op"] == "spawn":
                self.spawn(cmd)
            elif cmd["op"] == "signal":
                self.signal_rank(int(cmd["rank"]), str(cmd["signal"]))
            elif cmd["op"] == "kill":
                ranks = cmd.get("ranks")
                self.kill(None if ranks is None else set(ranks), float(cmd.get("grace", 2.0)))
            elif cmd["op"] == "route":
                self.emit({"event": "reply", "id": cmd["id"], **route_to(str(cmd["addr"]))})
            elif cmd["op"] == "probe":
                reply = probe(str(cmd["addr"]), int(cmd["port"]), float(cmd.get("timeout_s", 5)))
                self.emit({"event": "reply", "id": cmd["id"], **reply})
            elif cmd["op"] == "stacks":
                ranks = cmd.get("ranks")
                offsets = self.dump_stacks(
                    None if ranks is None else set(ranks), bool(cmd.get("fallback", False))
                )
                self.emit({"event": "reply", "id": cmd["id"], "offsets": offsets})
            elif cmd["op"] == "free":
                freed = self.free_ranks(set(cmd.get("ranks") or ()))
                self.emit({"event": "reply", "id": cmd["id"], "ranks": freed})
            elif cmd["op"] == "sample":
                if self.sampler is None:
                    from jupyter_dist.node.samples import Sampler

                    self.sampler = Sampler()
                pids = {child.rank: pid for pid, child in self.children.items()}
                self.sampler.forget(set(pids.values()))
                sample = self.sampler.sample(pids)
                self.emit({"event": "reply", "id": cmd["id"], "sample": sample})
            elif cmd["op"] == "read_log":
                piece = self.read_log(cmd)
                self.emit(
                    {
                        "event": "reply",
                        "id": cmd["id"],
                        "text": piece["text"],
                        "start": piece["start"],
                        "end": piece["end"],
                        "path": piece["path"],
                    }
                )
            elif cmd["op"] == "ping":
                self.owner_deadline_s = max(0.0, float(cmd.get("deadline_s", 0)))
                self.emit({"event": "pong", "seq": int(cmd["seq"])})
            else:  # shutdown
                self.stopping = True
        except Exception as err:
            rank = data.get("rank")
            named = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
            error: AgentErrorEvent = {
                "event": "error",
                "message": f"{'' if named is None else f'rank {named}: '}{described(err)}",
                "rank": named,
            }
            if isinstance(data.get("id"), str):  # the request waiting for a reply fails
                error["id"] = data["id"]
            self.emit(error)

    # -- ranks ----------------------------------------------------------------------
    def _pid_of(self, rank: int) -> int | None:
        for pid, child in self.children.items():
            if child.rank == rank:
                return pid
        return None

    def spawn(self, cmd: SpawnCommand) -> None:
        """Fork rank ``cmd["rank"]``. Its previous process, if the agent is still killing
        it (a restart), is reaped first: the spawn waits for it, up to `RESPAWN_WAIT_S`."""
        rank = int(cmd["rank"])
        if self.warm.busy:
            self.held_spawns.append(cmd)
            return
        self._reap()
        old = self._pid_of(rank)
        if old is not None and old in self.kill_deadlines:
            self.waiting_spawns[rank] = (cmd, time.monotonic() + RESPAWN_WAIT_S)
            return
        if old is not None:
            raise RuntimeError(f"rank {rank} is already running on this node (pid {old})")
        self._fork_rank(cmd)

    def _retry_spawns(self) -> None:
        """Spawn the ranks whose previous process is gone now; give up on those whose
        previous process outlived SIGKILL for `RESPAWN_WAIT_S`."""
        if self.warm.busy:
            return  # no fork beside an import
        now = time.monotonic()
        for rank, (cmd, give_up) in list(self.waiting_spawns.items()):
            old = self._pid_of(rank)
            if old is not None and now < give_up:
                continue
            del self.waiting_spawns[rank]
            if old is not None:
                message = (
                    f"rank {rank}: its previous process (pid {old}, {_proc_state(old)}) "
                    f"was still there {RESPAWN_WAIT_S:g} s after SIGKILL, so no new rank "
                    "was started (a process stuck in the kernel, e.g. in a GPU driver or "
                    "on a network file system, cannot be killed until it returns)"
                )
                self.emit({"event": "error", "message": message, "rank": rank})
                continue
            try:
                self._fork_rank(cmd)
            except Exception as err:
                message = f"rank {rank}: {described(err)}"
                self.emit({"event": "error", "message": message, "rank": rank})

    def _fork_rank(self, cmd: SpawnCommand) -> None:
        from jupyter_client.connect import write_connection_file

        if not self.warmed:  # each spawn puts it off: the start's ranks come first
            self.warm_due = time.monotonic() + WARM_AFTER_S

        rank = int(cmd["rank"])
        conn_path = os.path.join(self.dir, f"rank-{rank}.json")
        log_path = os.path.join(self.dir, f"rank-{rank}.log")
        output_base = self._output_of(rank)
        remove_parts(output_base)  # a rank started again starts a new output log
        # Unix sockets in the agent's private (0700) folder: no TCP port is opened, and
        # only this user can connect (messages are HMAC-signed on top)
        try:
            _, cfg = write_connection_file(
                conn_path,
                ip=os.path.join(self.dir, f"rank-{rank}"),
                key=str(cmd["key"]).encode(),
                transport="ipc",
                signature_scheme="hmac-sha256",
                kernel_name="jupyter-dist-rank",
            )
        except OSError as err:  # a full temporary folder: said as such, with the folder
            with contextlib.suppress(OSError):
                os.unlink(conn_path)
            raise SpawnRefused(
                f"cannot write its connection file: {unwritable(self.dir, err)}"
            ) from None
        env = {**self.base_env, **cmd.get("env", {}), "JPY_PARENT_PID": str(self.pid)}
        cwd = str(cmd.get("cwd") or os.getcwd())
        world = env.get("WORLD_SIZE", "")
        if self.relay is None:
            self.start_relay(str(cmd["key"]).encode())
        pid, ask_w = self._fork(
            (
                rank_title(rank, int(world) if world.isdigit() else None, self.session),
                rank_short_name(rank),
            ),
            lambda ask_r: self._become_rank(conn_path, (log_path, output_base), env, cwd, ask_r),
        )
        os.set_blocking(ask_w, False)  # a rank that stopped reading never blocks the agent
        sockets = f"ipc://{cfg['ip']}-{cfg['iopub_port']} ipc://{cfg['ip']}-{cfg['shell_port']}"
        child = RankChild(rank, pid, log_path, conn_path, ask_w, f"+{rank} {sockets}")
        self.children[pid] = child
        connection = cast(KernelConnection, {k: v for k, v in cfg.items() if k != "key"})
        if self.relay is not None:
            self.relay.tell(child.relay_line)
            connection["relay_iopub"] = os.path.join(self.dir, IOPUB_SOCKET)
            connection["relay_shell"] = os.path.join(self.dir, SHELL_SOCKET)
        self.emit(
            {
                "event": "spawned",
                "rank": rank,
                "pid": pid,
                "connection": connection,
                "log": log_path,
            }
        )

    def _become_rank(
        self,
        conn_path: str,
        logs: tuple[str, str],
        env: dict[str, str],
        cwd: str,
        stacks_fd: int,
    ) -> int:
        """``logs``: the rank's process log and its output log's base."""
        log_path, output_base = logs
        os.setsid()  # own process group: interrupts reach the rank and its workers only
        log_fd = self._leave_agent(log_path, os.O_TRUNC, signal.default_int_handler)
        if log_fd < 0:
            return 1
        os.environ.clear()
        os.environ.update(env)
        try:
            os.chdir(cwd)
        except OSError:  # the notebook's folder need not exist on another node
            cwd = os.path.expanduser("~")
            os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        from jupyter_dist.rank.kernel_app import run_rank_kernel

        run_rank_kernel(conn_path, self.pid, log_fd, stacks_fd, output_base)
        return 0

    def _fork(self, title: tuple[str, str], become: Callable[[int], int]) -> tuple[int, int]:
        """Fork a child that runs ``become(read end of a new pipe)`` and exits with what it
        returns; returns its pid and the pipe's write end. The child is born with
        ``title`` (the agent wears it for the fork): it never shows as the agent, so what
        the server records of it stays true."""
        read_fd, write_fd = os.pipe()  # neither end reaches programs the child runs
        sys.stdout.flush()
        sys.stderr.flush()
        set_title(*title)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        finally:
            if os.getpid() == self.pid:
                set_title(*self.title)
        if pid == 0:  # the child; never returns
            code = 1
            try:
                os.close(write_fd)
                code = become(read_fd)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(read_fd)
        return pid, write_fd

    def _leave_agent(self, log_path: str, mode: int, on_interrupt: Any) -> int:
        """In a forked child: die with the agent, take the default signal handlers (and
        ``on_interrupt`` for SIGINT), close what only the agent may hold, read nothing and
        write to ``log_path`` (opened with ``mode``: truncate or append). Returns the log's
        descriptor, or -1 when the agent is already gone."""
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != self.pid:
            return -1
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, on_interrupt)
        self._close_agent_fds()
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null_fd)
        return log_fd

    def _close_agent_fds(self) -> None:
        """In a forked child: close what only the agent may hold."""
        for fd in (self._wake_r, self._wake_w, self.out_fd, self._lock_fd):
            os.close(fd)
        for sibling in self.children.values():
            sibling.close()
        if self.relay is not None:
            self.relay.close()

    # -- the IOPub relay --------------------------------------------------------------
    def start_relay(self, key: bytes) -> None:
        """Fork the node's relay and have it serve every rank already running."""
        pid, write_fd = self._fork(
            (relay_title(self.session, self.node), relay_short_name(self.node)),
            lambda read_fd: self._become_relay(key, read_fd),
        )
        self.relay = RelayChild(pid, write_fd, key)
        for child in self.children.values():
            self.relay.tell(child.relay_line)

    def _become_relay(self, key: bytes, commands: int) -> int:
        # interrupts are for ranks; one relay's log across its restarts
        log_fd = self._leave_agent(os.path.join(self.dir, "relay.log"), os.O_APPEND, signal.SIG_IGN)
        if log_fd < 0:
            return 1
        os.close(log_fd)
        from jupyter_dist.node.relay import run_relay

        return run_relay(key, self.dir, commands)

    def _relay_exited(self, status: int) -> None:
        """The relay died: fork another (the notebook side reconnects to its sockets)."""
        assert self.relay is not None
        key = self.relay.key
        self.relay.close()
        self.relay = None
        code = os.waitstatus_to_exitcode(status)
        print(f"agent: the relay exited ({describe_returncode(code)})", file=sys.stderr)
        if not self.stopping:
            self.start_relay(key)

    def _output_of(self, rank: int) -> str:
        """The base of rank ``rank``'s output log (`rank.output_log`)."""
        return os.path.join(self.dir, f"rank-{rank}.out")

    def read_log(self, cmd: ReadLogCommand) -> ReadLogReply:
        """A piece of a rank's log: its ``output`` (what its cells showed) or its
        ``diagnostics`` (the process log: C-level output, thread dumps; the default)."""
        rank, offset = int(cmd["rank"]), int(cmd["offset"])
        kind = cmd.get("kind", "diagnostics")
        if kind == "output":
            self._log_of(rank)  # the rank runs here
            base = self._output_of(rank)
            text, start, end = read_output(base, offset, STACKS_READ_LIMIT)
            return {"text": text, "start": start, "end": end, "path": base}
        if kind != "diagnostics":
            raise ValueError(f"kind {str(kind)[:40]!r} is not 'output' or 'diagnostics'")
        path = self._log_of(rank)
        text, end = _read_from(path, offset)
        return {"text": text, "start": offset, "end": end, "path": path}

    def _log_of(self, rank: int) -> str:
        for child in self.children.values():
            if child.rank == rank:
                return child.log
        raise RuntimeError(f"rank {rank} does not run on this node")

    def dump_stacks(self, ranks: set[int] | None, fallback: bool = False) -> dict[str, int]:
        """Ask each rank for every thread's Python stack; it writes them to its log at
        once, even while its main thread is stuck in a collective. Returns where each log
        ended before the dump (read it back with ``read_log``).

        A rank's own thread answers (`rank.stack_dumps`); ``fallback`` asks faulthandler's
        signal handler instead, for a rank that thread could not answer for."""
        offsets: dict[str, int] = {}
        for pid, child in self.children.items():
            if ranks is not None and child.rank not in ranks:
                continue
            try:
                offsets[str(child.rank)] = os.path.getsize(child.log)
                if fallback or child.stacks_fd < 0:
                    os.kill(pid, STACKS_SIGNAL)  # the process only, not its workers
                else:
                    os.write(child.stacks_fd, b"s")
            except BlockingIOError:  # the rank has unread requests: it answers those
                continue
            except (OSError, ProcessLookupError):
                offsets.pop(str(child.rank), None)
                continue
        return offsets

    def free_ranks(self, ranks: set[int]) -> list[int]:
        """Ask each of ``ranks`` to free its main thread from a collective of its process
        group (`rank.group_sockets`); the ranks asked."""
        asked: list[int] = []
        for child in self.children.values():
            if child.rank not in ranks or child.stacks_fd < 0:
                continue
            with contextlib.suppress(OSError):
                os.write(child.stacks_fd, FREE_REQUEST)
                asked.append(child.rank)
        return sorted(asked)

    def signal_rank(self, rank: int, name: str) -> None:
        pid = self._pid_of(rank)
        if pid is None:
            return
        sig = signal.Signals[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)

    def kill(self, ranks: set[int] | None, grace: float) -> None:
        """SIGTERM the ranks' process groups, SIGKILL whatever is left after ``grace``. A
        spawn of theirs still waiting for an earlier process is withdrawn."""
        deadline = time.monotonic() + grace
        for cmd in list(self.held_spawns):
            if ranks is None or int(cmd["rank"]) in ranks:
                self.held_spawns.remove(cmd)
                rank = int(cmd["rank"])
                message = f"rank {rank}: its start was withdrawn (the ranks were stopped)"
                self.emit({"event": "error", "message": message, "rank": rank})
        for rank in list(self.waiting_spawns):
            if ranks is None or rank in ranks:
                del self.waiting_spawns[rank]
                message = f"rank {rank}: its start was withdrawn (the ranks were stopped)"
                self.emit({"event": "error", "message": message, "rank": rank})
        for pid, child in list(self.children.items()):
            if ranks is not None and child.rank not in ranks:
                continue
            sig = signal.SIGTERM if grace > 0 else signal.SIGKILL
            self.trees.signal(pid, sig)  # first: the rank's death reparents them
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            self.kill_deadlines.setdefault(pid, deadline)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for pid, deadline in list(self.kill_deadlines.items()):
            if pid not in self.children:
                del self.kill_deadlines[pid]
            elif now >= deadline:
                self.trees.signal(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.kill_deadlines[pid] = now + 5.0

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.relay is not None and pid == self.relay.pid:
                self._relay_exited(status)
                continue
            child = self.children.pop(pid, None)
            self.kill_deadlines.pop(pid, None)
            if child is None:
                continue
            child.close()
            if self.relay is not None:
                self.relay.tell(f"-{child.rank}")
            # the rank's own children (data loader workers...) go with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            self.trees.rank_exited(child.rank, pid, self._known_children())
            with contextlib.suppress(OSError):
                os.unlink(child.connection_file)
            self.emit(
                {
                    "event": "exited",
                    "rank": child.rank,
                    "pid": pid,
                    "returncode": os.waitstatus_to_exitcode(status),
                    "log_tail": _tail(child.log),
                    "log": child.log,
                }
            )

    def _known_children(self) -> set[int]:
        """The agent's own children: its ranks and its relay (any other is an orphan of a
        rank's, adopted)."""
        known = set(self.children)
        if self.relay is not None:
            known.add(self.relay.pid)
        return known

    def _cleanup(self) -> None:
        self.stopping = True
        self.trees.kill_all(list(self.children), self._known_children())
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self.relay is not None:
            self.relay.close()  # its end of the pipe: the relay exits
        deadline = time.monotonic() + 5
        while (self.children or self.relay) and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.01)
        if self.relay is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.relay.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)


def hold_lock(folder: str) -> int:
    """Create `LOCK_NAME` in ``folder`` and hold it for this process's life (the fd is
    not inherited by programs it runs; a forked rank closes it)."""
    fd = os.open(
        os.path.join(folder, LOCK_NAME),
        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _lock_free(folder: str) -> bool:
    """Whether ``folder``'s `LOCK_NAME` is a regular file of ours that nobody holds."""
    try:
        fd = os.open(
            os.path.join(folder, LOCK_NAME),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
        )
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def prune_dead_agent_dirs(base: str) -> list[str]:
    """Remove the private folders in ``base`` that agents killed with SIGKILL left behind
    (with the session's key in their connection files): only folders of this user, named
    for an agent pid that no longer runs, whose lock nobody holds. Returns what went."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    me = os.getpid()
    for entry in entries:
        match = _DIR_NAME.fullmatch(entry.name)
        if match is None or int(match.group(1)) == me:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if pid_alive(int(match.group(1))) or not _lock_free(entry.path):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # does not follow links inside
        removed.append(entry.path)
    return removed


def _proc_state(pid: int) -> str:
    """A process's state as ``ps`` shows it (``D (disk sleep)``), for error messages."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("State:"):
                    return f"state {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return "state unknown"


def _read_from(path: str, offset: int, limit: int = STACKS_READ_LIMIT) -> tuple[str, int]:
    """At most ``limit`` bytes of ``path`` from ``offset``, cut at a line's end when there
    is one, and the offset after them."""
    with open(path, "rb") as f:
        f.seek(max(0, offset))
        data = f.read(limit)
    if len(data) == limit and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return data.decode(errors="replace"), max(0, offset) + len(data)


def _tail(path: str, size: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError as err:
        if err.errno == errno.ENOENT:
            return ""
        raise


def route_to(addr: str) -> ReplyFields:
    """Which local address and interface this node uses to reach ``addr``."""
    info: ReplyFields = {"addr": addr, "ip": None, "ifname": None}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))  # UDP: picks a route, sends nothing
            info["ip"] = s.getsockname()[0]
    except OSError as err:
        info["error"] = f"{type(err).__name__}: {err}"
        return info
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == info["ip"] for a in addrs):
            info["ifname"] = name
    return info


def probe(addr: str, port: int, timeout: float) -> ReplyFields:
    """Can this node open a TCP connection to ``addr:port``?"""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return {"ok": True}
    except OSError as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_dist.node", description=__doc__)
    parser.add_argument("--session", default="default", help="session name, for file names")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit if this is not the parent")
    args = parser.parse_args(argv)
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints from imported libraries must not corrupt the protocol
    unblock_signals()  # an interrupt reaches the ranks whoever started the agent
    set_parent_death_signal(signal.SIGTERM)
    become_subreaper()  # orphans of the ranks' programs come to the agent (`node.rank_trees`)
    if args.parent_pid and os.getppid() != args.parent_pid:
        return 1
    node_rank = os.environ.get(NODE_RANK_VAR, "")
    node = int(node_rank) if node_rank.isdigit() and len(node_rank) < 10 else None
    set_title(agent_title(args.session, node), agent_short_name(node))
    agent = Agent(out_fd, args.session, node)
    agent.preload()
    agent.ready()
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
