"""Who owns this kernel's sessions: the Jupyter server that launched it, or the kernel.

Under a Jupyter server with jupyter_dist enabled, sessions belong to the server: they
outlive a kernel restart, other notebooks can attach to them, and the sidebar lists them.
Anywhere else (plain IPython, nbclient, a server without the extension) the kernel runs
the same `SessionManager` itself. The magic sees one interface either way.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from jupyter_dist.inprocess import SHUTDOWN_TIMEOUT_S, control
from jupyter_dist.loop_thread import LoopThread, shared_loop
from jupyter_dist.rank_group import RankGroup
from jupyter_dist.server_client import ServerClient
from jupyter_dist.server_discovery import ServerInfo, find_server
from jupyter_dist.server_sessions import ServerSessions
from jupyter_dist.session import Progress
from jupyter_dist.spec import ShapeRequest

T = TypeVar("T")
log = logging.getLogger(__name__)
#: seconds to wait for the server's answer when deciding who owns the sessions
PROBE_TIMEOUT_S = 15.0


class SessionHost(Protocol):
    """What the magic asks of whoever owns the sessions."""

    where: str
    default_name: str

    @property
    def sessions(self) -> Mapping[str, RankGroup]: ...

    async def get_or_start(
        self, name: str, request: ShapeRequest, progress: Progress = ...
    ) -> tuple[RankGroup, bool]: ...

    async def find(self, name: str) -> RankGroup: ...

    async def restart(self, name: str, progress: Progress = ...) -> RankGroup: ...

    async def shutdown(self, name: str) -> None: ...

    async def shutdown_all(self) -> None: ...

    async def list_status(self) -> list[dict[str, Any]]: ...


class ControlPlane(Protocol):
    loop: LoopThread

    @property
    def manager(self) -> SessionHost: ...

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def close(self) -> None: ...


class ServerControl:
    """Sessions owned by a Jupyter server, driven from this kernel."""

    def __init__(self, server: ServerInfo, loop: LoopThread | None = None) -> None:
        self.loop = loop or shared_loop()
        self.server = server
        self.manager = ServerSessions(ServerClient(server))
        atexit.register(self.close)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.loop.run(coro, timeout)

    def close(self) -> None:
        """Let go of the server's sessions (they keep running there)."""
        with contextlib.suppress(Exception):
            self.loop.run(self.manager.close(), SHUTDOWN_TIMEOUT_S)


_chosen: ControlPlane | None = None
_lock = threading.Lock()
#: why sessions stay in the kernel although a server launched it ("" when not so)
fallback_reason = ""


def choose(env: Mapping[str, str]) -> ControlPlane:
    """The server that launched this kernel if it serves jupyter_dist, else the kernel."""
    global fallback_reason
    server = find_server(env)
    if server is None:
        return control()
    plane = ServerControl(server)
    try:
        plane.run(plane.manager.list_status(), PROBE_TIMEOUT_S)
    except Exception as err:
        fallback_reason = f"the Jupyter server at {server.url} does not serve them ({err})"
        log.warning("jupyter_dist: sessions run in this kernel: %s", fallback_reason)
        plane.close()
        return control()
    return plane


def control_plane() -> ControlPlane:
    """This kernel's control plane, chosen on first use."""
    global _chosen
    with _lock:
        if _chosen is None:
            _chosen = choose(os.environ)
        return _chosen
