"""A session: a set of persistent rank kernels that cells run on.

State machine of a session::

    STARTING ──> READY ──(rank died)──> BROKEN
        │          │  ^                   │
        │          v  │                   │
        │       RESTARTING <──────────────┘
        v          │
      STOPPED <────┴── (shutdown, from any state)

and of each rank (`RankState`)::

    STARTING ──> IDLE <──> BUSY ──> DEAD

The session knows nothing of IPython or widgets: it runs on the control-plane loop and
reports what happens through `CellEvent` values.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import queue
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zmq.asyncio

from jupyter_dist import objects
from jupyter_dist.agent_protocol import describe_returncode
from jupyter_dist.cell_run import CellRun
from jupyter_dist.errors import (
    AgentError,
    CellTimeout,
    NoGPUError,
    PushError,
    RanksFailed,
    SessionError,
    SpecError,
)
from jupyter_dist.events import CellEvent, CellFinished, CellResult
from jupyter_dist.launchers import launcher_for
from jupyter_dist.node_agent import AgentInfo, NodeAgent
from jupyter_dist.rank_client import RankClient
from jupyter_dist.rendezvous import Rendezvous, check_reachable, plan_rendezvous
from jupyter_dist.spec import SessionSpec
from jupyter_dist.topology import RankPlace, omp_threads, places, rank_env

log = logging.getLogger(__name__)

#: how long ranks get to answer an interrupt before a cell is given up on
INTERRUPT_GRACE_S = 5.0


class SessionState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BROKEN = "broken"
    RESTARTING = "restarting"
    STOPPED = "stopped"


class RankState(str, enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"


@dataclass
class RankRecord:
    """The live state of one rank."""

    place: RankPlace
    node: NodeAgent
    state: RankState = RankState.STARTING
    pid: int | None = None
    client: RankClient | None = None
    exit_code: int | None = None
    log: str = ""
    connection: dict[str, Any] | None = None  # reachable from this process (tunnelled)

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def host(self) -> str:
        return self.node.host


@dataclass(frozen=True)
class SessionTimeouts:
    start: float = 120.0  # agent ready + kernels answering
    process_group: float = 300.0  # init_process_group's own timeout


Progress = Callable[[str], None]


class Session:
    """Persistent rank kernels plus everything needed to run cells on them."""

    def __init__(
        self,
        spec: SessionSpec,
        timeouts: SessionTimeouts | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.timeouts = timeouts or SessionTimeouts()
        self.cwd = cwd or os.getcwd()
        self.user_env = dict(os.environ if env is None else env)
        self.on_change: Callable[[Session], None] | None = None
        self._state = SessionState.STARTING
        self.nodes: list[NodeAgent] = []
        self.ranks: dict[int, RankRecord] = {}
        self.key = secrets.token_hex(32)  # HMAC key of every kernel message in the session
        self.rendezvous: Rendezvous | None = None
        self.node_env: dict[int, dict[str, str]] = {}
        self.broken_reason = ""
        self.started_at = 0.0
        self.cells_run = 0
        self._context = zmq.asyncio.Context()
        # a kernel binds its ports a few ms after it is forked: reconnect quickly
        self._context.setsockopt(zmq.RECONNECT_IVL, 10)
        self._current: CellRun | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def state(self) -> SessionState:
        return self._state

    @state.setter
    def state(self, value: SessionState) -> None:
        self._state = value
        self._changed()

    def _changed(self) -> None:
        """Tell whoever watches (the server's event stream) that something moved."""
        if self.on_change is not None:
            self.on_change(self)

    # -- start-up ---------------------------------------------------------------------
    async def start(self, progress: Progress = lambda _: None) -> None:
        """Start agents and ranks, then bootstrap every rank; undo everything on failure."""
        began = time.monotonic()
        try:
            await self._start_nodes(progress)
            await self._start_ranks(progress)
        except BaseException:
            await self.shutdown()
            raise
        self.state = SessionState.READY
        self.started_at = time.time()
        log.info(
            "session %s started: %s in %.2f s",
            self.name,
            self.spec.describe(),
            time.monotonic() - began,
        )

    async def _start_nodes(self, progress: Progress) -> None:
        def agent_env(node: int) -> dict[str, str]:
            return {"OMP_NUM_THREADS": omp_threads(self.spec, self.user_env, node)}

        self.nodes = [
            NodeAgent(launcher_for(self.spec, node), node, self._on_rank_exit, self._on_node_lost)
            for node in range(self.spec.nodes)
        ]
        remote = bool(self.spec.hosts)

        async def start(node: NodeAgent) -> AgentInfo:
            began = time.monotonic()
            if remote:
                progress(f"node {node.launcher.host}: connecting")
            info = await node.start(self.name, agent_env(node.node_rank), self.timeouts.start)
            if remote:
                gpus = f", {len(info.gpus)} GPUs" if info.gpus else ""
                progress(f"node {info.host}: agent ready in {time.monotonic() - began:.1f} s{gpus}")
            return info

        results = await asyncio.gather(*(start(n) for n in self.nodes), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancelled, interrupted
        failed = [r for r in results if isinstance(r, Exception)]
        if len(failed) == 1:
            raise failed[0]
        if failed:
            raise AgentError(
                f"{len(failed)} of {len(self.nodes)} nodes failed to start:\n"
                + "\n".join(f"  - {err}" for err in failed)
            )
        infos = [r for r in results if isinstance(r, AgentInfo)]
        for node, info in enumerate(infos):
            have, want = len(info.gpus), self.spec.procs_on(node)
            if self.spec.device == "cuda" and have < want:
                raise NoGPUError(
                    f"--gpus {want}: node {info.host!r} has {have} CUDA "
                    f"device{'s' if have != 1 else ''}; use --procs {want} "
                    "for CPU ranks with the gloo backend"
                )
        if not remote:
            progress(f"agent ready on {infos[0].host}")

    async def _start_ranks(self, progress: Progress) -> None:
        rdzv, self.node_env = await plan_rendezvous(self.spec, self.nodes, self.user_env)
        self.rendezvous = rdzv
        self.ranks = {p.rank: RankRecord(p, self.nodes[p.node_rank]) for p in places(self.spec)}
        await asyncio.gather(*(self._spawn(rec) for rec in self.ranks.values()))
        if self.spec.init_process_group:
            progress(f"{self.spec.world_size} rank kernels up; joining the process group")
        hosted = await self._run_cell(
            "import jupyter_dist.rank_bootstrap as _jd_bootstrap\n"
            f"_jd_bootstrap.host_store({rdzv.master_addr!r}, {rdzv.master_port}, "
            f"{self.spec.world_size}, {self.timeouts.process_group!r})\n"
            "del _jd_bootstrap\n",
            [0],
            sink=None,
            timeout=self.timeouts.start,
            silent=True,
        )
        if hosted.failures:
            raise RanksFailed(self.name, self.spec.world_size, hosted.failures)
        await check_reachable(self.spec, self.nodes, rdzv)
        result = await self._run_cell(
            "import jupyter_dist.rank_bootstrap as _jd_bootstrap\n"
            f"_jd_bootstrap.bootstrap({self.spec.init_process_group!r}, "
            f"{self.timeouts.process_group!r})\n"
            "del _jd_bootstrap\n",
            sorted(self.ranks),
            sink=None,
            timeout=self.timeouts.process_group + 30,
            silent=True,
        )
        if result.failures:
            raise RanksFailed(self.name, self.spec.world_size, result.failures)
        for rec in self.ranks.values():
            rec.state = RankState.IDLE
        self._changed()

    async def _spawn(self, rec: RankRecord) -> None:
        assert self.rendezvous is not None
        env = rank_env(self.spec, rec.place, self.rendezvous, self.user_env)
        env.update(self.node_env.get(rec.place.node_rank, {}))
        spawned = await rec.node.spawn(rec.rank, rec.place.local_rank, env, self.key, self.cwd)
        rec.pid = spawned.pid
        rec.log = spawned.log
        rec.connection = await rec.node.launcher.tunnel(rec.rank, spawned.connection)
        rec.client = RankClient(rec.rank, rec.connection, self.key, self._context)

        def dead() -> str | None:
            return None if rec.state != RankState.DEAD else describe_returncode(rec.exit_code)

        await rec.client.connect(self.timeouts.start, dead)

    # -- rank deaths ------------------------------------------------------------------
    def _on_rank_exit(self, rank: int, returncode: int, log_tail: str) -> None:
        rec = self.ranks.get(rank)
        if rec is None:
            return
        rec.state = RankState.DEAD
        rec.exit_code = returncode
        self._changed()
        if rec.client:
            rec.client.fail_waiters(SessionError(f"rank {rank} {describe_returncode(returncode)}"))
        if self.state in (SessionState.READY, SessionState.STARTING):
            self.state = SessionState.BROKEN
            self.broken_reason = (
                f"rank {rank} (host {rec.host}, pid {rec.pid}) {describe_returncode(returncode)}"
            )
            log.info("session %s: %s", self.name, self.broken_reason)
        if self._current is not None:
            self._current.rank_died(rank, returncode, rec.pid, log_tail)

    def _on_node_lost(self, node: NodeAgent) -> None:
        """The agent went away: its ranks die with it (PDEATHSIG), unreported; say so."""
        tail = node.launcher.stderr_tail()
        for rec in self.ranks.values():
            if rec.node is node and rec.state != RankState.DEAD:
                self._on_rank_exit(
                    rec.rank, -9, f"the agent of node {node.host!r} exited\n{tail}".strip()
                )

    def _check_usable(self) -> None:
        if self.state == SessionState.BROKEN:
            raise SessionError(
                f"session {self.name!r} lost {self.broken_reason}; its process group cannot "
                f"continue. Run `%dist restart --session {self.name}` to start fresh ranks "
                "(the ranks' variables are lost)"
            )
        if self.state != SessionState.READY:
            raise SessionError(f"session {self.name!r} is {self.state.value}, not ready")

    def check_ranks(self, ranks: Sequence[int] | None) -> list[int]:
        chosen = sorted(self.ranks) if ranks is None else sorted(ranks)
        missing = [r for r in chosen if r not in self.ranks]
        if missing:
            raise SpecError(
                f"--ranks: rank {missing[0]} does not exist; session {self.name!r} has ranks "
                f"0-{self.spec.world_size - 1}"
            )
        return chosen

    # -- cells --------------------------------------------------------------------------
    async def execute(
        self,
        code: str,
        ranks: Sequence[int] | None = None,
        sink: queue.SimpleQueue[CellEvent] | None = None,
        timeout: float | None = None,
    ) -> CellResult:
        """Run ``code`` on ``ranks`` (all by default) and wait for every one of them."""
        self._check_usable()
        chosen = self.check_ranks(ranks)
        self.cells_run += 1
        result = await self._run_cell(code, chosen, sink, timeout)
        if sink is not None:
            sink.put(CellFinished(result))
        return result

    async def _run_cell(
        self,
        code: str,
        ranks: list[int],
        sink: queue.SimpleQueue[CellEvent] | None,
        timeout: float | None,
        silent: bool = False,
    ) -> CellResult:
        run = CellRun(
            {r: (self.ranks[r].host, self.ranks[r].place.local_rank) for r in ranks}, sink
        )
        self._current = run
        sent: dict[int, str] = {}
        try:
            for r in ranks:
                rec = self.ranks[r]
                if rec.state == RankState.DEAD or rec.client is None:
                    run.rank_died(r, rec.exit_code or -9, rec.pid, "")
                    continue
                rec.state = RankState.BUSY
                sent[r] = rec.client.execute(code, run.handler(r), silent=silent)
            self._changed()
            try:
                await asyncio.wait_for(run.done.wait(), timeout)
            except asyncio.TimeoutError:
                run.timed_out = True
                log.info("session %s: cell timed out after %s s", self.name, timeout)
                await self.interrupt(run.busy_ranks)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(run.done.wait(), INTERRUPT_GRACE_S)
                run.give_up(
                    "timeout",
                    f"still running {timeout} s after the cell started, and did not stop "
                    f"within {INTERRUPT_GRACE_S:.0f} s of an interrupt",
                )
        finally:
            self._current = None
            for r, msg_id in sent.items():
                rec = self.ranks[r]
                if rec.client:
                    rec.client.forget(msg_id)
                if rec.state == RankState.BUSY:
                    rec.state = RankState.IDLE
            self._changed()
        return run.result()

    def raise_for(self, result: CellResult) -> None:
        """Turn a failed `CellResult` into the exception the notebook cell raises."""
        if not result.failures:
            return
        cls = CellTimeout if result.timed_out else RanksFailed
        raise cls(self.name, self.spec.world_size, result.failures)

    async def interrupt(self, ranks: Sequence[int] | None = None) -> None:
        """Interrupt ``ranks`` (all by default): a KeyboardInterrupt in their running code."""
        for r in self.check_ranks(ranks):
            rec = self.ranks[r]
            if rec.client and rec.state != RankState.DEAD:
                rec.client.interrupt()

    # -- objects ------------------------------------------------------------------------
    async def push(self, payload: objects.Payload, ranks: Sequence[int] | None = None) -> None:
        """Send pickled ``{name: value}`` to each rank's namespace."""
        self._check_usable()
        chosen = self.check_ranks(ranks)
        replies = await asyncio.gather(
            *(
                self._client(r).objects_request(
                    {"op": "push", **payload.signed_fields()}, payload.frames
                )
                for r in chosen
            ),
            return_exceptions=True,
        )
        errors = [(r, rep) for r, rep in zip(chosen, replies, strict=True) if _failed(rep)]
        if errors:
            r, rep = errors[0]
            raise PushError(f"push failed on {len(errors)} rank(s); rank {r}: {_why(rep)}")

    async def pull(self, name: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The value of ``name`` on each rank, in rank order."""
        self._check_usable()
        chosen = self.check_ranks(ranks)
        replies = await asyncio.gather(
            *(self._client(r).objects_request({"op": "pull", "name": name}) for r in chosen),
            return_exceptions=True,
        )
        values = []
        for r, rep in zip(chosen, replies, strict=True):
            if _failed(rep):
                raise PushError(f"pull {name!r} failed on rank {r}: {_why(rep)}")
            assert isinstance(rep, tuple)
            data, buffers = rep
            values.append(objects.load(buffers, data["digest"], data["sizes"]))
        return values

    def _client(self, rank: int) -> RankClient:
        client = self.ranks[rank].client
        if client is None:
            raise SessionError(f"rank {rank} has no kernel connection")
        return client

    # -- restart and shutdown -------------------------------------------------------------
    async def _stop_ranks(self, grace: float) -> None:
        for rec in self.ranks.values():
            if rec.client:
                await rec.client.close()
                rec.client = None
        live = [n for n in self.nodes if not n.lost]
        await asyncio.gather(*(n.kill(None, grace) for n in live), return_exceptions=True)
        deadline = time.monotonic() + grace + 5.0
        while any(r.state != RankState.DEAD for r in self.ranks.values() if not r.node.lost):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.005)

    async def restart(self, progress: Progress = lambda _: None) -> None:
        """Fresh rank kernels, same shape; the agents (and their warm imports) stay."""
        if self.state == SessionState.STOPPED:
            raise SessionError(f"session {self.name!r} was shut down; start it again instead")
        self.state = SessionState.RESTARTING
        try:
            if any(n.lost for n in self.nodes):
                await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
                await self._stop_ranks(0.0)
                await self._start_nodes(progress)
            else:
                await self._stop_ranks(0.0)
            await self._start_ranks(progress)
        except BaseException:
            self.state = SessionState.BROKEN
            self.broken_reason = "its restart failed"
            raise
        self.state = SessionState.READY
        self.broken_reason = ""
        log.info("session %s restarted", self.name)

    async def shutdown(self) -> None:
        """Stop every rank and agent; safe to call twice and from any state."""
        if self.state == SessionState.STOPPED:
            return
        self.state = SessionState.STOPPED
        for rec in self.ranks.values():
            if rec.client:
                await rec.client.close()
                rec.client = None
        await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
        with contextlib.suppress(Exception):
            self._context.destroy(linger=0)
        log.info("session %s shut down", self.name)

    # -- reporting ---------------------------------------------------------------------
    def connection_info(self) -> dict[str, Any]:
        """What another process on this machine needs to talk to the rank kernels itself:
        the session's HMAC key and each rank's (local or forwarded) sockets. Secret."""
        self._check_usable()
        return {
            "name": self.name,
            "key": self.key,
            "signature_scheme": "hmac-sha256",
            "ranks": [
                {
                    "rank": r.rank,
                    "local_rank": r.place.local_rank,
                    "node_rank": r.place.node_rank,
                    "host": r.host,
                    "connection": r.connection,
                }
                for r in sorted(self.ranks.values(), key=lambda r: r.rank)
            ],
        }

    def status(self) -> dict[str, Any]:
        """A JSON-able picture of the session, for `%dist status` and the UI."""
        return {
            "name": self.name,
            "state": self.state.value,
            "shape": self.spec.describe(),
            "world_size": self.spec.world_size,
            "backend": self.spec.backend,
            "device": self.spec.device,
            "cells_run": self.cells_run,
            "broken_reason": self.broken_reason,
            "master": (
                f"{self.rendezvous.master_addr}:{self.rendezvous.master_port}"
                if self.rendezvous
                else None
            ),
            "nodes": [
                {
                    "node_rank": n.node_rank,
                    "host": n.host,
                    "agent_pid": n.info.pid if n.info else None,
                    "gpus": [g.to_json() for g in n.info.gpus] if n.info else [],
                    "lost": n.lost,
                }
                for n in self.nodes
            ],
            "ranks": [
                {
                    "rank": r.rank,
                    "local_rank": r.place.local_rank,
                    "node_rank": r.place.node_rank,
                    "host": r.host,
                    "pid": r.pid,
                    "state": r.state.value,
                    "exit": describe_returncode(r.exit_code) if r.exit_code is not None else None,
                    "log": r.log,
                }
                for r in sorted(self.ranks.values(), key=lambda r: r.rank)
            ],
        }


def _failed(reply: object) -> bool:
    if isinstance(reply, BaseException):
        return True
    assert isinstance(reply, tuple)
    return bool(reply[0].get("op") == "error")


def _why(reply: object) -> str:
    if isinstance(reply, BaseException):
        return f"{type(reply).__name__}: {reply}"
    assert isinstance(reply, tuple)
    data = reply[0]
    return f"{data.get('ename')}: {data.get('evalue')}"


__all__ = [
    "RankRecord",
    "RankState",
    "Session",
    "SessionState",
    "SessionTimeouts",
]
