"""REST routes the JupyterLab sidebar needs beside the session routes: a rank's log, read
piece by piece so that the panel can follow it (local or remote node alike: the node's
agent reads it)."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import DistHandler, maps_errors

#: the largest byte offset a request may ask for (a log is never bigger)
MAX_OFFSET = 1 << 50


def check_offset(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_OFFSET:
        raise SpecError(f"offset: {text[:40]!r} is not a byte offset (0 to {MAX_OFFSET})")
    return int(text)


class RankLogHandler(DistHandler):
    """``GET /sessions/NAME/ranks/R/log?offset=N``: the rank's log from byte N (at most
    256 KiB, cut at a line's end) and the offset to ask for next."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self, name: str, rank: str) -> None:
        session = self.manager.get(name)
        if not rank.isdigit() or int(rank) >= session.spec.world_size:
            raise SpecError(
                f"rank {rank[:20]!r}: session {name!r} has ranks 0-{session.spec.world_size - 1}"
            )
        offset = check_offset(self.get_query_argument("offset", "0"))
        self.reply(await session.read_log(int(rank), offset))


_NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
SIDEBAR_HANDLERS = [
    (rf"{API_PREFIX}/sessions/{_NAME}/ranks/(?P<rank>[0-9]{{1,6}})/log", RankLogHandler),
]
