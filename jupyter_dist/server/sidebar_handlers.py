"""REST routes the JupyterLab sidebar needs beside the session routes: a rank's log, read
piece by piece so that the panel can follow it, and a stream of live samples (each node's
CPU, memory and GPUs, each rank's CPU and memory), taken by the nodes' agents only while
someone listens (local or remote nodes alike)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_dist.common.payloads import LOG_KINDS, LogKind
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import DistHandler, maps_errors
from jupyter_dist.server.rank_consoles import KERNEL_NAME, RankConsoles

#: the largest byte offset a request may ask for (a log is never bigger)
MAX_OFFSET = 1 << 50
#: seconds between samples a metrics stream may ask for
MIN_INTERVAL_S = 0.25
MAX_INTERVAL_S = 60.0


def check_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:  # NaN fails too
        raise SpecError(
            f"interval: {text[:40]!r} is not a number of seconds from {MIN_INTERVAL_S} to "
            f"{MAX_INTERVAL_S:g}"
        )
    return value


def check_offset(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_OFFSET:
        raise SpecError(f"offset: {text[:40]!r} is not a byte offset (0 to {MAX_OFFSET})")
    return int(text)


def check_log_kind(text: str) -> LogKind:
    for kind in LOG_KINDS:
        if text == kind:
            return kind
    raise SpecError(f"kind: {text[:40]!r} is not one of {list(LOG_KINDS)}")


class RankLogHandler(DistHandler):
    """``GET /sessions/NAME/ranks/R/log?offset=N&kind=K``: the rank's log from byte N (at
    most 256 KiB, cut at a line's end) and the offset to ask for next; ``kind`` is
    ``output`` (what its cells showed: printed output, tracebacks, rich output as text)
    or ``diagnostics`` (its process log: C-level output, thread dumps; the default).
    Needs ``execute``: what the rank printed is the code's (as the cells' output is)."""

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def get(self, name: str, rank: str) -> None:
        session = self.manager.get(name)
        if not rank.isdigit() or int(rank) >= session.spec.world_size:
            raise SpecError(
                f"rank {rank[:20]!r}: session {name!r} has ranks 0-{session.spec.world_size - 1}"
            )
        offset = check_offset(self.get_query_argument("offset", "0"))
        kind = check_log_kind(self.get_query_argument("kind", "diagnostics"))
        self.reply(await session.read_log(int(rank), offset, kind))


class MetricsHandler(DistHandler):
    """``GET /sessions/NAME/metrics?interval=S``: server-sent ``metrics`` events, one
    sample of every node and rank each ``interval`` seconds (default 1), for as long as
    the client listens; nothing is sampled when nobody does."""

    closed: asyncio.Event | None = None

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self, name: str) -> None:
        session = self.manager.get(name)
        interval = check_interval(self.get_query_argument("interval", "1"))
        self.closed = asyncio.Event()
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        loop = asyncio.get_running_loop()
        with contextlib.suppress(StreamClosedError, asyncio.CancelledError):
            while not self.closed.is_set() and self.manager.sessions.get(name) is session:
                began = loop.time()
                sample = await session.sample()
                self.write(f"event: metrics\ndata: {json.dumps(sample)}\n\n")
                await self.flush()
                left = interval - (loop.time() - began)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.closed.wait(), max(0.0, left))

    def on_connection_close(self) -> None:
        if self.closed is not None:
            self.closed.set()


class RankKernelHandler(DistHandler):
    """``POST /sessions/NAME/ranks/R/kernel``: make rank R's kernel a kernel of this server
    (not owned by it), so that a console or the debugger can connect to it; returns
    ``{"id", "name", "rank"}``. Needs ``execute``: it runs code on the rank."""

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def post(self, name: str, rank: str) -> None:
        session = self.manager.get(name)
        if not rank.isdigit() or int(rank) >= session.spec.world_size:
            raise SpecError(
                f"rank {rank[:20]!r}: session {name!r} has ranks 0-{session.spec.world_size - 1}"
            )
        consoles: RankConsoles = self.settings["jupyter_dist_consoles"]
        kernel_id = await asyncio.to_thread(consoles.adopt, session, int(rank))
        self.reply({"id": kernel_id, "name": KERNEL_NAME, "rank": int(rank)}, 201)


_NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
SIDEBAR_HANDLERS = [
    (rf"{API_PREFIX}/sessions/{_NAME}/ranks/(?P<rank>[0-9]{{1,6}})/log", RankLogHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/metrics", MetricsHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/ranks/(?P<rank>[0-9]{{1,6}})/kernel", RankKernelHandler),
]
