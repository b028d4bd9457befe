"""A session the Jupyter server owns, as a notebook kernel drives it.

The server started the ranks and keeps them; the kernel gets their HMAC key and sockets
(``GET /sessions/NAME/connection``) and talks to them itself, so cells, output, interrupts
and push/pull take the same path as in an embedded session. What only the owner can see
(a rank process exiting, with its exit code and last log lines) arrives from the server's
event stream and is applied here with `apply_status`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from jupyter_dist.common.payloads import SessionConnection, SessionStatus
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.rank_client import RankClient
from jupyter_dist.control.rank_env import RankPlace
from jupyter_dist.control.rank_group import RankGroup, RankRecord, RankState, SessionState

log = logging.getLogger(__name__)


class AttachedSession(RankGroup):
    """Kernel clients for the ranks of a server-owned session."""

    def __init__(self, status: SessionStatus, connection: SessionConnection) -> None:
        super().__init__(SessionSpec.from_json(status["spec"]), str(connection["key"]))
        self.status_data: SessionStatus = status.copy()
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
        self.fetch_stacks: Callable[[list[int] | None], Awaitable[dict[int, str]]] | None = None
        self._state = SessionState(status["state"])
        self.broken_reason = str(status.get("broken_reason") or "")

    async def connect(self, timeout: float) -> None:
        """Open a kernel client to every rank that is alive."""

        async def one(rec: RankRecord) -> None:
            assert rec.connection is not None
            rec.client = RankClient(rec.rank, rec.connection, self.key, self._context)
            await rec.client.connect(timeout, lambda: None)
            rec.state = RankState.IDLE

        await asyncio.gather(*(one(r) for r in self.ranks.values()))
        self.apply_status(self.status_data)

    def apply_status(self, status: SessionStatus) -> None:
        """Take in the server's picture: deaths of our ranks, the session's state."""
        self.status_data = status.copy()
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
                code = entry.get("returncode")
                self._rank_died(rank, -9 if code is None else int(code), entry.get("exit_tail", ""))
        state = SessionState(status["state"])
        if state != self._state:
            self.broken_reason = str(status.get("broken_reason") or self.broken_reason)
            self.state = state

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
