"""``/sessions/NAME/turns``: a notebook asks for its turn on a session's ranks, and ends it.

The server keeps one `CellQueue` per session (`control.cell_queue`): cells, pulls and
pushes from every attached notebook run one at a time, in order, each sender seeing who
runs before it. A notebook kernel still talks to the ranks itself; it only asks here
first. Asking is a long poll (`POLL_S`), repeated with the same ``turn_id`` until the
turn runs: no request is held longer than a proxy would allow, and a turn granted to a
sender that no longer asks (its kernel stopped) is given up after `CLAIM_S`.

A sender that names a kernel must name one of this server's notebook kernels
(`server.notebook_kernels`); the turns of a kernel that is gone are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_dist.common.payloads import TurnReply
from jupyter_dist.common.spec import parse_ranks
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.control.cell_queue import CellQueue, Sender, Turn, check_kind
from jupyter_dist.control.session import Session
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import DistHandler, maps_errors

#: seconds one ask waits before it answers "waiting" (the client asks again)
POLL_S = 20.0
#: seconds a granted turn waits for its sender to take it before it is given up
CLAIM_S = 30.0
_TURN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_turn_id(value: object) -> str:
    if not isinstance(value, str) or not _TURN_ID.fullmatch(value):
        raise SpecError(
            f"turn_id: {str(value)[:80]!r} is not 1 to 64 letters, digits, '_', '.' or '-'"
        )
    return value


def _reply(turn: Turn, queue: CellQueue) -> TurnReply:
    state = "withdrawn" if turn.withdrawn else "running" if turn.granted.is_set() else "waiting"
    running = queue.running
    return {
        "turn_id": turn.turn_id,
        "state": state,
        "running": None if running is None else running.to_json(),
    }


def _give_up_unclaimed(session: Session, turn: Turn) -> None:
    if session.turns.running is turn and not getattr(turn, "claimed", False):
        session.turns.end(turn.turn_id)


class TurnsHandler(DistHandler):
    """``POST /sessions/NAME/turns`` with ``{turn_id, kind, ranks, sender}``: queue the
    turn (or find it again) and wait up to `POLL_S` for it to run."""

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def post(self, name: str) -> None:
        session = self.manager.get(name)
        await self.prune()  # a dead notebook's turn does not hold up the others
        body: Any = self.json_body()
        if not isinstance(body, dict):
            raise SpecError("expected a JSON object with turn_id, kind, ranks, sender")
        unknown = sorted(set(body) - {"turn_id", "kind", "ranks", "sender"})
        if unknown:
            raise SpecError(
                f"unknown field {unknown[0][:80]!r}; expected turn_id, kind, ranks, sender"
            )
        turn_id = check_turn_id(body.get("turn_id"))
        turn = session.turns.find(turn_id)
        if turn is None:
            ranks = body.get("ranks") or []
            if not isinstance(ranks, list) or not all(type(r) is int for r in ranks):
                raise SpecError(f"ranks: {str(ranks)[:80]!r} is not a list of rank numbers")
            if ranks:
                ranks = parse_ranks(",".join(map(str, ranks)), session.spec.world_size)
            sender = await self.checked(Sender.from_json(body.get("sender")), "sender.")
            if sender.kernel_id:
                self.manager.attach(name, sender)
            turn = session.turns.enqueue(
                Turn(turn_id, sender, check_kind(body.get("kind", "cell")), tuple(ranks))
            )
            if turn.granted.is_set() and not turn.withdrawn:
                turn.claimed = True
            else:
                self._watch_grant(session, turn)
        if not turn.granted.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(turn.granted.wait(), POLL_S)
        if turn.granted.is_set():
            turn.claimed = True
        self.reply(_reply(turn, session.turns))

    @staticmethod
    def _watch_grant(session: Session, turn: Turn) -> None:
        async def watch() -> None:
            await turn.granted.wait()
            if not turn.withdrawn and not turn.claimed:
                asyncio.get_running_loop().call_later(CLAIM_S, _give_up_unclaimed, session, turn)

        task = asyncio.ensure_future(watch())
        session.background.add(task)
        task.add_done_callback(session.background.discard)


class TurnEndHandler(DistHandler):
    """``POST /sessions/NAME/turns/ID/end`` with ``{errors, ran}``: the turn is over (or,
    if it still waits, withdrawn)."""

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def post(self, name: str, turn_id: str) -> None:
        session = self.manager.get(name)
        body: Any = self.json_body() if self.request.body else {}
        if not isinstance(body, dict):
            raise SpecError("expected a JSON object with errors, ran")
        errors = body.get("errors") or {}
        if not isinstance(errors, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, str) for k, v in errors.items()
        ):
            raise SpecError(f"errors: {str(errors)[:80]!r} is not an object of rank: line")
        ran = body.get("ran") or []
        if not isinstance(ran, list) or not all(type(r) is int for r in ran):
            raise SpecError(f"ran: {str(ran)[:80]!r} is not a list of rank numbers")
        session.turns.end(turn_id, {int(k): v for k, v in errors.items()}, ran)
        self.set_status(204)
        self.finish()


_NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
TURN_HANDLERS = [
    (rf"{API_PREFIX}/sessions/{_NAME}/turns", TurnsHandler),
    (
        rf"{API_PREFIX}/sessions/{_NAME}/turns/(?P<turn_id>[A-Za-z0-9_.-]{{1,64}})/end",
        TurnEndHandler,
    ),
]
