"""Whose turn it is on a session's ranks: one cell (or pull, or push) at a time, in order.

Several notebooks can drive one session. Left to themselves, their requests would queue
unseen in each rank's shell: a short cell would wait in silence behind a long one, an
error in one notebook's cell would abort another's, a timeout would interrupt whatever
ran. Instead the session's owner keeps this queue: a sender asks for a turn, waits for it
where everyone can see (`QueueStatus`: who runs, since when, who waits), sends its
requests to the ranks itself, and ends the turn. A sender that goes away (its kernel
died) has its waiting turns withdrawn and its running turn ended (`drop_sender`), so
nobody waits for it for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from jupyter_dist.common.payloads import QueueStatus, SenderJSON, TurnStatus
from jupyter_dist.errors import SessionError, SpecError

TurnKind = Literal["cell", "pull", "push"]
TURN_KINDS: tuple[TurnKind, ...] = ("cell", "pull", "push")
#: waiting turns a session holds at most (each is a request someone made by hand)
MAX_WAITING = 256
#: waiting turns of one sender (a notebook kernel waits for one turn at a time; the
#: clients that name no kernel count as one sender): what a session's status lists stays
#: small, and one sender cannot fill the queue
MAX_WAITING_PER_SENDER = 8
#: characters kept of a sender's notebook path and of an error line
MAX_PATH_CHARS = 1024
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class Sender:
    """Who asked: the notebook (its path, as the server knows it) and its kernel. A server
    that knows which file the notebook is also says its ``file_id`` (renames keep it; a
    new file that gets an old name has another): it is never read from a request."""

    path: str = ""
    kernel_id: str = ""
    file_id: str = ""

    @property
    def notebook(self) -> str:
        """What tells this notebook from others: its file's id, else its path."""
        return self.file_id or self.path

    @property
    def label(self) -> str:
        """How a person names it: ``train.ipynb``, else its kernel."""
        if self.path:
            return self.path
        if self.kernel_id:
            return f"kernel {self.kernel_id[:8]}"
        return "another client"

    def to_json(self) -> SenderJSON:
        return {"path": self.path, "kernel_id": self.kernel_id}

    @classmethod
    def from_json(cls, data: object, where: str = "sender") -> Sender:
        """A sender as a request gives it; bad fields are named."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: {str(data)[:80]!r} is not an object with path, kernel_id")
        unknown = sorted(set(data) - {"path", "kernel_id"})
        if unknown:
            raise SpecError(f"{where}: unknown field {unknown[0][:80]!r}; expected path, kernel_id")
        values = []
        for key in ("path", "kernel_id"):
            value = data.get(key, "")
            if not isinstance(value, str) or len(value) > MAX_PATH_CHARS or "\0" in value:
                raise SpecError(
                    f"{where}.{key}: {str(value)[:80]!r} is not a string of at most "
                    f"{MAX_PATH_CHARS} characters"
                )
            values.append(value)
        return cls(values[0], values[1])


@dataclass
class Turn:
    """One request for the ranks: queued, then running, then over."""

    turn_id: str
    sender: Sender
    kind: TurnKind = "cell"
    ranks: tuple[int, ...] = ()  # () = every rank
    queued_at: float = field(default_factory=time.time)
    started: float | None = None
    granted: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    withdrawn: bool = False
    claimed: bool = False  # its sender learnt that it runs (see server.turn_handlers)
    #: the ranks it was granted (`CellQueue.generation`): its errors are theirs only
    generation: int = 0

    def to_json(self) -> TurnStatus:
        return {
            "turn_id": self.turn_id,
            "kind": self.kind,
            "ranks": list(self.ranks),
            **self.sender.to_json(),
            "queued_at": self.queued_at,
            "started": self.started,
        }


def waiting_text(running: TurnStatus | None, now: float | None = None) -> str:
    """What a waiting sender is told: ``waiting for a cell from train.ipynb (running 8 s)``."""
    if running is None:
        return "waiting for the session's ranks"
    sender = Sender(running.get("path", ""), running.get("kernel_id", ""))
    what = {"cell": "a cell", "pull": "a pull", "push": "a push"}.get(running.get("kind", ""))
    started = running.get("started")
    since = ""
    if started is not None:
        since = f" (running {max(0.0, (now or time.time()) - started):.0f} s)"
    return f"waiting for {what or 'a request'} from {sender.label}{since}"


class CellQueue:
    """The turns of one session. Lives on the owner's event loop."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.on_change = on_change
        self.running: Turn | None = None
        self.waiting: deque[Turn] = deque()
        self.cells_run = 0
        #: rank -> its last error line, from the turns that reported one
        self.last_errors: dict[int, str] = {}
        #: counts the restarts of the ranks: a turn granted before one ends with errors
        #: of ranks that are gone, which the fresh ones do not inherit
        self.generation = 0
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        return f"local-{next(self._ids)}"

    def find(self, turn_id: str) -> Turn | None:
        if self.running is not None and self.running.turn_id == turn_id:
            return self.running
        return next((t for t in self.waiting if t.turn_id == turn_id), None)

    def enqueue(self, turn: Turn) -> Turn:
        """Queue ``turn`` (or find it again: asking twice with one id is one turn)."""
        known = self.find(turn.turn_id)
        if known is not None:
            return known
        if len(self.waiting) >= MAX_WAITING:
            raise SessionError(
                f"{len(self.waiting)} requests already wait for this session's ranks "
                f"(at most {MAX_WAITING}); wait for them or withdraw some"
            )
        mine = sum(t.sender.kernel_id == turn.sender.kernel_id for t in self.waiting)
        if mine >= MAX_WAITING_PER_SENDER:
            raise SessionError(
                f"{mine} requests from {turn.sender.label} already wait for this session's "
                f"ranks (at most {MAX_WAITING_PER_SENDER} from one sender); wait for them or "
                "withdraw some"
            )
        self.waiting.append(turn)
        self._grant_next()
        self.on_change()
        return turn

    async def take(
        self,
        turn: Turn,
        report: Callable[[str], None] | None = None,
        report_every: float = 1.0,
    ) -> Turn:
        """Wait until ``turn`` runs; ``report`` hears what it waits for, every
        ``report_every`` seconds. Cancelled, the turn is withdrawn."""
        turn = self.enqueue(turn)
        try:
            while not turn.granted.is_set():
                if report is not None and self.running is not None:
                    report(waiting_text(self.running.to_json()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(turn.granted.wait(), report_every)
        except BaseException:
            self.end(turn.turn_id)
            raise
        if turn.withdrawn:
            raise SessionError(f"the request {turn.turn_id} was withdrawn before it ran")
        return turn

    def end(
        self, turn_id: str, errors: Mapping[int, str] | None = None, ran: Sequence[int] = ()
    ) -> Turn | None:
        """End the running turn ``turn_id``, or withdraw it if it still waits. ``errors``:
        the ranks that failed and their error lines; ``ran``: the ranks it ran on."""
        turn = self.find(turn_id)
        if turn is None:
            return None
        if turn is self.running and turn.generation != self.generation:
            self.running = None  # it ran on ranks restarted since: their errors are gone
        elif turn is self.running:
            self.running = None
            for rank in ran or turn.ranks:
                self.last_errors.pop(rank, None)
            for rank, line in (errors or {}).items():
                self.last_errors[rank] = line[:MAX_ERROR_CHARS]
        else:
            self.waiting.remove(turn)
            turn.withdrawn = True
            turn.granted.set()  # wakes its waiter, which sees it withdrawn
        self._grant_next()
        self.on_change()
        return turn

    def ranks_restarted(self) -> None:
        """The ranks are (being) started again: what their cells failed with is forgotten,
        and so is what the turns running now end with."""
        self.generation += 1
        self.last_errors.clear()
        self.on_change()

    def drop_sender(self, kernel_id: str) -> tuple[Turn | None, list[Turn]]:
        """A sender went away: withdraw its waiting turns and end its running one, which
        is returned (its cell may still run on the ranks: the caller interrupts it)."""
        gone = [t for t in self.waiting if t.sender.kernel_id == kernel_id]
        for turn in gone:
            self.end(turn.turn_id)
        running = self.running
        if running is not None and running.sender.kernel_id == kernel_id:
            self.end(running.turn_id)
            return running, gone
        return None, gone

    def clear(self) -> None:
        """The session stopped: every waiting turn is withdrawn."""
        for turn in list(self.waiting):
            self.end(turn.turn_id)
        self.running = None

    def _grant_next(self) -> None:
        while self.running is None and self.waiting:
            turn = self.waiting.popleft()
            if turn.withdrawn:
                continue
            turn.started = time.time()
            turn.generation = self.generation
            if turn.kind == "cell":
                self.cells_run += 1
            self.running = turn
            turn.granted.set()

    def busy_since(self, rank: int) -> float | None:
        running = self.running
        if running is None or running.kind != "cell":
            return None
        if running.ranks and rank not in running.ranks:
            return None
        return running.started

    def status(self) -> QueueStatus:
        return {
            "running": None if self.running is None else self.running.to_json(),
            "queue": [t.to_json() for t in self.waiting],
        }


def check_kind(value: object) -> TurnKind:
    for kind in TURN_KINDS:
        if value == kind:
            return kind
    raise SpecError(f"kind: {str(value)[:40]!r} is not one of {list(TURN_KINDS)}")
