"""A session: agents on its nodes, the rank kernels they started, and their lifecycle.

`Session` is the `RankGroup` that owns its ranks: it starts agents and rank kernels,
bootstraps torch.distributed, restarts and shuts them down. It knows nothing of IPython or
widgets: it runs on the control-plane loop and reports through `CellEvent` values.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import queue
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from jupyter_dist.common.agent_protocol import Heartbeat, describe_returncode
from jupyter_dist.common.events import CellEvent, StreamOut
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.payloads import (
    KernelConnection,
    LogKind,
    NodeMetrics,
    NodeSample,
    NotebookJSON,
    RankLog,
    RankSample,
    SessionConnection,
    SessionMetrics,
    SessionStatus,
)
from jupyter_dist.common.ports import PORTS_VAR, PortRange, parse_port_range
from jupyter_dist.common.proc_titles import NODE_RANK_VAR
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.common.wire_names import (
    EXECUTE_REPLY_MSG_TYPE,
    GROUP_KEY,
    REBUILD_MARK,
    REFUSED_IN_CONSOLE_ENAME,
)
from jupyter_dist.control.agent_client import AgentClient, AgentInfo
from jupyter_dist.control.launchers import Launcher, Placement, launcher_for, placement_for
from jupyter_dist.control.rank_env import omp_threads, places, rank_env
from jupyter_dist.control.rank_group import RankGroup, RankRecord, RankState, room_for_sockets
from jupyter_dist.control.recovery import SessionState, resize_report
from jupyter_dist.control.rendezvous import Rendezvous, check_reachable, plan_rendezvous
from jupyter_dist.errors import AgentError, NoGPUError, RanksFailed, SessionError, SpecError
from jupyter_dist.settings import GENERATION_VAR, NODE_DEADLINE_VAR, seconds_from_env
from jupyter_dist.text import ranks_label

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionTimeouts:
    start: float = 120.0  # agent ready + kernels answering
    process_group: float = 300.0  # init_process_group's own timeout
    #: a whole restart: stopping the ranks, starting fresh ones and their process group
    restart: float = 600.0
    #: a node whose agent said nothing for this long is unreachable (None: from
    #: ``JUPYTER_DIST_NODE_DEADLINE_S``, else `Heartbeat`'s default)
    node_deadline: float | None = None


Progress = Callable[[str], None]
#: seconds rank news is gathered before the session's watchers hear of it
CHANGE_COALESCE_S = 0.05
#: seconds a node's agent gets to sample its processes
SAMPLE_TIMEOUT_S = 10.0
#: seconds a node's agent gets to read back a piece of a rank's log
LOG_READ_TIMEOUT_S = 10.0
#: makes the launcher of node ``node`` of a session (`launcher_for`; tests pass a fake)
LauncherFactory = Callable[[SessionSpec, int], Launcher]
#: makes a session's `Placement` (`placement_for`), or None when its kind needs none
PlacementFactory = Callable[[SessionSpec, Mapping[str, str]], Placement | None]


def _no_placement(spec: SessionSpec, env: Mapping[str, str]) -> None:
    return None


class Session(RankGroup):
    """Persistent rank kernels plus everything needed to start, restart and stop them."""

    def __init__(
        self,
        spec: SessionSpec,
        timeouts: SessionTimeouts | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        launchers: LauncherFactory = launcher_for,
        rank_vars: Mapping[str, str] | None = None,
        placements: PlacementFactory | None = None,
    ) -> None:
        """``env``: where the session's knobs are read (default: this process's
        environment); ``rank_vars``: variables every rank gets on top of its node's
        environment (under them, the ones `rank_env` decides)."""
        super().__init__(spec, secrets.token_hex(32))
        self.launchers = launchers
        #: by default the spec's kind places the nodes, unless the caller makes the
        #: launchers itself
        self.placements: PlacementFactory = placements or (
            placement_for if launchers is launcher_for else _no_placement
        )
        #: the machines a cluster manager holds for the session (``ray``), once placed
        self.placement: Placement | None = None
        self.timeouts = timeouts or SessionTimeouts()
        self.cwd = cwd or os.getcwd()
        self.user_env = dict(os.environ if env is None else env)
        self.rank_vars = dict(rank_vars or {})
        self.nodes: list[AgentClient] = []
        self.rendezvous: Rendezvous | None = None
        self.node_env: dict[int, dict[str, str]] = {}
        self.started_at = 0.0
        self._change_pending = False
        #: kernel id -> the notebook kernels attached to it (under a server)
        self.notebooks: dict[str, NotebookJSON] = {}
        #: hosts that may take a lost node's place (``%dist heal --spares``), unused ones
        self.spares: tuple[HostSpec, ...] = ()
        self._healing = asyncio.Lock()
        #: a heal or resize got as far as the survivors leaving their group (`_regroup`)
        self._joining = False
        #: the notebook that started it (under a server), its path now ("" if none did)
        self.notebook = ""
        #: that notebook's file id, which its renames keep ("" if the server has none)
        self.notebook_id = ""

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
        ports = self.user_env.get(PORTS_VAR, "")
        if ports:
            parse_port_range(ports)  # a bad range is named before any node starts

        launchers = self.launchers
        self.placement = self.placements(self.spec, self.user_env)
        if self.placement is not None:
            await self.placement.place(progress, self.timeouts.start)
            launchers = self.placement.launcher
        heartbeat = Heartbeat(
            self.timeouts.node_deadline
            or seconds_from_env(NODE_DEADLINE_VAR, Heartbeat.deadline_s, self.user_env)
        )
        self.nodes = [
            AgentClient(
                launchers(self.spec, node),
                node,
                self._on_rank_exit,
                self._on_node_lost,
                heartbeat=heartbeat,
            )
            for node in range(self.spec.nodes)
        ]
        remote = self.spec.remote

        async def start(node: AgentClient) -> AgentInfo:
            began = time.monotonic()
            if remote:
                progress(f"node {node.host}: connecting")
            info = await node.start(self.name, self._agent_env(node.node_rank), self.timeouts.start)
            if remote:
                gpus = f", {len(info.gpus)} GPUs" if info.gpus else ""
                progress(f"node {node.host}: agent ready in {time.monotonic() - began:.1f} s{gpus}")
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
                    f"--gpus {want}: node {self.nodes[node].host!r} has {have} CUDA "
                    f"device{'s' if have != 1 else ''}; use --procs {want} "
                    "for CPU ranks with the gloo backend"
                )
        if not remote:
            progress(f"agent ready on {infos[0].host}")

    async def _start_ranks(self, progress: Progress) -> None:
        rdzv, self.node_env = await plan_rendezvous(self.spec, self.nodes, self.user_env)
        self.rendezvous = rdzv
        self.ranks = {
            p.rank: RankRecord(p, self.nodes[p.node_rank].host, self.nodes[p.node_rank])
            for p in places(self.spec)
        }
        await asyncio.gather(*(self._spawn(rec) for rec in self.ranks.values()))
        if self.spec.init_process_group:
            progress(f"{self.spec.world_size} rank kernels up; joining the process group")
        hosted = await self._run_cell(
            self._host_store_code(rdzv),
            [0],
            sink=None,
            timeout=self.timeouts.start,
            silent=True,
        )
        if hosted.failures:
            raise RanksFailed(self.name, self.spec.world_size, hosted.failures)
        await check_reachable(self.spec, self.nodes, rdzv)
        result = await self._run_cell(
            self._bootstrap_code(),
            sorted(self.ranks),
            sink=None,
            timeout=self.timeouts.process_group + 30,
            silent=True,
        )
        if result.failures:
            raise RanksFailed(self.name, self.spec.world_size, result.failures)
        made = self.spec.backend if self.spec.init_process_group else ""
        for rec in self.ranks.values():
            rec.state, rec.group = RankState.IDLE, made
        self._changed()

    def _agent_env(self, node: int) -> dict[str, str]:
        """What node ``node``'s agent gets on top of its environment."""
        ports = self.user_env.get(PORTS_VAR, "")
        env = {"OMP_NUM_THREADS": omp_threads(self.spec, self.user_env, node)}
        env[NODE_RANK_VAR] = str(node)  # its title names it; its ranks get the same value
        return {**env, PORTS_VAR: ports} if ports else env

    def _host_store_code(self, rdzv: Rendezvous) -> str:
        """Rank 0's cell that serves the session's store at ``rdzv``."""
        return (
            "import jupyter_dist.rank.bootstrap as _jd_bootstrap\n"
            f"_jd_bootstrap.host_store({rdzv.master_addr!r}, {rdzv.master_port}, "
            f"{self.spec.world_size}, {self.timeouts.process_group!r})\n"
            "del _jd_bootstrap\n"
        )

    def _bootstrap_code(self) -> str:
        """Each new rank's first cell (`rank.bootstrap`)."""
        return (
            "import jupyter_dist.rank.bootstrap as _jd_bootstrap\n"
            f"_jd_bootstrap.bootstrap({self.spec.init_process_group!r}, "
            f"{self.timeouts.process_group!r})\n"
            "del _jd_bootstrap\n"
        )

    async def _spawn(self, rec: RankRecord) -> None:
        assert self.rendezvous is not None and rec.node is not None
        env = {**self.rank_vars, **rank_env(self.spec, rec.place, self.rendezvous, self.user_env)}
        env.update(self.node_env.get(rec.place.node_rank, {}))
        spawned = await rec.node.spawn(rec.rank, rec.place.local_rank, env, self.key, self.cwd)
        rec.pid = spawned.pid
        rec.log = spawned.log
        # a launcher (possibly a plug-in's) hands back the sockets as plain JSON
        tunnelled = await rec.node.launcher.tunnel(rec.rank, spawned.connection)
        rec.connection = cast(KernelConnection, tunnelled)
        rec.client = self.new_client(rec)
        rec.client.on_activity = self._on_rank_activity

        def dead() -> str | None:
            return None if rec.state != RankState.DEAD else describe_returncode(rec.exit_code)

        try:
            await rec.client.connect(self.timeouts.start, dead)
        except SessionError as err:
            if rec.state == RankState.DEAD:
                raise
            where = await self._where_is(rec)
            raise SessionError(f"{err}{where}") from None

    async def _where_is(self, rec: RankRecord) -> str:
        """A rank that will not answer: its stack (faulthandler) and the end of its log."""
        assert rec.node is not None
        try:  # the log first: the dump is appended to it
            tail = await asyncio.wait_for(
                rec.node.request("read_log", rank=rec.rank, offset=0), 10.0
            )
            dumps = await asyncio.wait_for(rec.node.stacks([rec.rank]), 10.0)
        except Exception as err:
            return f" (no stack dump: {type(err).__name__}: {err})"
        dump = dumps.get(rec.rank, "").strip()
        log_tail = "\n".join(str(tail.get("text", "")).strip().splitlines()[-20:])
        parts = [f"\n  its stack:\n{dump}" if dump else ""]
        parts.append(f"\n  the end of its log ({rec.log}):\n{log_tail}" if log_tail else "")
        return "".join(parts)

    def _on_rank_activity(self, rank: int, kind: str, content: dict[str, Any], cell: str) -> None:
        """A rank began or ended a cell, or showed an error, whoever sent the cell: the
        session's status (the sidebar, `%dist status`) shows each rank's truth. A short
        cell of a notebook says only its reply (`rank.iopub_reply`); the first message of
        a new cell clears the last cell's error."""
        rec = self.ranks.get(rank)
        if rec is None or rec.state in (RankState.DEAD, RankState.STARTING):
            return
        changed = False
        if cell != rec.last_cell:
            changed = bool(rec.last_error)
            rec.last_cell, rec.last_error = cell, ""
        failed = kind == "error" or (
            kind == EXECUTE_REPLY_MSG_TYPE and content.get("status") == "error"
        )
        # a console's input refused unrun is the console's to show: the rank is healthy
        if failed and content.get("ename") != REFUSED_IN_CONSOLE_ENAME:
            ename, evalue = content.get("ename", "Error"), content.get("evalue", "")
            rec.last_error = (f"{ename}: {evalue}" if evalue else str(ename))[:300]
            changed = True
        group = content.get(GROUP_KEY) if kind == EXECUTE_REPLY_MSG_TYPE else None
        if isinstance(group, str) and group != rec.group:  # a cell destroyed or made it
            rec.group = group
            changed = True
        state = content.get("execution_state") if kind == "status" else None
        if state == "busy" and rec.state != RankState.BUSY:
            rec.state, rec.busy_since = RankState.BUSY, time.time()
            changed = True
        elif (
            (state == "idle" or kind == EXECUTE_REPLY_MSG_TYPE)
            and rec.state == RankState.BUSY
            and self._current is None  # a cell of this process's own ends in _run_cell
        ):
            rec.state, rec.busy_since = RankState.IDLE, None
            changed = True
        if changed:
            self._changed_soon()

    def _changed_soon(self) -> None:
        """`_changed` once for a burst of rank news (every rank starts a cell at once)."""
        if self._change_pending:
            return
        self._change_pending = True

        def fire() -> None:
            self._change_pending = False
            self._changed()

        asyncio.get_running_loop().call_later(CHANGE_COALESCE_S, fire)

    async def sample(self) -> SessionMetrics:
        """Every node's CPU, memory and GPUs and every rank's CPU and memory now, as its
        node's agent measures them; a node that does not answer says why."""

        async def one(node: AgentClient) -> tuple[AgentClient, NodeSample | str]:
            try:
                reply = await node.request("sample", timeout=SAMPLE_TIMEOUT_S)
            except Exception as err:
                return node, f"{type(err).__name__}: {err}"
            return node, reply["sample"]

        replies = await asyncio.gather(*(one(n) for n in self.nodes if not n.lost))
        nodes: list[NodeMetrics] = []
        ranks: list[RankSample] = []
        for node, got in replies:
            if isinstance(got, str):
                nodes.append(
                    {
                        "node_rank": node.node_rank,
                        "host": node.host,
                        "cpu_percent": None,
                        "cpus": 0,
                        "mem_used_mib": None,
                        "mem_total_mib": None,
                        "gpus": [],
                        "error": got,
                    }
                )
                continue
            nodes.append(
                {
                    "node_rank": node.node_rank,
                    "host": node.host,
                    "cpu_percent": got["cpu_percent"],
                    "cpus": got["cpus"],
                    "mem_used_mib": got["mem_used_mib"],
                    "mem_total_mib": got["mem_total_mib"],
                    "gpus": got["gpus"],
                    "error": "",
                }
            )
            ranks.extend(got["ranks"])
        return {
            "time": time.time(),
            "nodes": nodes,
            "ranks": sorted(ranks, key=lambda r: r["rank"]),
        }

    async def read_log(self, rank: int, offset: int = 0, kind: LogKind = "diagnostics") -> RankLog:
        """A piece of rank ``rank``'s log from byte ``offset`` (at most 256 KiB), read by
        its node's agent, wherever the node is: its ``output`` (what its cells showed,
        `rank.output_log`) or its ``diagnostics`` (the process log)."""
        (rank,) = self.check_ranks([rank])
        rec = self.ranks[rank]
        if rec.node is None:
            raise SessionError(f"rank {rank}: its node's agent is not this process's")
        reply = await asyncio.wait_for(
            rec.node.request("read_log", rank=rank, offset=offset, kind=kind),
            LOG_READ_TIMEOUT_S,
        )
        text = str(reply.get("text", ""))
        start = int(reply.get("start", offset))
        end = int(reply.get("end", start + len(text.encode())))
        path = str(reply.get("path", rec.log))
        return {"rank": rank, "kind": kind, "path": path, "offset": start, "end": end, "text": text}

    # -- rank deaths ------------------------------------------------------------------
    def _on_rank_exit(self, rank: int, returncode: int, log_tail: str) -> None:
        self._rank_died(rank, returncode, log_tail)

    def _on_node_lost(self, node: AgentClient) -> None:
        """The node is out of reach: its agent exited (its ranks die with it, PDEATHSIG),
        the link to it was lost, or it stopped answering; its ranks are given up on, with
        the reason."""
        reason = node.lost_reason or f"the agent of node {node.host!r} exited"
        for rec in list(self.ranks.values()):
            if rec.node is node and rec.state != RankState.DEAD:
                self._rank_died(rec.rank, None, reason, how=node.lost_summary or reason)

    async def stacks(self, ranks: Sequence[int] | None = None) -> dict[int, str]:
        """Each rank's stack dump, asked of the agents of the ranks' nodes."""
        chosen = self.check_ranks(ranks)
        by_node: dict[AgentClient, list[int]] = {}
        for r in chosen:
            rec = self.ranks[r]
            if rec.node is not None and not rec.node.lost and rec.state != RankState.DEAD:
                by_node.setdefault(rec.node, []).append(r)
        found: dict[int, str] = {}
        for dumps in await asyncio.gather(*(n.stacks(rs) for n, rs in by_node.items())):
            found.update(dumps)
        for r in chosen:
            if r not in found:
                found[r] = ""
        return found

    async def free_from_collective(self, ranks: Sequence[int]) -> list[int]:
        """Ask ``ranks`` to free themselves from a collective of their process group,
        through their nodes' agents; the ranks asked."""
        by_node: dict[AgentClient, list[int]] = {}
        for r in ranks:
            rec = self.ranks[r]
            if rec.node is not None and not rec.node.lost and rec.state != RankState.DEAD:
                by_node.setdefault(rec.node, []).append(r)
        asked: list[int] = []
        for found in await asyncio.gather(
            *(n.free(rs) for n, rs in by_node.items()), return_exceptions=True
        ):
            if isinstance(found, list):
                asked += found
        return sorted(asked)

    # -- healing and resizing ---------------------------------------------------------
    async def heal(
        self, ranks: Sequence[int] = (), progress: Progress | None = None, new_group: str = ""
    ) -> str:
        """Replace the ranks that died, were stuck or were lost (and ``ranks``) with fresh
        rank kernels of the same rank numbers, starting lost nodes again (the same host,
        else a spare of `spares`); then every rank joins a new process group. Survivors
        keep their namespace. Returns what was done, in words (`recovery.heal_report`)."""
        async with self._healing:  # a second heal asked meanwhile finds nothing left
            return await self._heal(ranks, progress or (lambda _: None), new_group)

    async def _heal(self, ranks: Sequence[int], say: Progress, new_group: str = "") -> str:
        if self.state == SessionState.STOPPED:
            raise SessionError(f"session {self.name!r} was shut down; start it again instead")
        failed = self.recovery.failed_restart
        if failed is not None:  # no rank is left to keep
            raise SessionError(
                f"session {self.name!r}: its restart failed and stopped every rank, so "
                f"there is nothing to heal. {failed.advice(self.name)}"
            )
        lost_nodes = [n.node_rank for n in self.nodes if n.lost]
        plan = self.recovery.plan(lost_nodes, ranks)
        if not plan.replace and not plan.nodes and not new_group:
            return f"session {self.name!r} has nothing to heal: every rank is alive"
        self.move(SessionState.HEALING)
        try:
            rebuild = await asyncio.wait_for(
                self._replace(plan.replace, plan.nodes, say), self.timeouts.restart
            )
        except BaseException as err:
            why = (
                "did not finish in time"
                if isinstance(err, asyncio.TimeoutError)
                else (str(err).splitlines()[0][:300] if str(err) else type(err).__name__)
            )
            self.broken_reason = f"a heal that failed: {why}"
            self.state = SessionState.BROKEN
            if isinstance(err, asyncio.TimeoutError):
                raise SessionError(
                    f"session {self.name!r}: replacing {ranks_label(list(plan.replace))} did "
                    f"not finish within {self.timeouts.restart:.0f} s; `%dist heal` tries "
                    "again, `%dist restart` starts every rank afresh"
                ) from None
            raise
        text = self.recovery.healed(plan, rebuild, new_group)
        self.broken_reason = ""
        self.move(SessionState.READY)
        self.turns.ranks_restarted()
        log.info("session %s healed: %s", self.name, text)
        return text

    async def _replace(
        self, replace: Sequence[int], lost_nodes: Sequence[int], say: Progress
    ) -> dict[int, list[str]]:
        """Stop ``replace`` where they still run, start ``lost_nodes`` again, spawn fresh
        ranks in their places and regroup everyone; what each survivor had built on the
        old group."""
        for r in replace:  # dead or not, their connections go (the context ends with them)
            rec = self.ranks[r]
            if rec.client is not None:
                await rec.client.close()
                rec.client = None
        # one with no process (its spawn failed in a heal or resize) has nothing to stop
        alive = [
            r
            for r in replace
            if self.ranks[r].state != RankState.DEAD and self.ranks[r].pid is not None
        ]
        await self._kill_ranks(alive)
        for node in lost_nodes:
            await self._restart_node(node, say)
        return await self._regroup(list(replace), bool(lost_nodes), say)

    async def resize(self, counts: Sequence[int], progress: Progress | None = None) -> str:
        """Give the session ``counts`` ranks per node: ranks are added after the survivors
        (on new nodes, or at the end of a one-node session) or the highest removed; every
        survivor keeps its rank number and its variables, and all join a new group."""
        say = progress or (lambda _: None)
        self._check_usable()
        new_spec = _resized(self.spec, tuple(counts))
        old_places, new_places = places(self.spec), places(new_spec)
        common = min(len(old_places), len(new_places))
        if old_places[:common] != new_places[:common]:
            raise SpecError(
                f"resize to {_counts_text(counts)} ranks per node would renumber the ranks "
                "that stay; a resize adds or removes whole nodes, or ranks at the end of a "
                "one-node session"
            )
        added_nodes = list(range(self.spec.nodes, new_spec.nodes))
        if added_nodes and self.spec.hosts and len(self.spares) < len(added_nodes):
            raise SpecError(
                f"resize to {new_spec.nodes} nodes: {len(added_nodes)} more host(s) needed, "
                f"{len(self.spares)} spare(s) given; name them with --spares HOST,..."
            )
        placement = self.placement
        if new_spec.nodes != self.spec.nodes and placement is not None and not placement.resizable:
            raise SpecError(
                f"resize: adding or removing nodes of a {self.spec.launcher} session is not "
                "supported; its nodes are placed when it starts (restart it with --nodes "
                f"{new_spec.nodes})"
            )
        removed = [p.rank for p in old_places[common:]]
        added = [p.rank for p in new_places[common:]]
        if not removed and not added:
            return f"session {self.name!r} already has {_counts_text(counts)} ranks per node"
        if added_nodes and placement is not None:
            # the cluster holds the new nodes' machines first: one it cannot hold changes
            # nothing of the session
            cluster = _CLUSTER_NAMES.get(self.spec.launcher, self.spec.launcher)
            say(f"asking {cluster} for {len(added_nodes)} more node(s)")
            await placement.resize(new_spec, say, self.timeouts.start)
        self.move(SessionState.HEALING)
        before = (self.spec, len(self.nodes), self.spares, self.rank_vars.get(GENERATION_VAR))
        self._joining = False
        try:
            await asyncio.wait_for(
                self._resize(new_spec, removed, added, added_nodes, say), self.timeouts.restart
            )
        except BaseException as err:
            why = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            if added and not self._joining and isinstance(err, Exception):
                # no survivor left its group: the grow is undone, nothing was lost
                await self._undo_grow(before, added, say)
                raise SessionError(
                    f"session {self.name!r}: adding {ranks_label(added)} failed, so the resize "
                    f"was undone: {why}. Its {self.spec.world_size} ranks are as they were, "
                    f"with their variables; `%dist resize` tries again"
                ) from err
            self.broken_reason = f"a resize that failed: {why}"
            self.state = SessionState.BROKEN
            raise
        self.recovery.generation += 1
        self.recovery.faults.clear()
        self.move(SessionState.READY)
        self.turns.ranks_restarted()
        self.recovery.replaced = tuple(added)
        text = resize_report(added, removed, new_spec.world_size, self.generation)
        log.info("session %s resized: %s", self.name, text)
        return text

    async def _undo_grow(
        self,
        before: tuple[SessionSpec, int, tuple[HostSpec, ...], str | None],
        added: list[int],
        say: Progress,
    ) -> None:
        """A grow that failed before any survivor left its group: its ranks and nodes go,
        and the session is as it was (``before``: its spec, node count, spares and
        generation variable then)."""
        spec, node_count, spares, generation_var = before
        for r in added:
            rec = self.ranks.get(r)
            if rec is not None and rec.client is not None:
                await rec.client.close()
                rec.client = None
        started = [
            r
            for r in added
            if r in self.ranks
            and self.ranks[r].pid is not None
            and self.ranks[r].state != RankState.DEAD
        ]
        try:
            await self._kill_ranks(started)
        except Exception as err:  # the agent is stopped below if its node was added
            log.warning("session %s: undoing a resize: %s", self.name, err)
        for r in added:
            self.ranks.pop(r, None)
        for node in self.nodes[node_count:]:
            with contextlib.suppress(Exception):
                await node.stop()
        grown = self.spec.nodes
        self.nodes, self.spec, self.spares = self.nodes[:node_count], spec, spares
        if generation_var is not None:
            self.rank_vars[GENERATION_VAR] = generation_var
        if self.placement is not None and grown != spec.nodes:
            try:  # the added nodes' machines go back to the cluster
                await self.placement.resize(spec, say, self.timeouts.start)
            except Exception as err:  # held until the session stops, which gives all back
                log.warning("session %s: giving back added nodes: %s", self.name, err)
        self.move(SessionState.READY)
        self._changed()

    async def _resize(
        self,
        new_spec: SessionSpec,
        removed: list[int],
        added: list[int],
        added_nodes: list[int],
        say: Progress,
    ) -> None:
        for r in removed:
            rec = self.ranks[r]
            if rec.client is not None:
                await rec.client.close()
                rec.client = None
        await self._kill_ranks([r for r in removed if self.ranks[r].state != RankState.DEAD])
        for r in removed:
            del self.ranks[r]
        for node in range(new_spec.nodes, self.spec.nodes):  # nodes left without ranks
            with contextlib.suppress(Exception):
                await self.nodes[node].stop()
        self.nodes = self.nodes[: new_spec.nodes]
        if self.placement is not None and new_spec.nodes < self.spec.nodes:
            try:  # their machines go back to the cluster
                await self.placement.resize(new_spec, say, self.timeouts.start)
            except Exception as err:  # held until the session stops, which gives all back
                log.warning("session %s: giving back removed nodes: %s", self.name, err)
                say(f"the removed nodes' machines could not be given back yet: {err}")
        hosts = list(self.spec.hosts)
        for node in added_nodes:
            if hosts:
                spare, self.spares = self.spares[0], self.spares[1:]
                hosts.append(spare)
                new_spec = dataclasses.replace(new_spec, hosts=tuple(hosts))
            self.spec = new_spec
            launcher = (
                self.placement.launcher(new_spec, node)
                if self.placement is not None
                else self.launchers(new_spec, node)
            )
            agent = AgentClient(
                launcher, node, self._on_rank_exit, self._on_node_lost,
                heartbeat=self.nodes[0].heartbeat,
            )  # fmt: skip
            say(f"node {node}: starting its agent on {launcher.label or launcher.host}")
            await agent.start(self.name, self._agent_env(node), self.timeouts.start)
            self.nodes.append(agent)
        self.spec = new_spec
        room_for_sockets(self._context, 3 * new_spec.world_size)
        for place in places(new_spec):
            if place.rank in added:
                agent = self.nodes[place.node_rank]
                self.ranks[place.rank] = RankRecord(place, agent.host, agent)
        await self._regroup(added, bool(added_nodes), say)

    async def _kill_ranks(self, ranks: Sequence[int], grace: float = 0.0) -> None:
        """Stop ``ranks`` (SIGKILL after ``grace``) and wait until their agents say so."""
        by_node: dict[AgentClient, list[int]] = {}
        for r in ranks:
            rec = self.ranks[r]
            if rec.node is not None and not rec.node.lost:
                by_node.setdefault(rec.node, []).append(r)
        await asyncio.gather(
            *(n.kill(rs, grace) for n, rs in by_node.items()), return_exceptions=True
        )
        deadline = time.monotonic() + grace + 10.0
        while any(self.ranks[r].state != RankState.DEAD for r in ranks):
            if time.monotonic() > deadline:
                left = [r for r in ranks if self.ranks[r].state != RankState.DEAD]
                raise SessionError(f"{ranks_label(left)} did not exit after SIGKILL")
            await asyncio.sleep(0.01)

    def _new_agent(self, node: int, launcher: Launcher) -> AgentClient:
        return AgentClient(
            launcher,
            node,
            self._on_rank_exit,
            self._on_node_lost,
            heartbeat=self.nodes[node].heartbeat if node < len(self.nodes) else None,
        )

    async def _restart_node(self, node: int, say: Progress) -> None:
        """Start node ``node``'s agent again: on its own host, else on the first spare that
        answers (the spare then is that node)."""
        old = self.nodes[node]
        with contextlib.suppress(Exception):
            await old.stop()
        if self.placement is not None:  # its actor or pod is gone with the node
            cluster = _CLUSTER_NAMES.get(self.spec.launcher, self.spec.launcher)
            say(f"node {node}: asking {cluster} for a machine in its place")
            await self.placement.replace_node(node, say, self.timeouts.start)
            agent = self._new_agent(node, self.placement.launcher(self.spec, node))
            try:
                await agent.start(self.name, self._agent_env(node), self.timeouts.start)
            except BaseException:
                with contextlib.suppress(Exception):
                    await agent.stop()
                raise
            self.nodes[node] = agent
            for rec in self.ranks.values():
                if rec.place.node_rank == node:
                    rec.node, rec.host = agent, agent.host
            return
        candidates: list[tuple[str, Callable[[], Launcher]]] = [
            (old.host, lambda: self._launcher_for(node, None))
        ]
        for spare in self.spares:
            candidates.append((str(spare), functools.partial(self._launcher_for, node, spare)))
        failures: list[str] = []
        env = self._agent_env(node)
        for label, make in candidates:
            say(f"node {node}: starting its agent on {label}")
            agent = self._new_agent(node, make())
            try:
                await agent.start(self.name, env, self.timeouts.start)
            except Exception as err:
                failures.append(f"{label}: {str(err).splitlines()[0][:200]}")
                with contextlib.suppress(Exception):
                    await agent.stop()
                continue
            self.nodes[node] = agent
            if label != old.host and self.spec.hosts:  # the spare is that node from now on
                spare = next(s for s in self.spares if str(s) == label)
                self.spares = tuple(s for s in self.spares if s is not spare)
                hosts = list(self.spec.hosts)
                hosts[node] = spare
                self.spec = dataclasses.replace(self.spec, hosts=tuple(hosts))
            for rec in self.ranks.values():
                if rec.place.node_rank == node:
                    rec.node, rec.host = agent, agent.host
            return
        raise AgentError(
            f"node {node} could not be started again: " + "; ".join(failures)
            + ("" if self.spares or self.spec.launcher != "ssh" else
               "; `%dist heal --spares HOST,...` names other hosts to take its place")
        )  # fmt: skip

    def _launcher_for(self, node: int, spare: HostSpec | None) -> Launcher:
        """Node ``node``'s launcher: its own host's, or ``spare``'s."""
        if self.placement is not None:
            return self.placement.launcher(self.spec, node)
        spec = self.spec
        hosts = list(spec.hosts)
        if spare is not None and hosts:
            hosts[node] = spare
            spec = dataclasses.replace(spec, hosts=tuple(hosts))
        return self.launchers(spec, node)

    async def _regroup(
        self, replace: list[int], nodes_restarted: bool, say: Progress
    ) -> dict[int, list[str]]:
        """Spawn ``replace`` afresh and make every rank join a new process group (its keys
        under the next generation); the survivors' words on what they built before.

        The store stays rank 0's; a new rank 0 hosts a new one: across machines where
        node 0's agent says a port is free (and each node's route to it is looked up
        again when a node was started anew), on this machine at a port free now."""
        generation = self.recovery.generation + 1
        assert self.rendezvous is not None
        run_id = self.rendezvous.run_id
        if self.spec.remote and (0 in replace or nodes_restarted):
            found, self.node_env = await plan_rendezvous(self.spec, self.nodes, self.user_env)
            self.rendezvous = dataclasses.replace(found, run_id=run_id)
        elif 0 in replace:
            self.rendezvous = dataclasses.replace(
                Rendezvous.local(self._port_range()), run_id=run_id
            )
        rdzv = self.rendezvous
        for r in replace:
            old = self.ranks[r]
            self.ranks[r] = RankRecord(old.place, old.node.host if old.node else old.host, old.node)
        say(f"starting {ranks_label(replace)}")
        self.rank_vars[GENERATION_VAR] = str(generation)
        await asyncio.gather(*(self._spawn(self.ranks[r]) for r in replace))
        if 0 in replace:
            hosted = await self._run_cell(
                self._host_store_code(rdzv), [0], sink=None, timeout=self.timeouts.start,
                silent=True,
            )  # fmt: skip
            if hosted.failures:
                raise RanksFailed(self.name, self.spec.world_size, hosted.failures)
            await check_reachable(self.spec, self.nodes, rdzv)
        say(f"{ranks_label(sorted(self.ranks))} joining a new process group")
        self._joining = True  # from here on the survivors leave their group
        init = self.spec.init_process_group
        outputs: queue.SimpleQueue[CellEvent] = queue.SimpleQueue()
        joined = await self._run_cell(  # new ranks bootstrap, survivors regroup
            "import jupyter_dist.rank.regroup as _jd_regroup\n"
            f"_jd_regroup.join({init!r}, {rdzv.master_addr!r}, {rdzv.master_port}, "
            f"{self.spec.world_size}, {generation}, {self.timeouts.process_group!r}, "
            f"{list(self.spec.counts)!r}, {not replace})\n"
            "del _jd_regroup\n",
            sorted(self.ranks), sink=outputs,
            timeout=self.timeouts.process_group + 30, silent=True,
        )  # fmt: skip
        if joined.failures:
            raise RanksFailed(self.name, self.spec.world_size, joined.failures)
        made = self.spec.backend if init else ""
        for r in sorted(self.ranks):
            rec = self.ranks[r]
            rec.state, rec.group = RankState.IDLE, made
        self._changed()
        return _rebuild_words(outputs)

    def _port_range(self) -> PortRange | None:
        ports = self.user_env.get(PORTS_VAR, "")
        return parse_port_range(ports) if ports else None

    # -- restart and shutdown -------------------------------------------------------------
    async def _stop_ranks(self, grace: float) -> None:
        await self.close_clients()
        live = [n for n in self.nodes if not n.lost]
        await asyncio.gather(*(n.kill(None, grace) for n in live), return_exceptions=True)
        deadline = time.monotonic() + grace + 5.0
        reporting = [r for r in self.ranks.values() if r.node and not r.node.lost]
        while any(r.state != RankState.DEAD for r in reporting):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.005)

    async def restart(self, progress: Progress = lambda _: None) -> None:
        """Fresh rank kernels, same shape; the agents (and their warm imports) stay while
        every one runs, else all are started afresh (`recovery.RestartPlan`). One that
        fails leaves the session BROKEN, its error saying what must happen before the
        next can work (`recovery.FailedRestart`)."""
        if self.state == SessionState.STOPPED:
            raise SessionError(f"session {self.name!r} was shut down; start it again instead")
        self.state = SessionState.RESTARTING
        self.turns.ranks_restarted()
        try:
            await asyncio.wait_for(self._restart(progress), self.timeouts.restart)
        except asyncio.TimeoutError:
            self.state = SessionState.BROKEN
            self.broken_reason = (
                f"its restart, which did not finish within {self.timeouts.restart:.0f} s"
            )
            await self._give_up_nodes()
            self.recovery.restart_failed()
            raise SessionError(
                f"session {self.name!r}: the restart did not finish within "
                f"{self.timeouts.restart:.0f} s; its nodes were stopped. Run `%dist restart "
                f"--session {self.name}` again, or `%dist shutdown --session {self.name}`"
            ) from None
        except BaseException as err:
            self.state = SessionState.BROKEN
            why = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            self.broken_reason = f"its restart, which failed: {why}"
            unreachable = [(n.host, n.unreachable) for n in self.nodes if n.unreachable]
            cluster = _CLUSTER_NAMES.get(self.spec.launcher, self.spec.launcher)
            failed = self.recovery.restart_failed(
                unreachable, cluster if self.placement is not None else ""
            )
            if type(err) in (AgentError, SessionError):  # what to do now, said with it
                raise type(err)(f"{err}\n{failed.advice(self.name)}") from err
            raise
        self.state = SessionState.READY
        self.broken_reason = ""
        self.recovery.restarted()
        self.turns.ranks_restarted()  # fresh ranks: no error of theirs yet
        log.info("session %s restarted", self.name)

    async def restart_ranks(self) -> None:
        await self.restart()

    async def _restart(self, progress: Progress) -> None:
        self.recovery.generation += 1  # fresh ranks, a new group
        self.rank_vars[GENERATION_VAR] = str(self.recovery.generation)
        plan = self.recovery.plan_restart([n.running for n in self.nodes])
        if plan.fresh_agents:  # lost, stopped, or not started by a restart that failed
            await self._give_up_nodes()
            await self._start_nodes(progress)
        else:
            await self._stop_ranks(0.0)
        await self._start_ranks(progress)

    async def _give_up_nodes(self) -> None:
        """Stop every agent (a lost node's for good), and give back what the cluster held
        for them (the next start places the session anew), so that the next start is
        fresh."""
        await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
        await self._stop_ranks(0.0)
        placement, self.placement = self.placement, None
        if placement is not None:
            try:
                await placement.release()
            except Exception as err:  # the agents are gone; say what may be left
                log.warning("session %s: releasing its placement: %s", self.name, err)

    async def shutdown(self) -> None:
        """Stop every rank and agent; safe to call twice and from any state."""
        if self.state == SessionState.STOPPED:
            return
        self.state = SessionState.STOPPED
        self.turns.clear()
        await self.close_clients()
        await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
        if self.placement is not None:
            try:
                await self.placement.release()
            except Exception as err:  # the agents are gone; say what may be left
                log.warning("session %s: releasing its placement: %s", self.name, err)
        with contextlib.suppress(Exception):
            self._context.destroy(linger=0)
        log.info("session %s shut down", self.name)

    # -- reporting ---------------------------------------------------------------------
    def connection_info(self) -> SessionConnection:
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

    def status(self) -> SessionStatus:
        """A JSON-able picture of the session, for `%dist status` and the UI."""
        return {
            "name": self.name,
            "state": self.state.value,
            "shape": self.spec.describe(),
            "spec": self.spec.to_json(),
            "world_size": self.spec.world_size,
            "backend": self.spec.backend,
            "device": self.spec.device,
            "cells_run": self.cells_run,
            "broken_reason": self.broken_reason,
            "generation": self.generation,
            "faults": [f.sentence() for f in self.recovery.faults.values()],
            "replaced": list(self.recovery.replaced),
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
                    "exit": _exit_summary(r),
                    "returncode": r.exit_code,
                    "exit_tail": r.exit_tail,
                    "log": r.log,
                    "busy_since": r.busy_since or self.turns.busy_since(r.rank),
                    "last_error": r.last_error or self.turns.last_errors.get(r.rank, ""),
                    "group": r.group,
                }
                for r in sorted(self.ranks.values(), key=lambda r: r.rank)
            ],
            "started_at": self.started_at,
            "straggler_s": self.straggler_s,
            "notebook": self.notebook,
            "notebook_id": self.notebook_id,
            "notebooks": sorted(self.notebooks.values(), key=lambda n: n["since"]),
            **self.turns.status(),
            "cluster": self.placement.hold() if self.placement is not None else None,
        }


def _resized(spec: SessionSpec, counts: tuple[int, ...]) -> SessionSpec:
    """``spec`` with ``counts`` ranks per node."""
    if not counts or any(c < 1 for c in counts):
        raise SpecError(f"resize: expected at least one node of one rank or more, got {counts}")
    uniform = len(set(counts)) == 1
    return dataclasses.replace(
        spec,
        nodes=len(counts),
        procs_per_node=counts[0] if uniform else spec.procs_per_node,
        node_procs=() if uniform else counts,
    )


def _counts_text(counts: Sequence[int]) -> str:
    return ",".join(map(str, counts))


#: the clusters' own names, as progress says them
_CLUSTER_NAMES = {"ray": "Ray", "k8s": "Kubernetes", "slurm": "Slurm"}


def _rebuild_words(outputs: queue.SimpleQueue[CellEvent]) -> dict[int, list[str]]:
    """What each survivor's regroup said it had built on the old group (`REBUILD_MARK`)."""
    found: dict[int, list[str]] = {}
    texts: dict[int, str] = {}
    while True:
        try:
            event = outputs.get_nowait()
        except queue.Empty:
            break
        if isinstance(event, StreamOut):
            texts[event.rank] = texts.get(event.rank, "") + event.text
    for rank, text in texts.items():
        for line in text.splitlines():
            if line.startswith(REBUILD_MARK):
                with contextlib.suppress(ValueError):
                    found[rank] = [str(n) for n in json.loads(line[len(REBUILD_MARK) :])]
    return found


def _exit_summary(rec: RankRecord) -> str | None:
    """How a dead rank ended, in a line: its exit status, or why it is out of reach."""
    if rec.exit_code is not None:
        return describe_returncode(rec.exit_code)
    return rec.lost or None


__all__ = [
    "LauncherFactory",
    "PlacementFactory",
    "RankRecord",
    "RankState",
    "Session",
    "SessionState",
    "SessionTimeouts",
]
