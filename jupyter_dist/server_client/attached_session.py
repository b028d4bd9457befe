"""A session the Jupyter server owns, as a notebook kernel drives it.

The server started the ranks and keeps them; the kernel gets their HMAC key and sockets
(``GET /sessions/NAME/connection``) and talks to them itself, so cells, output, interrupts
and push/pull take the same path as in an embedded session. What only the owner can see
(a rank process exiting, with its exit code and last log lines) arrives from the server's
event stream and is applied here with `apply_status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from jupyter_dist.common.events import CellEvent, Notice
from jupyter_dist.common.payloads import SessionConnection, SessionStatus, TurnRequest
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.cell_queue import TurnKind, waiting_text
from jupyter_dist.control.rank_env import RankPlace
from jupyter_dist.control.rank_group import (
    MAX_NEWS,
    RankGroup,
    RankRecord,
    RankState,
    TurnWithdrawn,
    WaitingLine,
)
from jupyter_dist.control.recovery import SessionState

if TYPE_CHECKING:
    from jupyter_dist.server_client.rest_client import ServerClient

log = logging.getLogger(__name__)
#: seconds to reach the new ranks of a session restarted while a turn waited
REFRESH_TIMEOUT_S = 60.0
#: seconds within which a turn counts as given at once (no one else's request ran first)
TURN_AT_ONCE_S = 0.5


class AttachedSession(RankGroup):
    """Kernel clients for the ranks of a server-owned session."""

    def __init__(self, status: SessionStatus, connection: SessionConnection) -> None:
        super().__init__(SessionSpec.from_json(status["spec"]), str(connection["key"]))
        self.fetch_stacks: Callable[[list[int] | None], Awaitable[dict[int, str]]] | None = None
        self.client: ServerClient | None = None  # the server, which keeps the turns
        self._waiting_line: WaitingLine | None = None  # while a turn of ours waits
        self._take(status, connection)

    def _take(self, status: SessionStatus, connection: SessionConnection) -> None:
        """The ranks ``connection`` names, in the state ``status`` gives."""
        self.key = str(connection["key"])
        self.status_data = status.copy()
        self.ranks = {}
        pids = {r["rank"]: r.get("pid") for r in status.get("ranks", [])}
        for entry in connection["ranks"]:
            sockets = entry["connection"]
            place = RankPlace(
                rank=entry["rank"],
                local_rank=entry["local_rank"],
                node_rank=entry["node_rank"],
            )
            self.ranks[place.rank] = RankRecord(
                place,
                entry["host"],
                pid=pids.get(place.rank),
                connection=None if sockets is None else sockets.copy(),
            )
        self._state = SessionState(status["state"])
        self.broken_reason = str(status.get("broken_reason") or "")
        self.stale = False
        # the server's picture: its faults are recorded again as its ranks are seen dead
        self.recovery.faults.clear()
        self.recovery.generation = int(status.get("generation") or 0)
        self.recovery.replaced = tuple(int(r) for r in status.get("replaced") or ())

    async def refresh(self, timeout: float) -> None:
        """The server restarted the ranks while this notebook waited for its turn: talk
        to the new ones (the old ones' variables are gone)."""
        assert self.client is not None
        connection = await self.client.connection(self.name)
        status = await self.client.status(self.name)
        await self.close_clients()
        self._take(status, connection)
        await self.connect(timeout)

    async def connect(self, timeout: float) -> None:
        """Open a kernel client to every rank that is alive."""

        async def one(rec: RankRecord) -> None:
            assert rec.connection is not None
            rec.client = self.new_client(rec)
            # asked on the control channel: another notebook's cell may be running
            await rec.client.connect(timeout, lambda: None, channel="control")
            rec.state = RankState.IDLE

        await asyncio.gather(*(one(r) for r in self.ranks.values()))
        self.apply_status(self.status_data)

    def apply_status(self, status: SessionStatus) -> None:
        """Take in the server's picture: deaths of our ranks, the session's state."""
        self.status_data = status.copy()
        if self._waiting_line is not None:  # what our turn waits for changed: say so now
            self._say_waiting(self._waiting_line)
        current = {r["rank"]: r for r in status.get("ranks", [])}
        ours = all(
            (current[rank].get("pid") if rank in current else None) == rec.pid
            for rank, rec in self.ranks.items()
        )
        if not ours:  # restarted by someone: these clients talk to the old ranks
            if status.get("state") == SessionState.READY.value:
                self.stale = True
            return
        for rank, entry in current.items():
            if entry.get("state") == RankState.DEAD.value:
                code, tail = entry.get("returncode"), str(entry.get("exit_tail") or "")
                if code is None:  # out of reach, not dead of its own: "exit" says why
                    lost = str(entry.get("exit") or "its node is out of reach")
                    self._rank_died(rank, None, tail, how=lost)
                else:
                    self._rank_died(rank, int(code), tail)
        state = SessionState(status["state"])
        if state != self._state:
            self.broken_reason = str(status.get("broken_reason") or self.broken_reason)
            self.state = state

    # -- turns, kept by the server ----------------------------------------------------------
    @contextlib.asynccontextmanager
    async def turn(
        self, kind: TurnKind, ranks: Sequence[int], sink: queue.SimpleQueue[CellEvent] | None
    ) -> AsyncIterator[dict[int, str]]:
        """Wait for this notebook's turn on the ranks in the server's queue, telling
        ``sink`` each second whose cell runs meanwhile; yield a dict the caller fills
        with failed ranks' error lines; end the turn on the server."""
        client = self.client
        if client is None:  # not attached through a server (tests): no one else to wait for
            async with super().turn(kind, ranks, sink) as local:
                yield local
            return
        turn_id = uuid.uuid4().hex
        body: TurnRequest = {
            "turn_id": turn_id,
            "kind": kind,
            "ranks": list(ranks),
            "sender": self.sender.to_json(),
        }
        self._waiting = turn_id
        told = WaitingLine(sink)
        ticker = asyncio.ensure_future(self._tell_waiting(told)) if sink is not None else None
        loop = asyncio.get_running_loop()
        asked = loop.time()
        try:
            while True:
                reply = await client.take_turn(self.name, body)
                if reply["state"] == "running":
                    break
                if reply["state"] == "withdrawn":
                    raise TurnWithdrawn(turn_id)
            waited = loop.time() - asked > TURN_AT_ONCE_S
            if waited or self.stale or self.state != SessionState.READY:
                await self._follow_restart()  # the ranks may have been restarted meanwhile
        except BaseException:
            with contextlib.suppress(Exception):  # withdraw it (a no-op if it was)
                await client.end_turn(self.name, turn_id)
            raise
        finally:
            self._waiting = None
            self._waiting_line = None
            if ticker is not None:
                ticker.cancel()
            told.clear()
        errors: dict[int, str] = {}
        try:
            yield errors
        finally:
            try:
                await client.end_turn(self.name, turn_id, errors, ranks)
            except Exception as err:  # the server went away: its queue went with it
                log.info("session %s: ending turn %s failed: %s", self.name, turn_id, err)

    async def _tell_waiting(self, told: WaitingLine) -> None:
        """Each second, and whenever the server's picture changes, what the turn waits
        for: one line, updated."""
        await asyncio.sleep(0.3)  # a turn that comes at once needs no word
        self._waiting_line = told
        while True:
            self._say_waiting(told)
            await asyncio.sleep(1.0)

    def _say_waiting(self, told: WaitingLine) -> None:
        restarting = self.status_data.get("state") == SessionState.RESTARTING.value
        told.say(waiting_text(self.status_data.get("running")), restarting)

    async def _follow_restart(self) -> None:
        """After a wait for the turn: if the server restarted the ranks meanwhile, talk to
        the new ones (their pids tell; the event saying so may not be here yet)."""
        assert self.client is not None
        status = await self.client.status(self.name)
        pids = {r["rank"]: r.get("pid") for r in status.get("ranks", [])}
        if self.stale or any(pids.get(r) != rec.pid for r, rec in self.ranks.items()):
            await self.refresh(REFRESH_TIMEOUT_S)

    async def restart_ranks(self) -> None:
        """Asked of the server, which owns the ranks; this object's clients then talk to
        the old ones, and the notebook attaches again before its next cell."""
        if self.client is None:
            await super().restart_ranks()
            return
        await self.client.restart(self.name)
        self.stale = True

    async def heal(
        self, ranks: Sequence[int] = (), progress: Any = None, new_group: str = ""
    ) -> str:
        """Asked of the server, which owns the ranks; then this object talks to the new
        ones (still in this notebook's turn, so its cell runs on them)."""
        if self.client is None:
            return await super().heal(ranks, progress, new_group)
        reply = await self.client.heal(self.name, {"ranks": list(ranks), "new_group": new_group})
        await self.refresh(REFRESH_TIMEOUT_S)
        return reply["said"]

    async def withdraw(self, turn_id: str) -> None:
        if self.client is None:
            await super().withdraw(turn_id)
            return
        await self.client.end_turn(self.name, turn_id)

    def told(self, text: str, action: str) -> bool:
        """Someone else interrupted, restarted or shut down this session: a cell of this
        notebook running there is told now (and its stopped ranks are put down to that,
        not counted as failures of their own). False if no cell of ours runs."""
        run = self._current
        if run is None:
            if len(self.news) < MAX_NEWS:
                self.news.append(text)
            return False
        run.stopped_by = text
        if action == "interrupt":  # the server interrupted every rank
            run.stop_asked()
            run.interrupt_sent(list(run.progress))
        if run.sink is not None:  # news while it runs: the cell's error says it again
            run.sink.put(Notice(text, transient=True))
        return True

    async def free_from_collective(self, ranks: Sequence[int]) -> list[int]:
        """Asked of the server, whose agents reach the ranks."""
        if self.client is None:
            return await super().free_from_collective(ranks)
        return await self.client.free(self.name, list(ranks))

    async def stacks(self, ranks: Sequence[int] | None = None) -> dict[int, str]:
        """Asked of the server, whose agents can signal the ranks."""
        if self.fetch_stacks is None:
            return await super().stacks(ranks)
        return await self.fetch_stacks(list(ranks) if ranks is not None else None)

    def server_lost(self, reason: str) -> None:
        """The server went away; its ranks went with it (it stops them, or their agents
        lose their parent)."""
        for rank, rec in self.ranks.items():
            if rec.state != RankState.DEAD:
                self._rank_died(rank, -9, reason)
        self.broken_reason = reason
        self.state = SessionState.STOPPED

    def status(self) -> SessionStatus:
        return self.status_data
