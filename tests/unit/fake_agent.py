"""A node agent in memory: the real agent protocol, no processes.

`FakeAgent` reads the launcher's commands and writes its events as the JSON lines of
`common.agent_protocol` (encoded and decoded by that module, shaped as `common.payloads`
types them, answering as `node.agent.Agent` does), over asyncio streams instead of a
child's pipes. `FakeLauncher` is a `Launcher` whose `start` hands back those streams, and
`FakeCluster.launcher` is a `LauncherFactory` for `Session` and `SessionManager`: every
node start makes a new agent, scripted by the node's `AgentScript`.

The ranks it "spawns" are records, not kernels: their connection points at Unix sockets
nobody listens on. Whatever needs a rank kernel to answer stops there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from jupyter_dist._version import __version__
from jupyter_dist.common.agent_protocol import PROTOCOL_VERSION, as_command, decode, encode
from jupyter_dist.common.payloads import (
    GPUJSON,
    AgentEvent,
    KernelConnection,
    ReplyFields,
    SpawnCommand,
)
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers.base import AgentStreams, Launcher, with_install_hint
from jupyter_dist.errors import AgentError

_pids = itertools.count(40000)


def local_torch() -> str | None:
    """The torch release installed here (what `check_versions` compares with)."""
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


@dataclass
class AgentScript:
    """How the agents of one node behave; the defaults are a healthy node."""

    host: str | None = None  # default: ``node<N>``
    python: str = "/fake/bin/python"
    gpus: int = 0
    protocol: int = PROTOCOL_VERSION
    #: reported versions, on top of this notebook's own (``{"jupyter_dist": "0.0.9"}``)
    versions: dict[str, str | None] = field(default_factory=dict)
    preload_errors: dict[str, str] = field(default_factory=dict)
    free_port: int = 29555
    #: None: says ready at once; a string: writes it to stderr and exits before ready
    dies_at_start: str | None = None
    #: None: the node answers; a string: starting its agent fails with it, nothing started
    #: (no SSH answer: the link to it is down)
    unreachable: str | None = None
    says_ready: bool = True  # False: never says anything (a hung start)
    #: rank -> the message of the ``error`` event answering its spawn
    spawn_errors: dict[int, str] = field(default_factory=dict)
    #: rank -> the return code it exits with right after it was spawned
    exits_at_spawn: dict[int, int] = field(default_factory=dict)
    #: the agent exits (EOF, no goodbye) when it receives this op
    vanishes_on: str | None = None
    #: route replies: the interface toward node 0 (None: no route, with ``route_error``)
    ifname: str | None = "eth0"
    route_error: str = "OSError: [Errno 101] Network is unreachable"
    #: the local address a route leaves from (None: 10.0.0.N+1, as `peer_address` says)
    route_ip: str | None = None
    #: probe replies
    probe_error: str | None = None  # None: the rendezvous port is reachable
    #: what a rank's log holds; a stacks request appends ``stack_dump`` to it
    log_text: str = "rank log line\n"
    stack_dump: str = 'Thread 0x1 (most recent call first):\n  File "<cell>", line 3 in <module>\n'
    #: ranks whose own thread does not answer a stacks request (their GIL is held): only
    #: the fallback (faulthandler's signal) writes their dump
    gil_held: set[int] = field(default_factory=set)


@dataclass
class FakeRank:
    """A rank the fake agent was asked to spawn."""

    rank: int
    local_rank: int
    pid: int
    env: dict[str, str]
    key: str
    cwd: str
    log_path: str
    log: str
    signals: list[str] = field(default_factory=list)


class _CommandPipe:
    """The agent's stdin as the launcher sees it (a `LineWriter`)."""

    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent

    def write(self, data: bytes) -> None:
        if self.agent.stdin_closed:
            raise BrokenPipeError("the fake agent's stdin is closed")
        self.agent.stdin.feed_data(data)

    async def drain(self) -> None:
        await asyncio.sleep(0)


class FakeAgent:
    """One node's agent; see the module docstring.

    Every command it received is in `commands` (decoded); the ranks it runs are in
    `ranks`, and every rank it ever spawned in `spawned`.
    """

    def __init__(self, node: int, script: AgentScript, session: str, env: Mapping[str, str]):
        self.node = node
        self.script = script
        self.host = script.host or f"node{node}"
        self.session = session
        self.env = dict(env)
        self.pid = next(_pids)
        self.dir = f"/tmp/jd-fake-{uuid.uuid4().hex[:8]}"
        self.stdin = asyncio.StreamReader()  # commands in
        self.stdout = asyncio.StreamReader()  # events out
        self.stdin_closed = False
        self.stderr: list[str] = []
        self.commands: list[dict[str, Any]] = []
        self.ranks: dict[int, FakeRank] = {}
        self.spawned: list[FakeRank] = []
        self.exited = False  # its "process" ended
        #: it answers nothing (SIGSTOPped, or the link to it lost without a reset)
        self.deaf = False
        self.stopping = False
        self._task: asyncio.Task[None] | None = None

    # -- the launcher's side ------------------------------------------------------------
    def start(self) -> AgentStreams:
        self._task = asyncio.ensure_future(self._run())
        return AgentStreams(self.stdout, _CommandPipe(self))

    def close_stdin(self) -> None:
        """The launcher closed the pipe: the agent kills its ranks and exits."""
        if not self.stdin_closed:
            self.stdin_closed = True
            self.stdin.feed_eof()

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    # -- scripting, from a test ---------------------------------------------------------
    def exit_rank(self, rank: int, returncode: int, log_tail: str = "") -> None:
        """Rank ``rank`` ends by itself (a crash, ``exit(3)``, the OOM killer)."""
        child = self.ranks.pop(rank)
        self.emit(
            {
                "event": "exited",
                "rank": rank,
                "pid": child.pid,
                "returncode": returncode,
                "log_tail": log_tail or child.log[-200:],
                "log": child.log_path,
            }
        )

    def vanish(self, stderr: str = "") -> None:
        """The agent dies at once: its stdout ends with no word about its ranks."""
        if stderr:
            self.stderr.append(stderr)
        self.ranks.clear()
        self._exit()

    # -- the agent's side ---------------------------------------------------------------
    def emit(self, message: AgentEvent) -> None:
        if not self.exited:
            self.stdout.feed_data(encode(message))

    def _exit(self) -> None:
        if not self.exited:
            self.exited = True
            self.stdout.feed_eof()
            self.close_stdin()

    async def _run(self) -> None:
        await asyncio.sleep(0)  # the real one imports torch first
        if self.script.dies_at_start is not None:
            self.stderr.append(self.script.dies_at_start)
            self._exit()
            return
        if self.script.says_ready:
            self.emit(
                {
                    "event": "ready",
                    "protocol": self.script.protocol,
                    "host": self.host,
                    "pid": self.pid,
                    "python": self.script.python,
                    "dir": self.dir,
                    "gpus": [_gpu(i) for i in range(self.script.gpus)],
                    "free_port": self.script.free_port,
                    "versions": {
                        "jupyter_dist": __version__,
                        "torch": local_torch(),
                        "python": sys.version.split()[0],
                        **self.script.versions,
                    },
                    "preload_errors": dict(self.script.preload_errors),
                }
            )
        while not self.exited and (line := await self.stdin.readline()):
            if line.strip():
                self._handle(line)
        # stdin closed, or a shutdown: like the real agent, kill every rank, then exit
        self._kill(None, signal.SIGTERM)
        self._exit()

    def _handle(self, line: bytes) -> None:
        data = decode(line)
        self.commands.append(data)
        if self.deaf:  # stopped, or its link is down: nothing comes back
            return
        cmd = as_command(data)
        if cmd is not None and cmd["op"] == self.script.vanishes_on:
            self.vanish()
            return
        if cmd is None:
            self.emit({"event": "error", "message": f"unknown op {data.get('op')!r}", "rank": None})
        elif cmd["op"] == "spawn":
            self._spawn(cmd)
        elif cmd["op"] == "signal":
            rank = self.ranks.get(int(cmd["rank"]))
            if rank is not None:
                rank.signals.append(cmd["signal"])
        elif cmd["op"] == "kill":
            ranks = cmd["ranks"]
            sig = signal.SIGTERM if float(cmd["grace"]) > 0 else signal.SIGKILL
            self._kill(None if ranks is None else set(ranks), sig)
        elif cmd["op"] == "route":
            self._reply(cmd["id"], self._route(cmd["addr"]))
        elif cmd["op"] == "probe":
            error = self.script.probe_error
            self._reply(cmd["id"], {"ok": True} if error is None else {"ok": False, "error": error})
        elif cmd["op"] == "stacks":
            wanted = cmd["ranks"]
            offsets = {}
            fallback = bool(cmd.get("fallback", False))
            for r, child in self.ranks.items():
                if wanted is None or r in wanted:
                    offsets[str(r)] = len(child.log)
                    if fallback or r not in self.script.gil_held:
                        child.log += self.script.stack_dump
            self._reply(cmd["id"], {"offsets": offsets})
        elif cmd["op"] == "read_log":
            rank = self.ranks.get(int(cmd["rank"]))
            if rank is None:
                message = f"RuntimeError: rank {cmd['rank']} does not run on this node"
                self.emit({"event": "error", "message": message, "rank": None, "id": cmd["id"]})
            else:
                self._reply(cmd["id"], {"text": rank.log[int(cmd["offset"]) :]})
        elif cmd["op"] == "ping":
            self.emit({"event": "pong", "seq": int(cmd["seq"])})
        else:  # shutdown
            self.stopping = True
            self.close_stdin()

    def _reply(self, request_id: str, fields: ReplyFields) -> None:
        self.emit({"event": "reply", "id": request_id, **fields})

    def _route(self, addr: str) -> ReplyFields:
        if self.script.ifname is None:
            return {"addr": addr, "ip": None, "ifname": None, "error": self.script.route_error}
        ip = self.script.route_ip or f"10.0.0.{self.node + 1}"
        return {"addr": addr, "ip": ip, "ifname": self.script.ifname}

    def _spawn(self, cmd: SpawnCommand) -> None:
        rank = int(cmd["rank"])
        if rank in self.ranks:
            raise AssertionError(f"rank {rank} spawned twice on {self.host}")
        if rank in self.script.spawn_errors:
            self.emit({"event": "error", "message": self.script.spawn_errors[rank], "rank": rank})
            return
        child = FakeRank(
            rank=rank,
            local_rank=int(cmd["local_rank"]),
            pid=next(_pids),
            env=dict(cmd["env"]),
            key=cmd["key"],
            cwd=cmd["cwd"],
            log_path=f"{self.dir}/rank-{rank}.log",
            log=self.script.log_text,
        )
        self.ranks[rank] = child
        self.spawned.append(child)
        self.emit(
            {
                "event": "spawned",
                "rank": rank,
                "pid": child.pid,
                "connection": _connection(f"{self.dir}/rank-{rank}"),
                "log": child.log_path,
            }
        )
        if rank in self.script.exits_at_spawn:
            self.exit_rank(rank, self.script.exits_at_spawn[rank])

    def _kill(self, ranks: set[int] | None, sig: signal.Signals) -> None:
        for r in sorted(self.ranks):
            if ranks is None or r in ranks:
                self.exit_rank(r, -int(sig))


def _gpu(index: int) -> GPUJSON:
    return {
        "index": index,
        "name": "Fake GPU",
        "memory_total_mib": 81559,
        "uuid": f"GPU-{index:08d}",
    }


def _connection(path: str) -> KernelConnection:
    """Unix sockets (as the real agent's), where no kernel listens."""
    return {
        "shell_port": 1,
        "iopub_port": 2,
        "stdin_port": 3,
        "control_port": 4,
        "hb_port": 5,
        "ip": path,
        "transport": "ipc",
        "signature_scheme": "hmac-sha256",
        "kernel_name": "jupyter-dist-rank",
    }


class FakeLauncher(Launcher):
    """Starts a `FakeAgent` of ``cluster``'s node ``node``."""

    kind: ClassVar[str] = "fake"

    def __init__(self, cluster: FakeCluster, node: int) -> None:
        self.cluster = cluster
        self.node = node
        self.agent: FakeAgent | None = None
        self.signals: list[int] = []
        self.stopped = False

    @property
    def host(self) -> str:
        return self.cluster.script(self.node).host or f"node{self.node}"

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        why = self.cluster.script(self.node).unreachable
        if why is not None:
            raise AgentError(f"node {self.host!r}: {why}")
        self.agent = FakeAgent(self.node, self.cluster.script(self.node), session, env)
        self.cluster.agents.append(self.agent)
        return self.agent.start()

    async def signal(self, signum: int) -> None:
        self.signals.append(signum)

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        if self.agent is not None:
            self.agent.close_stdin()  # as LocalLauncher: EOF, and the agent winds down
            await asyncio.wait_for(self.agent.wait(), timeout)

    def alive(self) -> bool:
        return self.agent is not None and not self.agent.exited

    def stderr_tail(self) -> str:
        return with_install_hint("\n".join(self.agent.stderr) if self.agent else "")

    def peer_address(self) -> str | None:
        return f"10.0.0.{self.node + 1}" if self.cluster.remote else None

    def to_dict(self) -> dict[str, Any]:
        pid = self.agent.pid if self.agent else None
        return {"kind": self.kind, "host": self.host, "pid": pid}


class FakeCluster:
    """Nodes whose agents are `FakeAgent` values; `launcher` is a `LauncherFactory`.

    ``remote``: whether the nodes stand for other machines (their launchers report a
    peer address); a session is multi-node when its spec lists hosts.
    """

    def __init__(self, remote: bool = False, **defaults: Any) -> None:
        self.remote = remote
        self.defaults = defaults
        self.scripts: dict[int, AgentScript] = {}
        self.launchers: list[FakeLauncher] = []
        self.agents: list[FakeAgent] = []  # every agent started, in order

    def script(self, node: int) -> AgentScript:
        """Node ``node``'s script: change it before (or between) starts."""
        if node not in self.scripts:
            self.scripts[node] = AgentScript(**self.defaults)
        return self.scripts[node]

    def launcher(self, spec: SessionSpec, node: int) -> Launcher:
        made = FakeLauncher(self, node)
        self.launchers.append(made)
        return made

    def agents_of(self, node: int) -> list[FakeAgent]:
        return [a for a in self.agents if a.node == node]

    def live_agents(self) -> list[FakeAgent]:
        return [a for a in self.agents if not a.exited]

    async def settle(self) -> None:
        """Let the agents' and the clients' tasks run until nothing is left to do."""
        for _ in range(20):
            await asyncio.sleep(0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.sleep(0.01), 1)
