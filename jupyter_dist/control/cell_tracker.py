"""One cell's execution across ranks: which ranks are done, and how each ended.

A rank is done with a cell when its reply on IOPub arrived (`EXECUTE_REPLY_MSG_TYPE`,
which the notebook side's cells ask for: it comes behind the cell's output), or, for a
request answered the usual way, when its ``execute_reply`` and its IOPub ``idle`` status
have both arrived (so no output can still be in flight); or when its process died.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.common import stacks
from jupyter_dist.common.agent_protocol import describe_returncode
from jupyter_dist.common.events import (
    CellEvent,
    CellResult,
    ClearOut,
    InputAsked,
    MetricsOut,
    RankFinished,
    RankOutcome,
    RankStarted,
    RichOut,
    StreamOut,
    WidgetComm,
)
from jupyter_dist.common.wire_names import (
    EXECUTE_REPLY_MSG_TYPE,
    INPUT_MSG_TYPE,
    INTERRUPT_ACK_MSG_TYPE,
    METRICS_MSG_TYPE,
)
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.rank_client import PacedHandler
from jupyter_dist.errors import STOPPED_KINDS, FailureKind, RankFailure

#: failures after which the other ranks get `abort_after_s` to finish before they are
#: interrupted (a user's interrupt starts the same wind-down)
WIND_DOWN_KINDS: tuple[FailureKind, ...] = ("error", "died", "interrupted")
RICH_TYPES = ("display_data", "execute_result", "update_display_data")
COMM_TYPES = ("comm_open", "comm_msg", "comm_close")
#: tracebacks kept per rank and cell from IOPub (the first decides; the rest are output)
MAX_SHOWN_ERRORS = 16


@dataclass(slots=True)
class RankProgress:
    rank: int
    host: str
    local_rank: int
    started: float
    reply: dict[str, Any] | None = None
    began: bool = False  # its kernel said it was busy with the cell
    idle: bool = False
    finished: bool = False
    failure: RankFailure | None = None
    elapsed: float = 0.0
    #: tracebacks the rank showed on IOPub (``error`` messages): a cell that raised, and
    #: also one that only showed it (``%run`` of a script that crashed replies "ok")
    shown_errors: list[dict[str, Any]] = field(default_factory=list)
    #: when it was last sent an interrupt, and when it last said that Python took one
    #: (`INTERRUPT_ACK_MSG_TYPE`): it is handling the interrupt while ``acked_at`` is later
    interrupted_at: float | None = None
    acked_at: float | None = None
    ack_where: str = ""  # the line the interrupt landed on
    #: where it was blocked outside Python before it was freed from a collective (its
    #: place when stopped, rather than where the freed interrupt was raised)
    blocked_at: str = ""
    #: the interrupt whose silence was looked into already (its ``interrupted_at``)
    checked: float | None = None
    #: it waits for input (``input()``, a debugger's prompt): busy, not slow or hung
    asking: bool = False
    #: of its next input request: the stdin request's content, and whether the IOPub
    #: message behind its output came (the prompt opens once both did)
    input_request: dict[str, Any] | None = None
    input_said: bool = False

    @property
    def handling_interrupt(self) -> bool:
        """It took the last interrupt and runs what that leads to (a traceback, the
        cell's ``except``/``finally``)."""
        return (
            self.interrupted_at is not None
            and self.acked_at is not None
            and self.acked_at >= self.interrupted_at
        )


class CellTracker:
    """Collects one cell's messages from every rank it runs on.

    Lives on the control-plane loop; events go to ``sink`` (read by the notebook thread).
    """

    def __init__(
        self,
        ranks: dict[int, tuple[str, int]],
        sink: queue.SimpleQueue[CellEvent] | None,
    ) -> None:
        now = time.monotonic()
        self.progress = {
            rank: RankProgress(rank, host, local_rank, now)
            for rank, (host, local_rank) in ranks.items()
        }
        self.sink = sink
        self.done = asyncio.Event()
        #: when code another client ran on a rank last ended (`RankClient.others_code_ended`)
        self.others_ended: Callable[[int], float] | None = None
        self.timed_out = False
        self.timeout_s: float | None = None  # the --timeout it ran past
        self.interrupted = False
        #: when someone interrupted the cell (the stop button, `%dist interrupt`, the
        #: sidebar): each rank then says when it took the interrupt
        self.stop_asked_at: float | None = None
        #: someone else interrupted or restarted the session during the cell (in words)
        self.stopped_by = ""
        #: when the first rank failed (raised or died): the others then wind down
        self.first_failure_at: float | None = None
        self.stuck: tuple[int, ...] = ()
        self.freed: tuple[int, ...] = ()
        self._unfinished = len(self.progress)  # counted, not searched: O(1) a rank
        if not self.progress:
            self.done.set()

    def _emit(self, event: CellEvent) -> None:
        if self.sink is not None:
            self.sink.put(event)

    def handler(self, rank: int) -> PacedHandler:
        """Where ``rank``'s messages for this cell go; its reader waits while the notebook
        thread has too much output still to draw."""
        return _RankMessages(self, rank)

    def asking(self) -> list[int]:
        """Running ranks that wait for input."""
        return sorted(r for r, p in self.progress.items() if p.asking and not p.finished)

    @property
    def busy_ranks(self) -> list[int]:
        return sorted(r for r, p in self.progress.items() if not p.finished)

    def on_message(self, rank: int, channel: str, msg: dict[str, Any]) -> None:
        prog = self.progress.get(rank)
        if prog is None or prog.finished:
            return
        kind = msg["msg_type"]
        content = msg["content"]
        if channel == "stdin":
            if kind == "input_request":
                prog.input_request = content
                self._input_asked(prog)
            return
        if channel == "shell":
            if kind == "execute_reply":
                prog.reply = content
                self._maybe_finish(prog)
            return
        if channel != "iopub":
            return
        if kind == EXECUTE_REPLY_MSG_TYPE:  # behind the cell's output: its end too
            prog.reply = content
            prog.idle = True
            self._maybe_finish(prog)
        elif kind == "status":
            state = content.get("execution_state")
            if state == "idle":
                prog.idle = True
                self._maybe_finish(prog)
            elif state == "busy":
                prog.began = True
                self._emit(RankStarted(rank))
        elif kind == METRICS_MSG_TYPE:
            points = tuple((str(n), float(x), float(y)) for n, x, y in content.get("points", ()))
            self._emit(MetricsOut(rank, points, dict(content.get("process") or {})))
        elif kind in COMM_TYPES:
            is_widget = content.get("target_name", "jupyter.widget") == "jupyter.widget"
            if is_widget or kind != "comm_open":
                buffers = tuple(bytes(b) for b in msg.get("buffers") or ())
                metadata = dict(msg.get("metadata") or {})
                self._emit(WidgetComm(rank, kind, content, buffers, metadata))
        elif kind == "stream":
            self._emit(StreamOut(rank, content.get("name", "stdout"), content.get("text", "")))
        elif kind == "error":
            if len(prog.shown_errors) < MAX_SHOWN_ERRORS:
                prog.shown_errors.append(content)
        elif kind in RICH_TYPES:
            self._emit(
                RichOut(
                    rank,
                    kind,
                    content.get("data", {}),
                    content.get("metadata", {}),
                    content.get("transient", {}) or {},
                )
            )
        elif kind == "clear_output":
            self._emit(ClearOut(rank, bool(content.get("wait"))))
        elif kind == INPUT_MSG_TYPE:
            prog.input_said = True
            self._input_asked(prog)
        elif kind == INTERRUPT_ACK_MSG_TYPE:
            prog.acked_at = time.monotonic()
            prog.ack_where = str(content.get("where") or "")

    def _input_asked(self, prog: RankProgress) -> None:
        """The rank asks for input once its request came on stdin and its IOPub message
        behind the output it printed before (`INPUT_MSG_TYPE`), in either order."""
        request = prog.input_request
        if request is None or not prog.input_said:
            return
        prog.input_request, prog.input_said, prog.asking = None, False, True
        prompt, password = str(request.get("prompt", "")), bool(request.get("password"))
        self._emit(InputAsked(prog.rank, prompt, password))

    def take_replies(self, replies: list[tuple[int, dict[str, Any]]]) -> None:
        """Ranks' plain replies on IOPub (`ReplySink`: a node relay's folded replies),
        each as `on_message` takes its reply's message, at once."""
        now = time.monotonic()
        progress = self.progress
        for rank, content in replies:
            prog = progress.get(rank)
            if prog is None or prog.finished:
                continue
            prog.reply, prog.idle = content, True
            if prog.shown_errors or content.get("status") != "ok":
                self._maybe_finish(prog)
                continue
            prog.finished = True
            self._unfinished -= 1
            prog.elapsed = self._ran_for(prog, now)
            self._emit(RankFinished(rank, "ok", prog.elapsed))
        if self._unfinished == 0:
            self.done.set()

    def _maybe_finish(self, prog: RankProgress) -> None:
        if prog.reply is None or not prog.idle:
            return
        reply = prog.reply
        status = reply.get("status", "error")
        failure = None
        if status in ("ok", "error") and prog.shown_errors:
            # the cell went on after showing a traceback (IPython's %run does, for a script
            # that raised): the rank failed all the same, and the first traceback it showed
            # is the cause (a later error, a NameError of what the script never defined,
            # is its consequence)
            reply = {**prog.shown_errors[0], "status": "error"}
            status = "error"
        if status == "error":
            ename = reply.get("ename", "Error")
            # a debugger's q (or an interrupt that ended its session) stops the cell there
            stopped = ename in ("KeyboardInterrupt", "BdbQuit")
            kind: FailureKind = "interrupted" if stopped else "error"
            if kind == "interrupted" and self.timed_out:
                kind = "timeout"
            evalue = reply.get("evalue", "")
            # pdb's q raises BdbQuit with no words; the stop button's says so itself
            place = (evalue or "in the debugger, which was quit (q)") if ename == "BdbQuit" else ""
            failure = self._failure(
                prog, kind, ename, evalue, tuple(reply.get("traceback", [])), place=place
            )
        elif status == "aborted":
            failure = self._failure(
                prog, "error", "Aborted", "the rank skipped this cell after an earlier error"
            )
        self._finish(prog, status if failure is None else failure.kind, failure)

    def _failure(
        self,
        prog: RankProgress,
        kind: FailureKind,
        ename: str,
        evalue: str,
        traceback: tuple[str, ...] = (),
        exit_code: int | None = None,
        place: str = "",
    ) -> RankFailure:
        if not place and kind in STOPPED_KINDS:
            place = prog.blocked_at or stacks.place_of_traceback(traceback)
        return RankFailure(
            rank=prog.rank,
            host=prog.host,
            local_rank=prog.local_rank,
            kind=kind,
            ename=ename,
            evalue=evalue,
            traceback=traceback,
            exit_code=exit_code,
            order=time.monotonic(),
            place=place,
        )

    def _ran_for(self, prog: RankProgress, now: float) -> float:
        """Seconds the cell ran on ``prog``'s rank by ``now``: from when it was sent, or
        from when code another client ran there (a console's) ended, if that was later:
        the rank runs one request at a time, so the cell waited in its queue until then."""
        began = prog.started
        if self.others_ended is not None:
            began = max(began, self.others_ended(prog.rank))
        return now - began

    def _finish(self, prog: RankProgress, status: RankOutcome, failure: RankFailure | None) -> None:
        prog.finished = True
        self._unfinished -= 1
        prog.failure = failure
        prog.elapsed = self._ran_for(prog, time.monotonic())
        if failure is not None and failure.kind in WIND_DOWN_KINDS:
            self.first_failure_at = self.first_failure_at or time.monotonic()
        self._emit(RankFinished(prog.rank, status, prog.elapsed, failure))
        if self._unfinished == 0:
            self.done.set()

    def stop_asked(self) -> None:
        """Someone interrupted the cell; the first time counts."""
        self.interrupted = True
        self.stop_asked_at = self.stop_asked_at or time.monotonic()

    def interrupt_sent(self, ranks: list[int]) -> None:
        """``ranks`` were sent an interrupt now."""
        now = time.monotonic()
        for rank in ranks:
            prog = self.progress.get(rank)
            if prog is not None and not prog.finished:
                prog.interrupted_at = now

    def silent_after_interrupt(self, bound_s: float) -> list[int]:
        """Running ranks that were interrupted at least ``bound_s`` ago, have not said
        that Python took it, and were not looked into for that interrupt yet."""
        now = time.monotonic()
        return [
            p.rank
            for p in self.progress.values()
            if not p.finished
            and p.interrupted_at is not None
            and now - p.interrupted_at >= bound_s
            and not p.handling_interrupt
            and p.checked != p.interrupted_at
        ]

    def handling(self) -> list[int]:
        """Running ranks busy with an interrupt they took."""
        return sorted(
            p.rank for p in self.progress.values() if not p.finished and p.handling_interrupt
        )

    def rank_died(
        self,
        rank: int,
        returncode: int | None,
        pid: int | None,
        log_tail: str,
        lost: str | None = None,
    ) -> None:
        """``rank`` died with ``returncode``, or, with ``lost`` saying why, is out of reach
        (its node unreachable, its agent gone): ``NodeLost``."""
        prog = self.progress.get(rank)
        if prog is None:
            return
        given_up = prog.failure is not None and prog.failure.ename == "AnswerLost"
        if prog.finished and not given_up:
            return
        if lost is not None:
            failure = self._failure(prog, "died", "NodeLost", lost)
        else:
            how = describe_returncode(returncode) if returncode is not None else "is gone"
            lines = tuple(f"    {line}" for line in crash_report(log_tail))
            traceback = ("  last output of the rank process:", *lines) if lines else ()
            failure = self._failure(
                prog,
                "died",
                "RankDied",
                f"rank process (pid {pid}) {how}",
                traceback,
                exit_code=returncode,
            )
        if not prog.finished:
            self._finish(prog, "died", failure)
            return
        # given up on when its relay stopped, it has died since (its node lost, say): the
        # death is the cause, and the ranks still running wind down as after any death
        prog.failure = failure
        self.first_failure_at = self.first_failure_at or time.monotonic()

    def answers_lost(self, ranks: list[int], why: str) -> list[int]:
        """The way back from ``ranks`` broke (their node's relay stopped, and what it
        held is gone): a rank whose reply came ends as it says; one whose reply did not
        is given up on, as ``AnswerLost`` (it may still be running the cell). Returns the
        ranks given up on."""
        lost = []
        for rank in ranks:
            prog = self.progress.get(rank)
            if prog is None or prog.finished:
                continue
            if prog.reply is not None:
                prog.idle = True  # its idle status, if not here yet, went with the relay
                self._maybe_finish(prog)
            else:
                self._finish(prog, "stuck", self._failure(prog, "stuck", "AnswerLost", why))
                lost.append(rank)
        return lost

    def root_failure(self) -> RankFailure | None:
        """The earliest failure of a rank that raised or died (what the others await)."""
        failures = [
            p.failure
            for p in self.progress.values()
            if p.failure is not None and p.failure.kind in WIND_DOWN_KINDS
        ]
        return min(failures, key=lambda f: f.order) if failures else None

    def give_up(
        self,
        kind: FailureKind,
        reason: str,
        ename: str = "CellTimeout",
        details: Mapping[int, str] | None = None,
        ranks: list[int] | None = None,
    ) -> list[int]:
        """Finish every rank still running (after a timeout, a lost agent, or ranks
        stuck after another failed), or those of ``ranks`` that are, each with
        ``reason`` and its own ``details``; return which they were."""
        busy = self.busy_ranks if ranks is None else [r for r in ranks if r in self.busy_ranks]
        for rank in busy:
            prog = self.progress[rank]
            detail = (details or {}).get(rank)
            why = f"{reason}; {detail}" if detail else reason
            place = f"did not stop; {detail}" if kind == "timeout" and detail else detail or ""
            self._finish(prog, kind, self._failure(prog, kind, ename, why, place=place))
        return busy

    def stage(self, rank: int) -> str:
        """How far an unfinished rank got with the cell, by the messages that came back:
        a kernel that never began it is not a slow cell."""
        prog = self.progress[rank]
        if prog.reply is not None and not prog.idle:
            return "its reply came back but not its idle status"
        if prog.idle and prog.reply is None:
            return "its idle status came back but not its reply"
        if not prog.began and prog.reply is None:
            return "its kernel never reported starting the cell"
        return ""

    def result(self) -> CellResult:
        failures = tuple(p.failure for p in self.progress.values() if p.failure is not None)
        return CellResult(
            ranks=tuple(sorted(self.progress)),
            failures=failures,
            elapsed={r: p.elapsed for r, p in self.progress.items()},
            timed_out=self.timed_out,
            timeout_s=self.timeout_s,
            interrupted=self.interrupted,
            stopped_by=self.stopped_by,
            stuck=self.stuck,
            freed=self.freed,
        )


def crash_report(log_tail: str, limit: int = 40) -> list[str]:
    """The useful end of a dead rank's log: from its last fatal error, if any."""
    lines = [
        line for line in log_tail.strip().splitlines() if not line.startswith("Extension modules:")
    ]
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if fatal:  # faulthandler prints the innermost frame first
        return lines[fatal[-1] :][:limit]
    return lines[-limit:]


class _RankMessages(PacedHandler):
    def __init__(self, run: CellTracker, rank: int) -> None:
        self.run = run
        self.rank = rank
        self.reply_sink = run
        self.sink = run.sink if isinstance(run.sink, EventQueue) else None

    def __call__(self, channel: str, msg: dict[str, Any]) -> None:
        self.run.on_message(self.rank, channel, msg)

    def has_room(self) -> bool:
        return self.sink is None or not self.sink.full or self.sink.closed

    async def room(self) -> None:
        if self.sink is not None:
            await self.sink.room()
