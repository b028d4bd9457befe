"""Who owns this kernel's sessions, side by side: the kernel itself, or the Jupyter server
that launched it, and the choice between them.

Under a Jupyter server with jupyter_dist enabled, sessions belong to the server: they
outlive a kernel restart, other notebooks can attach to them, and the server lists them.
Anywhere else (plain IPython, nbclient, a server without the extension) the kernel runs
the same `SessionManager` itself, on a loop thread (`EmbeddedOwner`; every session it
started is shut down when the process exits). The magic sees one interface,
`SessionOwner`, either way.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.payloads import SessionStatus
from jupyter_dist.common.spec import ShapeRequest
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.control.rank_group import RankGroup
from jupyter_dist.control.session import Progress
from jupyter_dist.notebook.loop_thread import LoopThread, shared_loop
from jupyter_dist.server_client.discovery import ServerInfo, find_server
from jupyter_dist.server_client.rest_client import ServerClient
from jupyter_dist.server_client.server_sessions import ServerSessions

T = TypeVar("T")
log = logging.getLogger(__name__)
#: seconds to wait for the server's answer when deciding who owns the sessions
PROBE_TIMEOUT_S = 15.0
SHUTDOWN_TIMEOUT_S = 20.0


class SessionRegistry(Protocol):
    """What the magic asks of whoever owns the sessions."""

    where: str
    #: the name of this notebook's own session (a cell that names none starts it)
    default_name: str
    #: the session this notebook used before the kernel started ("": none known)
    last_used: str

    @property
    def sessions(self) -> Mapping[str, RankGroup]: ...

    async def get_or_start(
        self, name: str, request: ShapeRequest, progress: Progress = ...
    ) -> tuple[RankGroup, bool]: ...

    async def find(self, name: str, use: bool = ...) -> RankGroup: ...

    def is_running(self, name: str) -> bool: ...

    def belongs_to(self, name: str) -> str: ...

    async def restart(self, name: str, progress: Progress = ...) -> RankGroup: ...

    async def shutdown(self, name: str) -> None: ...

    async def interrupt(self, name: str, ranks: Sequence[int] | None = None) -> None: ...

    async def heal(
        self,
        name: str,
        ranks: Sequence[int] = ...,
        spares: Sequence[HostSpec] = ...,
        auto: bool | None = ...,
        now: bool = ...,
        progress: Progress = ...,
    ) -> str: ...

    async def resize(
        self,
        name: str,
        counts: Sequence[int],
        spares: Sequence[HostSpec] = ...,
        progress: Progress = ...,
    ) -> str: ...

    async def shutdown_all(self) -> None: ...

    async def list_status(self) -> list[SessionStatus]: ...


class SessionOwner(Protocol):
    """A session owner: its registry of sessions and the loop thread it runs them on."""

    loop: LoopThread

    @property
    def manager(self) -> SessionRegistry: ...

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def close(self) -> None: ...


class _LoopOwner:
    """What both owners share: the loop thread their coroutines run on, and a close at
    exit."""

    def __init__(self, loop: LoopThread | None) -> None:
        self.loop = loop or shared_loop()
        atexit.register(self.close)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.loop.run(coro, timeout)

    def close(self) -> None:
        raise NotImplementedError


class EmbeddedOwner(_LoopOwner):
    """Sessions owned by this process."""

    def __init__(self, loop: LoopThread | None = None) -> None:
        self.manager = SessionManager()
        super().__init__(loop)

    def close(self) -> None:
        """Shut every session down (at exit, or when the extension is unloaded)."""
        if not self.manager.sessions:
            return
        with contextlib.suppress(Exception):
            self.loop.run(self.manager.shutdown_all(), SHUTDOWN_TIMEOUT_S)


_embedded: EmbeddedOwner | None = None
_embedded_lock = threading.Lock()


def embedded_owner() -> EmbeddedOwner:
    """This process's embedded owner, created on first use."""
    global _embedded
    with _embedded_lock:
        if _embedded is None:
            _embedded = EmbeddedOwner()
        return _embedded


class ServerOwner(_LoopOwner):
    """Sessions owned by a Jupyter server, driven from this kernel."""

    def __init__(self, server: ServerInfo, loop: LoopThread | None = None) -> None:
        self.server = server
        self.manager = ServerSessions(ServerClient(server))
        super().__init__(loop)

    def close(self) -> None:
        """Let go of the server's sessions (they keep running there)."""
        with contextlib.suppress(Exception):
            self.loop.run(self.manager.close(), SHUTDOWN_TIMEOUT_S)


_chosen: SessionOwner | None = None
_lock = threading.Lock()
#: why sessions stay in the kernel although a server launched it ("" when not so)
fallback_reason = ""


def choose(env: Mapping[str, str]) -> SessionOwner:
    """The server that launched this kernel if it serves jupyter_dist, else the kernel."""
    global fallback_reason
    server = find_server(env)
    if server is None:
        return embedded_owner()
    plane = ServerOwner(server)
    try:
        plane.run(plane.manager.probe(), PROBE_TIMEOUT_S)
    except Exception as err:
        fallback_reason = f"the Jupyter server at {server.url} does not serve them ({err})"
        log.warning("jupyter_dist: sessions run in this kernel: %s", fallback_reason)
        plane.close()
        return embedded_owner()
    return plane


def session_owner() -> SessionOwner:
    """This kernel's session owner, chosen on first use."""
    global _chosen
    with _lock:
        if _chosen is None:
            _chosen = choose(os.environ)
        return _chosen
