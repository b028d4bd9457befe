"""Rank kernels that cells run on: what a session's owner and an attached notebook share.

A `RankGroup` holds one kernel client per rank and runs cells, interrupts, push and pull
over them. `control.session.Session` is the group that also starts and stops its ranks;
`server_client.attached_session.AttachedSession` is the group a notebook kernel builds from
the connection details of a session the Jupyter server owns. Both run cells the same way.

A session's life (READY, DEGRADED, HEALING, ...) is `control.recovery`'s state machine;
each rank's (`RankState`)::

    STARTING ──> IDLE <──> BUSY ──> DEAD
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import queue
import resource
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import zmq.asyncio

from jupyter_dist.common import pickling, stacks
from jupyter_dist.common import shared_push as shared_push_file
from jupyter_dist.common.agent_protocol import describe_returncode
from jupyter_dist.common.events import CellEvent, CellFinished, CellResult, Notice, StreamOut
from jupyter_dist.common.payloads import KernelConnection
from jupyter_dist.common.shared_push import SharedPushUnreadable
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.common.wire_codec import Encoded
from jupyter_dist.control.cell_queue import CellQueue, Sender, Turn, TurnKind
from jupyter_dist.control.cell_tracker import CellTracker
from jupyter_dist.control.debugger_pause import paused_words
from jupyter_dist.control.iopub_fan_in import IopubFanIn
from jupyter_dist.control.node_shell import NodeShell
from jupyter_dist.control.rank_client import CHANNELS, FanOut, RankClient
from jupyter_dist.control.rank_env import RankPlace
from jupyter_dist.control.recovery import Fault, Recovery, SessionState, check_move
from jupyter_dist.errors import (
    CellInterrupted,
    CellTimeout,
    DistError,
    FailureKind,
    PullError,
    PushError,
    RanksFailed,
    SessionError,
    SpecError,
)
from jupyter_dist.settings import (
    ABORT_AFTER_VAR,
    INTERRUPT_ACK_VAR,
    STRAGGLER_VAR,
    node_relay,
    seconds_from_env,
    shared_push,
)
from jupyter_dist.text import format_ranks, ranks_label

if TYPE_CHECKING:
    from jupyter_dist.control.agent_client import AgentClient

log = logging.getLogger(__name__)

#: seconds between a node's relay connection breaking and judging it a relay restart
#: (a whole node stopping breaks it too, with its agent's end heard just after)
RELAY_LOST_GRACE_S = 1.0
#: how long push and pull wait for every rank's answer, unless told otherwise
OBJECTS_TIMEOUT_S = 300.0
#: how often a running cell is looked at (stragglers, ranks left waiting on a failed one)
WATCH_TICK_S = 0.25
#: default seconds a rank may run on after the others finished before it is named
STRAGGLER_S = 30.0
#: default seconds the other ranks get to finish after one raised or died, before they
#: are interrupted (they are usually blocked in a collective the failed rank never joins)
ABORT_AFTER_S = 3.0
#: default seconds an interrupted rank has to say that Python took the interrupt
#: (`rank.interrupt_ack`) before its stack is looked at: one outside Python then (blocked
#: in C code, a collective another rank never joined, where no interrupt reaches) is
#: stuck; one that took it is handling it, however long that takes
INTERRUPT_ACK_S = 10.0
#: seconds between the two stack dumps that tell a rank blocked in one call (C code) from
#: one moving through Python
SAME_PLACE_GAP_S = 0.5
#: seconds a rank freed from a collective (`rank.group_sockets`) has to say that Python
#: took the interrupt before it counts as stuck after all
FREE_WAIT_S = 5.0
#: the name of the notice line that says what a request waits for (`Notice.line`)
WAITING_LINE = "waiting"
#: the line that says which ranks wait for a console's code on them
CONSOLE_LINE = "console"
#: what a restart after a rank that could not be stopped tells the user, in words
STUCK_WHY = (
    "blocked in C code, most likely a collective that another rank never joined, where "
    "an interrupt cannot reach it"
)
STACKS_TIMEOUT_S = 10.0
#: notices kept for this process's next cell
MAX_NEWS = 16
#: characters kept a rank of what background threads printed between this process's cells
LATE_OUTPUT_CHARS = 64 * 1024
#: sockets a session's context may open beyond the three of each rank
SPARE_SOCKETS = 64
#: open files a socket may take (its wake-up descriptor, its connection), and the spare
FILES_PER_SOCKET = 2
SPARE_FILES = 1024


class RankState(str, enum.Enum):
    """One rank kernel, as this process sees it::

        STARTING ──(bootstrapped, or attached)──> IDLE <──(cell sent / cell ended)──> BUSY
            │                                      │                                  │
            └──────────────────────────────────────┴─(exited, node or server lost)─> DEAD

    A rank is BUSY from the moment its ``execute_request`` goes out until the cell has
    ended on every rank it ran on; the bootstrap cells run the same way, so a starting
    rank is BUSY while they run. DEAD is final: a restart makes new `RankRecord` values.
    """

    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"


def room_for_sockets(context: zmq.Context[Any], sockets: int) -> None:
    """Let ``context`` open ``sockets`` sockets and this process the files they take.

    zmq allows 1,023 sockets a context by default, and many systems 1,024 open files a
    process; a session of a few hundred ranks needs more of both (each rank's sockets,
    their wake-up descriptors and connections). The soft file limit is raised towards the
    hard one, as servers do; where the hard limit is lower, the first rank over it fails
    to connect with "Too many open files".
    """
    if sockets + SPARE_SOCKETS > context.get(zmq.MAX_SOCKETS):
        context.set(zmq.MAX_SOCKETS, sockets + SPARE_SOCKETS)
    wanted = FILES_PER_SOCKET * sockets + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))


@dataclass
class RankRecord:
    """The live state of one rank."""

    place: RankPlace
    host: str
    node: AgentClient | None = None  # the agent that started it (None: someone else did)
    state: RankState = RankState.STARTING
    pid: int | None = None
    client: RankClient | None = None
    exit_code: int | None = None
    exit_tail: str = ""  # the end of its log when it died
    lost: str = ""  # why it is out of reach, when its node is (it has no exit status)
    log: str = ""
    connection: KernelConnection | None = None  # reachable from this process (tunnelled)
    busy_since: float | None = None  # epoch s its current cell began
    last_error: str = ""  # the error line of its last failed cell
    last_cell: str = ""  # the msg_id of the last cell it was seen running, whoever sent it
    group: str = ""  # its default process group's backend as its last cell left it ("": none)

    @property
    def rank(self) -> int:
        return self.place.rank


class RankGroup:
    """Kernel clients for the ranks of one session, and the cell protocol over them."""

    def __init__(self, spec: SessionSpec, key: str) -> None:
        self.spec = spec
        self.key = key  # HMAC key of every kernel message in the session
        self.ranks: dict[int, RankRecord] = {}
        self.on_change: Callable[[RankGroup], None] | None = None
        self._state = SessionState.STARTING
        self.broken_reason = ""
        #: whose turn it is on the ranks; the sender this process's requests carry
        self.turns = CellQueue(self._changed)
        self.sender = Sender()
        self._waiting: str | None = None  # the turn this process waits for
        #: tasks started on the group's behalf, kept until they end
        self.background: set[asyncio.Future[Any]] = set()
        #: what others did to the session (told by its owner), for this process's next cell
        self.news: list[str] = []
        #: rank -> what threads of this process's ended cells printed since (bounded)
        self.late_output: dict[int, str] = {}
        #: the rank whose traceback the last failed cell of this process was caused by
        self.debuggable_rank: int | None = None
        self._context = zmq.asyncio.Context()
        room_for_sockets(self._context, len(CHANNELS) * spec.world_size)
        # a kernel binds its ports a few ms after it is forked: reconnect quickly
        self._context.setsockopt(zmq.RECONNECT_IVL, 10)
        # a flooding rank is held back by its own send queue, not buffered here
        self._context.setsockopt(zmq.RCVHWM, 32)
        # a socket closed (or collected) with messages still queued for a rank that is
        # gone must not hold the context's end: nothing here needs them delivered
        self._context.setsockopt(zmq.LINGER, 0)
        self._iopub: IopubFanIn | None = None  # made with the first client
        self._shells: dict[str, NodeShell] = {}  # by the relay's shell socket
        #: the objects channel's id on every rank (`RankClient.objects_comm`)
        self._objects_comm = uuid.uuid4().hex
        self.shared_pushes = 0  # pushes whose buffers went through shared memory
        self._current: CellTracker | None = None
        self.stale = False  # its ranks were replaced behind this object's back
        self.straggler_s = seconds_from_env(STRAGGLER_VAR, STRAGGLER_S)
        self.abort_after_s = seconds_from_env(ABORT_AFTER_VAR, ABORT_AFTER_S)
        self.interrupt_ack_s = seconds_from_env(INTERRUPT_ACK_VAR, INTERRUPT_ACK_S)
        #: the faults since the last process group, and the group's generation
        self.recovery = Recovery()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cells_run(self) -> int:
        return self.turns.cells_run

    @property
    def state(self) -> SessionState:
        return self._state

    @state.setter
    def state(self, value: SessionState) -> None:
        self._state = value
        self._changed()

    def move(self, value: SessionState) -> None:
        """Move the session's state as `control.recovery`'s machine allows."""
        check_move(self.name, self._state, value)
        self.state = value

    @property
    def generation(self) -> int:
        """How many times the ranks joined a new process group since the session began."""
        return self.recovery.generation

    def _changed(self) -> None:
        """Tell whoever watches (the server's event stream) that something moved."""
        if self.on_change is not None:
            self.on_change(self)

    def _rank_died(
        self, rank: int, returncode: int | None, log_tail: str, how: str | None = None
    ) -> None:
        """Record a rank's death, or its loss (``returncode`` None, ``how`` says why: its
        node is out of reach): the session breaks and a running cell learns of it."""
        rec = self.ranks.get(rank)
        if rec is None or rec.state == RankState.DEAD:
            return
        rec.state = RankState.DEAD
        rec.exit_code = returncode
        rec.exit_tail = log_tail
        rec.lost = how or ""
        self._changed()
        what = how or describe_returncode(returncode)
        if rec.client:
            rec.client.fail_waiters(SessionError(f"rank {rank}: {what}"))
        reason = (
            f"rank {rank} (host {rec.host}, pid {rec.pid}): {what}"
            if how
            else f"rank {rank} (host {rec.host}, pid {rec.pid}) {what}"
        )
        if self.state == SessionState.STARTING:
            self.broken_reason = reason
            self.state = SessionState.BROKEN
            log.info("session %s: %s", self.name, self.broken_reason)
        elif self.state in (SessionState.READY, SessionState.DEGRADED):
            fault = Fault(rank, "lost" if how else "died", what, rec.place.node_rank)
            self.recovery.record(fault)
            self.broken_reason = self.broken_reason or reason
            if self.state == SessionState.READY:
                self.state = SessionState.DEGRADED
            log.info("session %s: %s", self.name, reason)
        if self._current is not None:
            self._current.rank_died(rank, returncode, rec.pid, log_tail, how)

    def _relay_lost(self, ranks: list[int]) -> None:
        """The connection to the relay of ``ranks``' node broke. A whole node that stops
        (its agent and ranks too) breaks it first: judged `RELAY_LOST_GRACE_S` later, when
        the agent's end has been heard, so that a crash is not told as a relay restart."""
        asyncio.get_running_loop().call_later(RELAY_LOST_GRACE_S, self._relay_lost_now, list(ranks))

    def _relay_lost_now(self, ranks: list[int]) -> None:
        """The relay of ``ranks``' node stopped (its agent starts another, and the next
        requests go through that one): the answers it held are lost, so nothing waits for
        them. Ranks already dead or out of reach are not its to tell of."""
        ranks = [r for r in ranks if r in self.ranks and self.ranks[r].state != RankState.DEAD]
        if not ranks:
            return
        why = (
            "its node's relay, which carries its answers to this notebook, stopped while "
            "the cell ran (a new one is started); the rank keeps its state and may still "
            "be running the cell"
        )
        log.warning("session %s: the relay of %s stopped", self.name, ranks_label(ranks))
        for rank in ranks:
            rec = self.ranks.get(rank)
            if rec is not None and rec.client is not None:
                rec.client.fail_waiters(SessionError(f"rank {rank}: {why}"))
        if self._current is not None:
            self._current.answers_lost(ranks, why)

    def _check_usable(self, degraded_ok: bool = False) -> None:
        """Raise unless the session can take a request: READY, or DEGRADED where
        ``degraded_ok`` (what its surviving ranks can answer: pull, stacks)."""
        state = self.state
        if state == SessionState.READY or (degraded_ok and state == SessionState.DEGRADED):
            return
        if state == SessionState.DEGRADED:
            raise SessionError(self.degraded_text())
        failed = self.recovery.failed_restart
        if state == SessionState.BROKEN and failed is not None:  # no rank left to heal
            raise SessionError(
                f"session {self.name!r} lost {self.broken_reason}; every rank was stopped. "
                f"{failed.advice(self.name)}"
            )
        if state == SessionState.BROKEN:
            raise SessionError(
                f"session {self.name!r} lost {self.broken_reason}; its process group cannot "
                f"continue. Run `%dist heal --session {self.name}` to replace what was lost "
                f"(the other ranks keep their variables), or `%dist restart --session "
                f"{self.name}` to start every rank afresh"
            )
        raise SessionError(f"session {self.name!r} is {self.state.value}, not ready")

    def degraded_text(self) -> str:
        """Why the session is DEGRADED and what heals it, in words."""
        faults = "; ".join(f.sentence() for f in self.recovery.faults.values())
        alive = [r for r, rec in sorted(self.ranks.items()) if rec.state != RankState.DEAD]
        heal = (
            f"`%dist heal --session {self.name}` starts the node again (or a spare given "
            "with --spares) and replaces the lost ranks; "
            if self.spec.launcher not in ("ray", "k8s")
            else ""
        )
        kept = (
            f"{ranks_label(alive)} kept {'its' if len(alive) == 1 else 'their'} state "
            "(`%dist pull`, `%dist stacks` and `%dist status` work). "
            if alive
            else "No rank is left. "
        )
        return (
            f"session {self.name!r} is degraded: {faults or self.broken_reason}. {kept}"
            f"{heal}`%dist restart --session {self.name}` starts every rank afresh"
        )

    def _survivors(self, ranks: Sequence[int] | None) -> list[int]:
        """``ranks`` (all by default) for a request a DEGRADED session's surviving ranks
        answer too (push, pull): refused, naming them, where one of them is gone."""
        self._check_usable(degraded_ok=True)
        chosen = self.check_ranks(ranks)
        gone = [r for r in chosen if self.ranks[r].state == RankState.DEAD]
        if gone:
            alive = [r for r in chosen if r not in gone]
            raise SessionError(
                f"{ranks_label(gone)} of session {self.name!r} "
                f"{'is' if len(gone) == 1 else 'are'} gone ({self.degraded_text()})"
                + (f"; ask the others with --ranks {format_ranks(alive)}" if alive else "")
            )
        return chosen

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
        execution_count: int | None = None,
        allow_stdin: bool = False,
    ) -> CellResult:
        """Run ``code`` on ``ranks`` (all by default) and wait for every one of them;
        ``execution_count`` is the notebook's for the cell; with ``allow_stdin`` the ranks
        may ask for input (`InputAsked`, answered by `answer_input`)."""
        if not self._heals_before_cell():
            self._check_usable()
        chosen = self.check_ranks(ranks)
        try:
            async with self.turn("cell", chosen, sink) as errors:
                if self._heals_before_cell():
                    await self._heal_before_cell(sink)
                self._check_usable()  # it may have broken while the cell waited
                self._hand_over_late_output(sink)
                result = await self._run_cell(
                    code,
                    chosen,
                    sink,
                    timeout,
                    execution_count=execution_count,
                    allow_stdin=allow_stdin,
                )
                if result.stuck or result.freed:  # still in the turn: no cell is sent
                    result = dataclasses.replace(
                        result, note=await self._replace_stuck(result, sink)
                    )
                else:
                    errors.update({f.rank: f.headline() for f in result.failures})
        except TurnWithdrawn:
            result = CellResult(tuple(chosen), (), {}, withdrawn=True)
        if sink is not None:
            sink.put(CellFinished(result))
        return result

    def _heals_before_cell(self) -> bool:
        """A DEGRADED session whose faults the next cell heals without being asked."""
        return self.state == SessionState.DEGRADED and self.recovery.heals_itself()

    async def _heal_before_cell(self, sink: queue.SimpleQueue[CellEvent] | None) -> None:
        """Replace the ranks that died (or could not be stopped) before the cell runs, and
        say so once in it; a heal that fails fails the cell, with the way on."""
        faults = "; ".join(f.sentence() for f in self.recovery.faults.values())
        if sink is not None:
            sink.put(Notice(f"{faults}: replacing it", transient=True, line="status"))
        try:
            text = await self.heal()
        finally:
            if sink is not None:
                sink.put(Notice("", transient=True, line="status"))
        if sink is not None:
            sink.put(Notice(text))

    def take_late_output(self, rank: int, text: str) -> None:
        """A thread started by one of this process's ended cells printed ``text``: keep
        it for the next cell (at most `LATE_OUTPUT_CHARS` a rank, the newest)."""
        kept = self.late_output.get(rank, "") + text
        self.late_output[rank] = kept[-LATE_OUTPUT_CHARS:]

    def _hand_over_late_output(self, sink: queue.SimpleQueue[CellEvent] | None) -> None:
        """Before a cell: what others did to the session since this process's last cell,
        and what threads of its earlier cells printed meanwhile."""
        late, self.late_output = self.late_output, {}
        news, self.news = self.news, []
        if sink is None:
            return
        for text in news:
            sink.put(Notice(text))
        for rank, text in sorted(late.items()):
            sink.put(StreamOut(rank, "stdout", f"(printed after its cell ended)\n{text}"))

    @contextlib.asynccontextmanager
    async def turn(
        self, kind: TurnKind, ranks: Sequence[int], sink: queue.SimpleQueue[CellEvent] | None
    ) -> AsyncIterator[dict[int, str]]:
        """Wait for this process's turn on the ranks (others' cells run first), telling
        ``sink`` what it waits for; yield a dict the caller fills with each failed rank's
        error line; end the turn. Raises `TurnWithdrawn` if `stop_cell` withdrew it."""
        turn = Turn(self.turns.new_id(), self.sender, kind, tuple(ranks))
        self._waiting = turn.turn_id
        told = WaitingLine(sink)
        try:
            await self.turns.take(
                turn, lambda text: told.say(text, self.state == SessionState.RESTARTING)
            )
        except SessionError:
            raise TurnWithdrawn(turn.turn_id) from None
        finally:
            self._waiting = None
            told.clear()
        errors: dict[int, str] = {}
        try:
            yield errors
        finally:
            self.turns.end(turn.turn_id, errors, ranks)

    async def _replace_stuck(
        self, result: CellResult, sink: queue.SimpleQueue[CellEvent] | None
    ) -> str:
        """Replace the ranks given up on while still running (blocked in C code, where no
        interrupt reaches: they would hold the process group, and their GPU, for good),
        and only them: every other rank keeps its variables. Done here, in the control
        plane and still in the turn, so every way of stopping a cell gets it, whoever
        owns the session."""
        stuck = ranks_label(list(result.stuck))
        freed = ""
        if result.freed:
            was, them = ("was", "it") if len(result.freed) == 1 else ("were", "them")
            freed = (
                f"{ranks_label(list(result.freed))} {was} blocked in a collective the other "
                f"ranks were not in, where no interrupt reaches; shutting the process group's "
                f"connections freed {them}"
            )
        if sink is not None:
            doing = f"replacing {stuck}" if result.stuck else "making a new process group"
            sink.put(Notice(doing, transient=True, line="status"))
        try:
            text = await self.heal(result.stuck, new_group=freed)
            if not result.stuck:
                return text
        except Exception as err:
            log.warning("session %s: replacing stuck ranks failed: %s", self.name, err)
            if not result.stuck:
                return (
                    f"{freed}, and making a new process group failed ({type(err).__name__}: "
                    f"{str(err)[:300]}); `%dist restart --session {self.name}` starts every "
                    "rank afresh (every rank's variables are lost)"
                )
            return (
                f"{stuck} could not be stopped ({STUCK_WHY}), and replacing "
                f"{'it' if len(result.stuck) == 1 else 'them'} failed ({type(err).__name__}: "
                f"{str(err)[:300]}); run `%dist heal --session {self.name}`, or `%dist "
                f"restart --session {self.name}` (every rank's variables are lost)"
            )
        finally:
            if sink is not None:
                sink.put(Notice("", transient=True, line="status"))
        return f"{stuck} could not be stopped ({STUCK_WHY}). {text}"

    async def heal(
        self, ranks: Sequence[int] = (), progress: Any = None, new_group: str = ""
    ) -> str:
        """Replace the ranks that failed (and ``ranks``) with fresh ones, then regroup
        every rank (``new_group``: why a new group is needed even when no rank is
        replaced); return what was done, in words. Whoever owns the session does it."""
        raise SessionError(f"session {self.name!r}: its ranks cannot be replaced from here")

    async def restart_ranks(self) -> None:
        """Replace every rank by a fresh one (whoever owns the session does it)."""
        raise SessionError(f"session {self.name!r}: its ranks cannot be restarted from here")

    async def stop_cell(self, ranks: Sequence[int] | None = None) -> None:
        """The user stopped this process's cell: withdraw it if it still waits for its
        turn (the running one, someone else's, goes on), else interrupt it."""
        waiting = self._waiting
        if waiting is not None:
            await self.withdraw(waiting)
            return
        await self.interrupt(ranks)

    async def withdraw(self, turn_id: str) -> None:
        self.turns.end(turn_id)

    async def _run_cell(
        self,
        code: str,
        ranks: list[int],
        sink: queue.SimpleQueue[CellEvent] | None,
        timeout: float | None,
        silent: bool = False,
        execution_count: int | None = None,
        allow_stdin: bool = False,
    ) -> CellResult:
        records = [(r, self.ranks[r]) for r in ranks]
        run = CellTracker({r: (rec.host, rec.place.local_rank) for r, rec in records}, sink)
        run.others_ended = self._others_code_ended
        self._current = run
        sent: dict[int, str] = {}
        signer: RankClient | None = None
        prepared: Encoded | None = None
        fan_out = FanOut()
        running, dead = RankState.BUSY, RankState.DEAD
        try:
            began = time.time()
            for r, rec in records:
                client = rec.client
                if rec.state == dead or client is None:
                    run.rank_died(r, rec.exit_code, rec.pid, "", rec.lost or None)
                    continue
                rec.state = running
                rec.busy_since = began
                if signer is None or not client.shares_key(signer):
                    signer = client
                    prepared = signer.prepare_execute(
                        code, silent, execution_count, len(ranks), allow_stdin
                    )
                sent[r] = client.execute(code, run.handler(r), prepared=prepared, fan_out=fan_out)
            fan_out.send()
            self._changed()
            try:
                await asyncio.wait_for(self._watch(run, sink), timeout)
            except asyncio.TimeoutError:
                run.timed_out = True
                run.timeout_s = timeout
                log.info("session %s: cell timed out after %s s", self.name, timeout)
                busy = run.busy_ranks
                dumps = await self._dumps(busy)
                if sink is not None and dumps:
                    where = stacks.one_line(dumps)
                    sink.put(Notice(f"timed out after {timeout:g} s; interrupting: {where}", True))
                await self._interrupt_ranks(busy)
                await self._settle(
                    run,
                    sink,
                    kind="timeout",
                    ename="CellTimeout",
                    why=f"still running {timeout} s after the cell started, and did not take "
                    f"an interrupt within {self.interrupt_ack_s:g} s",
                    details={r: _timeout_detail(run, r, dumps) for r in busy},
                )
        finally:
            self._current = None
            for r, msg_id in sent.items():
                rec = self.ranks[r]
                if rec.client:
                    rec.client.forget(msg_id)
                if rec.state == running:
                    rec.state = RankState.IDLE
                rec.busy_since = None
            self._changed()
        result = run.result()
        failed = {f.rank: f.headline() for f in result.failures}
        for r in ranks:
            self.ranks[r].last_error = failed.get(r, "")
        return result

    async def _watch(self, run: CellTracker, sink: queue.SimpleQueue[CellEvent] | None) -> None:
        """Wait for the cell.

        An interrupted rank (someone stopped the cell, or it was wound down) is judged by
        what it says, not by a clock (`_look_at_silent`): one that took the interrupt is
        handling it for as long as it takes; one that did not within `interrupt_ack_s`
        and whose stack is outside Python is stuck, given up on, and replaced after the
        cell (`_replace_stuck`). When a rank raised or died, the others are told at once
        that they get `abort_after_s` to finish; then they are interrupted (usually
        blocked in a collective the failed rank never joins). Else, say once which ranks
        are still busy when the others have been done for `straggler_s`.
        """
        console_line = [""]
        try:
            await self._watch_ticks(run, sink, console_line)
        finally:
            if console_line[0] and sink is not None:  # the console's line goes with the cell
                sink.put(Notice("", transient=True, line=CONSOLE_LINE))

    async def _watch_ticks(
        self, run: CellTracker, sink: queue.SimpleQueue[CellEvent] | None, console_line: list[str]
    ) -> None:
        """`_watch`'s ticks, until the cell is done."""
        first_done: float | None = None
        said = False
        announced = False
        wound_down = False
        handling_line = [""]
        loop = asyncio.get_running_loop()
        ended = loop.create_task(run.done.wait())  # one wait a cell, not one a tick
        try:
            while True:
                await asyncio.wait((ended,), timeout=WATCH_TICK_S)
                if ended.done():
                    return
                self._say_queued_behind_consoles(run, sink, console_line)
                await self._look_at_silent(run, sink, handling_line)
                busy = run.busy_ranks
                if not busy or run.stop_asked_at is not None:
                    continue  # every rank was interrupted already: no wind-down of its own
                failed_at = run.first_failure_at
                if failed_at and not announced:
                    announced = True
                    self._announce_wind_down(run, busy, sink)
                if (
                    failed_at
                    and not wound_down
                    and time.monotonic() - failed_at >= self.abort_after_s
                ):
                    wound_down = True
                    await self._wind_down(run, busy, sink)
                    continue
                if failed_at or len(busy) == len(run.progress) or said or sink is None:
                    continue
                if run.asking() or self._paused_in_debugger(busy):
                    # a person answers it, or steps through it: not a straggler
                    first_done = None
                    continue
                first_done = first_done or loop.time()
                if loop.time() - first_done >= self.straggler_s:
                    said = True
                    where = await self._stacks_text(busy, frames=False)
                    sink.put(
                        Notice(
                            f"{ranks_label(busy)} still running {self.straggler_s:.0f} s after "
                            f"the other ranks finished" + (f": {where}" if where else "")
                            + "; the stop button interrupts them (a rank blocked in C code, "
                            "where the interrupt cannot reach it, is replaced; the others keep "
                            "their variables)"
                        )
                    )  # fmt: skip
        finally:
            ended.cancel()

    async def _settle(
        self,
        run: CellTracker,
        sink: queue.SimpleQueue[CellEvent] | None,
        **give_up: Any,
    ) -> None:
        """Wait until the interrupted cell is done: ranks handling the interrupt finish,
        stuck ones are given up on (with ``give_up``'s kind and words)."""
        shown = [""]
        while not run.done.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.done.wait()), WATCH_TICK_S)
            await self._look_at_silent(run, sink, shown, **give_up)

    async def _look_at_silent(
        self,
        run: CellTracker,
        sink: queue.SimpleQueue[CellEvent] | None,
        shown: list[str],
        kind: FailureKind = "stuck",
        ename: str = "Stuck",
        why: str = "",
        details: Mapping[int, str] | None = None,
    ) -> None:
        """Interrupted ranks that did not say, within `interrupt_ack_s`, that Python took
        the interrupt: those whose stack stays at one place outside Python are stuck and
        given up on (`CellTracker.stuck`); those still moving through Python are waited
        for, and said so. Ranks handling an interrupt they took are said too (one line,
        ``shown`` holds it)."""
        self._say_handling(run, sink, shown)
        silent = run.silent_after_interrupt(self.interrupt_ack_s)
        if not silent:
            return
        outside, moving, where = await self._outside_python(silent)
        for rank in silent:
            prog = run.progress[rank]
            prog.checked = prog.interrupted_at
        if outside and not run.done.is_set():
            freed = await self._free(run, outside, where, sink)
            outside = [r for r in outside if r not in freed]
        if outside and not run.done.is_set():
            reason = why or (
                f"did not take the interrupt within {self.interrupt_ack_s:g} s, and its "
                "stack stayed outside Python"
            )
            found = {r: where[r] for r in outside if where.get(r)}
            found.update({r: text for r, text in (details or {}).items() if text})
            run.stuck += tuple(run.give_up(kind, reason, ename=ename, details=found, ranks=outside))
        if moving and sink is not None:
            places = "; ".join(f"rank {r}: {where[r]}" for r in moving if where.get(r))
            sink.put(
                Notice(
                    f"{ranks_label(moving)} did not take the interrupt within "
                    f"{self.interrupt_ack_s:g} s but {'is' if len(moving) == 1 else 'are'} "
                    f"still running Python ({places or 'no stack'}), so "
                    f"{'it is' if len(moving) == 1 else 'they are'} not replaced: a signal "
                    "handler of the cell's own may have taken it; the stop button "
                    "interrupts again"
                )
            )

    async def _free(
        self,
        run: CellTracker,
        ranks: Sequence[int],
        where: Mapping[int, str],
        sink: queue.SimpleQueue[CellEvent] | None,
    ) -> list[int]:
        """Free ``ranks``, blocked outside Python, from a collective of their process group
        (usually one a rank that took the interrupt left: `rank.group_sockets`), and wait
        up to `FREE_WAIT_S` for each to say that Python took the interrupt. Those that do
        are handling it, not stuck; the group is over for every rank, so all join a new
        one after the cell (`CellResult.freed`). Returns them."""
        asked = await self.free_from_collective(ranks)
        if not asked:
            return []
        deadline = time.monotonic() + FREE_WAIT_S
        while time.monotonic() < deadline and not run.done.is_set():
            progress = [run.progress[r] for r in asked]
            if all(p.finished or p.handling_interrupt for p in progress):
                break
            await asyncio.sleep(0.05)
        freed = [r for r in asked if run.progress[r].finished or run.progress[r].handling_interrupt]
        for r in freed:  # where it was blocked says more than where the interrupt landed
            run.progress[r].blocked_at = where.get(r, "")
        if freed:
            run.freed = tuple(sorted(set(run.freed) | set(freed)))
            places = "; ".join(f"rank {r}: {where[r]}" for r in freed if where.get(r))
            log.info("session %s: freed %s from a collective (%s)", self.name, freed, places)
        return freed

    def _say_handling(
        self, run: CellTracker, sink: queue.SimpleQueue[CellEvent] | None, shown: list[str]
    ) -> None:
        """One line while ranks run what an interrupt they took leads to."""
        if sink is None:
            return
        handling = [r for r in run.handling() if not run.progress[r].finished]
        text = ""
        if handling:
            prog = run.progress[handling[0]]
            since = time.monotonic() - (prog.acked_at or time.monotonic())
            where = f" at {prog.ack_where}" if prog.ack_where else ""
            text = (
                f"{ranks_label(handling)} took the interrupt{where} and "
                f"{'is' if len(handling) == 1 else 'are'} running what it leads to (the "
                f"traceback, the cell's except/finally) for {since:.0f} s; waiting"
            )
        if text != shown[0]:
            shown[0] = text
            sink.put(Notice(text, transient=True, line="interrupt"))

    async def _outside_python(
        self, ranks: Sequence[int]
    ) -> tuple[list[int], list[int], dict[int, str]]:
        """Which of ``ranks`` are blocked outside Python (their main thread's innermost
        frame the same in two stack dumps `SAME_PLACE_GAP_S` apart: inside one call),
        which move, and where each was. A rank whose stack cannot be had counts as
        blocked: it did not take the interrupt either."""
        first = await self._dumps(ranks)
        seen = [r for r in ranks if first.get(r)]  # no dump (a frozen process): no second
        await asyncio.sleep(SAME_PLACE_GAP_S)
        second = await self._dumps(seen) if seen else {}
        outside: list[int] = []
        moving: list[int] = []
        where: dict[int, str] = {}
        for rank in ranks:
            before, after = first.get(rank, ""), second.get(rank, "")
            if after:
                where[rank] = stacks.place_of(after).text
            if before and after and not stacks.same_place(before, after):
                moving.append(rank)
            else:
                outside.append(rank)
        return outside, moving, where

    def _say_queued_behind_consoles(
        self, run: CellTracker, sink: queue.SimpleQueue[CellEvent] | None, shown: list[str]
    ) -> None:
        """One line, updated each tick, while ranks have not begun the cell because a
        console on them runs code (the cell waits in their queue until that ends), or
        while JupyterLab's debugger holds a rank of the cell paused (`debugger_pause`:
        in the console's code the cell waits behind, or in the cell itself, at a
        breakpoint in a file it calls); taken away once none does. ``shown`` holds what
        the line says now."""
        if sink is None:
            return
        now = time.monotonic()
        waiting: dict[int, float] = {}
        paused: dict[int, float] = {}
        for r, progress in run.progress.items():
            client = self.ranks[r].client
            if progress.finished or client is None:
                continue
            if client.debugger_paused_since is not None:
                paused[r] = now - client.debugger_paused_since
                continue
            since = client.others_code_since
            if since is not None and not progress.began:
                waiting[r] = now - since
        text = ""
        if paused:
            text = paused_words(sorted(paused), max(paused.values()))
        elif waiting:
            ranks = sorted(waiting)
            verb, them = ("is", "it") if len(ranks) == 1 else ("are", "them")
            text = (
                f"{ranks_label(ranks)} {verb} queued: running code from a console on {them} "
                f"(for {max(waiting.values()):.0f} s); this cell starts there when that "
                "ends (Kernel > Interrupt in that console stops it)"
            )
        if text != shown[0]:
            shown[0] = text
            sink.put(Notice(text, transient=True, line=CONSOLE_LINE))

    def _paused_in_debugger(self, ranks: list[int]) -> bool:
        """Whether any of ``ranks`` is paused in JupyterLab's debugger (a console's)."""
        for r in ranks:
            client = self.ranks[r].client
            if client is not None and client.debugger_paused_since is not None:
                return True
        return False

    def _others_code_ended(self, rank: int) -> float:
        """When code another client ran on ``rank`` (a console's) last ended."""
        client = self.ranks[rank].client
        return client.others_code_ended if client is not None else 0.0

    @staticmethod
    def _cause(run: CellTracker) -> tuple[str, str]:
        """Which rank failed first, in words (``rank 1 failed``), and its error line."""
        root = run.root_failure()
        assert root is not None
        verb = {"died": "died", "interrupted": "was interrupted"}.get(root.kind, "failed")
        why = "" if root.kind == "interrupted" else f" ({root.headline()})"
        return f"rank {root.rank} {verb}", why

    def _announce_wind_down(
        self, run: CellTracker, busy: list[int], sink: queue.SimpleQueue[CellEvent] | None
    ) -> None:
        """Say at once what waits for the ranks left running after another failed."""
        if sink is None:
            return
        cause, why = self._cause(run)
        them, they = ("it", "it finishes") if len(busy) == 1 else ("them", "they finish")
        sink.put(
            Notice(
                f"{cause}{why}; {ranks_label(busy)} still running: interrupting {them} in "
                f"{self.abort_after_s:g} s unless {they}",
                transient=True,
                line="wind-down",
            )
        )

    async def _wind_down(
        self, run: CellTracker, busy: list[int], sink: queue.SimpleQueue[CellEvent] | None
    ) -> None:
        """Interrupt the ranks still running after another failed; `_look_at_silent`
        then tells those that take it from those that are stuck."""
        cause, why = self._cause(run)
        if sink is not None:
            sink.put(
                Notice(
                    f"{cause}{why}; interrupting {ranks_label(busy)}, still "
                    f"running {self.abort_after_s:g} s later",
                    transient=True,
                    line="wind-down",
                )
            )
        await self._interrupt_ranks(busy)

    async def stacks(self, ranks: Sequence[int] | None = None) -> dict[int, str]:
        """Each rank's stack dump (faulthandler text of every thread)."""
        raise SessionError(f"session {self.name!r}: stack dumps are not available here")

    async def free_from_collective(self, ranks: Sequence[int]) -> list[int]:
        """Ask ``ranks`` to free themselves from a collective of their process group
        (`rank.group_sockets`); the ranks asked (none where the ranks' nodes cannot be
        reached from here)."""
        return []

    async def _dumps(self, ranks: Sequence[int]) -> dict[int, str]:
        """`stacks`, or none when they cannot be had."""
        try:
            return await asyncio.wait_for(self.stacks(ranks), STACKS_TIMEOUT_S)
        except Exception as err:
            log.info("session %s: no stack dumps: %s", self.name, err)
            return {}

    async def _stacks_text(self, ranks: Sequence[int], frames: bool = True) -> str:
        dumps = await self._dumps(ranks)
        if not dumps:
            return ""
        return stacks.describe(dumps) if frames else stacks.one_line(dumps)

    def raise_for(self, result: CellResult) -> None:
        """Turn a failed `CellResult` into the exception the notebook cell raises; its
        note says what became of the session (`CellResult.note`)."""
        if not result.failures:
            return
        note = result.note
        if result.stopped_by:  # someone else interrupted or restarted the session
            failed = {f.rank for f in result.failures}
            raise CellInterrupted(
                self.name,
                self.spec.world_size,
                result.failures,
                "\n".join(t for t in (result.stopped_by, note) if t),
                finished=[r for r in result.ranks if r not in failed],
            )
        raised = [f for f in result.failures if f.kind == "error" and f.traceback]
        if raised:  # what `%dist debug` opens: the root cause's traceback, kept by its rank
            self.debuggable_rank = min(raised, key=lambda f: f.order).rank
        if result.timed_out:
            raise CellTimeout(
                self.name, self.spec.world_size, result.failures, note, result.timeout_s
            )
        raise RanksFailed(self.name, self.spec.world_size, result.failures, note)

    def answer_input(self, rank: int, value: str) -> None:
        """Answer ``rank``'s open input request (a prompt of the running cell)."""
        run = self._current
        if run is not None and rank in run.progress:
            run.progress[rank].asking = False
        rec = self.ranks.get(rank)
        if rec is not None and rec.client is not None and rec.state != RankState.DEAD:
            rec.client.answer_input(value)

    async def interrupt(self, ranks: Sequence[int] | None = None) -> None:
        """Interrupt ``ranks`` (all by default): a KeyboardInterrupt in their running code.
        A cell of this process running there then waits for each rank to take it; one
        that does not, and is blocked outside Python, is replaced (`_watch`)."""
        chosen = self.check_ranks(ranks)
        run = self._current
        if run is not None and set(run.progress) <= set(chosen):
            run.stop_asked()
        await self._interrupt_ranks(chosen)

    async def _interrupt_ranks(self, ranks: Sequence[int]) -> None:
        run = self._current
        for r in ranks:
            rec = self.ranks[r]
            if rec.client and rec.state != RankState.DEAD:
                rec.client.interrupt()
        if run is not None:
            run.interrupt_sent(list(ranks))

    # -- objects ------------------------------------------------------------------------
    async def push(
        self,
        payload: pickling.Payload,
        ranks: Sequence[int] | None = None,
        timeout: float = OBJECTS_TIMEOUT_S,
        sink: queue.SimpleQueue[CellEvent] | None = None,
    ) -> None:
        """Send pickled ``{name: value}`` to each rank's namespace; ``sink`` hears what it
        waits for (another notebook's cell)."""
        chosen = self._survivors(ranks)
        async with self.turn("push", chosen, sink):
            replies = await self._push(payload, chosen, timeout)
        errors = [(r, rep) for r, rep in zip(chosen, replies, strict=True) if _failed(rep)]
        if errors:
            r, rep = errors[0]
            raise PushError(f"push failed on {len(errors)} rank(s); rank {r}: {_why(rep)}")

    async def _push(
        self, payload: pickling.Payload, chosen: list[int], timeout: float
    ) -> list[Any]:
        """Each rank's answer to a push of ``payload``. To the ranks of this machine, large
        buffers go through a shared-memory file (`common.shared_push`), and only to a rank
        that cannot read it through the sockets."""
        data = {"op": "push", **payload.signed_fields()}
        path = None
        if self.spec.launcher == "local" and shared_push() and len(payload.frames) > 1:
            buffers, name = payload.frames[1:], uuid.uuid4().hex
            loop = asyncio.get_running_loop()  # a write of many MB must not hold the loop
            path = await loop.run_in_executor(None, shared_push_file.write, buffers, name)
        if path is None:
            return await self._objects("push", chosen, data, payload.frames, timeout)
        self.shared_pushes += 1
        try:
            replies = await self._objects(
                "push", chosen, {**data, "shared": str(path)}, payload.frames[:1], timeout
            )
        finally:
            shared_push_file.remove(path)
        unread = [i for i, rep in enumerate(replies) if _unreadable(rep)]
        if unread:
            again = await self._objects(
                "push", [chosen[i] for i in unread], data, payload.frames, timeout
            )
            for i, rep in zip(unread, again, strict=True):
                replies[i] = rep
        return replies

    async def pull(
        self,
        name: str,
        ranks: Sequence[int] | None = None,
        timeout: float = OBJECTS_TIMEOUT_S,
        sink: queue.SimpleQueue[CellEvent] | None = None,
    ) -> list[Any]:
        """The value of ``name`` on each rank, in rank order; ``sink`` hears what it waits
        for (another notebook's cell)."""
        chosen = self._survivors(ranks)
        async with self.turn("pull", chosen, sink):
            data = {"op": "pull", "name": name}
            replies = await self._objects(f"pull {name!r}", chosen, data, (), timeout, PullError)
        values = []
        for r, rep in zip(chosen, replies, strict=True):
            if _failed(rep):
                raise PullError(f"pull {name!r} failed on rank {r}: {_why(rep)}")
            assert isinstance(rep, tuple)
            data, buffers = rep
            try:
                values.append(pickling.load(buffers, data["digest"], data["sizes"]))
            except PushError as err:  # the payload's checks
                raise PullError(f"pull {name!r} failed on rank {r}: {err}") from None
        return values

    async def _objects(
        self,
        what: str,
        chosen: list[int],
        data: dict[str, Any],
        buffers: Sequence[pickling.Frame],
        timeout: float,
        error: type[PushError] = PushError,
    ) -> list[Any]:
        """Each rank's answer to the objects request ``data`` (or its exception), in
        ``chosen``'s order; ``error`` naming the ranks that did not answer within
        ``timeout``. The request is one message for every rank, sent once to each node's
        relay (a push's payload crosses to a node once)."""
        request_id = uuid.uuid4().hex
        fan_out = FanOut()
        tasks: list[asyncio.Future[Any]] = []
        prepared: Encoded | None = None
        last: tuple[RankClient, str] | None = None  # whose request ``prepared`` is
        for r in chosen:
            rec = self.ranks[r]
            if rec.client is None:
                failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                failed.set_exception(SessionError(f"rank {r} has no kernel connection"))
                tasks.append(failed)
                continue
            comm = rec.client.objects_comm(self._objects_comm)
            if last is None or last[1] != comm or not rec.client.shares_key(last[0]):
                prepared = None
            fut, prepared = rec.client.objects_request(data, request_id, buffers, prepared, fan_out)
            last = (rec.client, comm)
            tasks.append(fut)
        fan_out.send()
        try:
            _done, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else ((), ())
        finally:
            late = [r for r, task in zip(chosen, tasks, strict=True) if not task.done()]
            for task in tasks:
                task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            raise error(
                f"{what} in session {self.name!r}: {ranks_label(late)} of "
                f"{ranks_label(chosen)} did not answer within {timeout:g} s (busy running "
                "a cell? `%dist interrupt` stops it)"
            )
        return [task.exception() or task.result() for task in tasks]

    def _client(self, rank: int) -> RankClient:
        client = self.ranks[rank].client
        if client is None:
            raise SessionError(f"rank {rank} has no kernel connection")
        return client

    async def close_clients(self) -> None:
        """Close this process's kernel connections (the rank processes live on)."""
        for rec in self.ranks.values():
            if rec.client:
                await rec.client.close()
                rec.client = None
        if self._iopub is not None:
            self._iopub.close()
            self._iopub = None
        for shell in self._shells.values():
            shell.close()
        self._shells.clear()

    def new_client(self, rec: RankRecord) -> RankClient:
        """A kernel client for ``rec``'s rank, its IOPub read with every other rank's
        through the group's one subscriber (`IopubFanIn`)."""
        assert rec.connection is not None
        scheme = rec.connection.get("signature_scheme") or "hmac-sha256"
        if self._iopub is None:
            self._iopub = IopubFanIn(self._context, self.key, scheme)
        connection = rec.connection
        if not node_relay():
            connection = cast(KernelConnection, dict(connection))
            connection.pop("relay_iopub", None)
            connection.pop("relay_shell", None)
        shell = None
        path = connection.get("relay_shell")
        if path:
            shell = self._shells.get(path)
            if shell is None or shell.closed:
                shell = self._shells[path] = NodeShell(
                    self._context, self.key, scheme, f"ipc://{path}"
                )
                shell.on_lost = self._relay_lost
        client = RankClient(rec.rank, connection, self.key, self._context, self._iopub, shell)
        client.on_late = self.take_late_output
        return client


class TurnWithdrawn(DistError):
    """A request was withdrawn before its turn came (its sender stopped it)."""


class WaitingLine:
    """The one line that says what a request waits for, updated while it waits and
    taken away when its turn comes."""

    def __init__(self, sink: queue.SimpleQueue[CellEvent] | None) -> None:
        self.sink = sink
        self.shown = False

    def say(self, text: str, restarting: bool = False) -> None:
        if self.sink is None:
            return
        if restarting:
            text = "waiting for the session's ranks, which are being restarted"
        self.shown = True
        self.sink.put(Notice(text, transient=True, line=WAITING_LINE))

    def clear(self) -> None:
        if self.sink is not None and self.shown:
            self.sink.put(Notice("", transient=True, line=WAITING_LINE))


def _timeout_detail(run: CellTracker, rank: int, dumps: Mapping[int, str]) -> str:
    """What a timed-out rank had done of the cell, and where its main thread was."""
    parts = [run.stage(rank)]
    if dumps.get(rank):
        parts.append(f"it was {stacks.place_of(dumps[rank]).text}")
    return "; ".join(p for p in parts if p)


def _failed(reply: object) -> bool:
    if isinstance(reply, BaseException):
        return True
    assert isinstance(reply, tuple)
    return bool(reply[0].get("op") == "error")


def _unreadable(reply: object) -> bool:
    """A rank that could not read a shared-memory push file (and takes it by socket)."""
    return isinstance(reply, tuple) and reply[0].get("ename") == SharedPushUnreadable.__name__


def _why(reply: object) -> str:
    if isinstance(reply, BaseException):
        return f"{type(reply).__name__}: {reply}"
    assert isinstance(reply, tuple)
    data = reply[0]
    return f"{data.get('ename')}: {data.get('evalue')}"
