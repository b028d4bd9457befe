"""Sessions owned by the Jupyter server, as seen from a notebook kernel.

The same calls as the embedded `SessionManager` (`get_or_start`, `find`, `restart`,
`shutdown`, ...), answered by the server extension's REST API. The kernel attaches to the
ranks itself (`AttachedSession`), so cells do not pass through the server; the server's
event stream brings start-up progress and rank deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import cast

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.payloads import (
    HealRequest,
    ServerEvent,
    SessionChanged,
    SessionNotice,
    SessionProgress,
    SessionRemoved,
    SessionRequest,
    SessionStatus,
    Snapshot,
)
from jupyter_dist.common.ports import PORTS_VAR
from jupyter_dist.common.spec import DEFAULT_SESSION, ShapeRequest, check_same_shape
from jupyter_dist.control.cell_queue import Sender
from jupyter_dist.control.recovery import SessionState
from jupyter_dist.control.rendezvous import IFNAME_VARS
from jupyter_dist.control.session import Progress
from jupyter_dist.errors import DistError, SessionError, UnknownSession
from jupyter_dist.server_client.attached_session import AttachedSession
from jupyter_dist.server_client.discovery import kernel_id, notebook_path, notebook_session_name
from jupyter_dist.server_client.rest_client import ServerClient

log = logging.getLogger(__name__)
#: seconds to wait for the event stream before starting a session without progress news
SUBSCRIBE_WAIT_S = 5.0
CONNECT_TIMEOUT_S = 60.0
#: how long a notebook waits for a session whose ranks are being restarted, and how often
#: it asks whether they are
RESTART_WAIT_S = 600.0
RESTART_POLL_S = 0.25
#: sessions shut down elsewhere that this notebook remembers
MAX_NEWS = 16
#: the kernel's variables a session started on the server gets, when they are set: the
#: ones the control plane reads (threads per rank, gloo's and NCCL's interfaces, the store's
#: ports). The ranks inherit the rest from the server; the kernel's own environment (tokens,
#: cloud keys) is not sent.
FORWARDED_ENV = ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", *IFNAME_VARS, PORTS_VAR)


def heals_itself(status: SessionStatus) -> bool:
    """A DEGRADED session that a cell heals before it runs, without being asked: its ranks
    died or could not be stopped, and no node is lost (that waits for ``%dist heal``); a
    notebook cannot attach to it before (`control.recovery`)."""
    return status.get("state") == SessionState.DEGRADED.value and not any(
        node.get("lost") for node in status.get("nodes", [])
    )


class ServerSessions:
    """The server's sessions, attached to on first use."""

    def __init__(self, client: ServerClient, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.client = client
        self.where = f"the Jupyter server at {client.server.url}"
        root = client.server.root_dir
        #: the name of this notebook's own session (the server may give another: `probe`)
        self.default_name = notebook_session_name(env, root) or DEFAULT_SESSION
        if not client.sender.kernel_id:
            client.sender = Sender(notebook_path(env, root), kernel_id(os.getpid()))
        self.sender = client.sender
        #: this notebook as the server knows it: its path now and its file's id (`probe`)
        self.notebook = Sender(self.sender.path, self.sender.kernel_id)
        #: the session this notebook last used when the kernel started, if it runs
        self.last_used = ""
        #: the sessions the server runs, as last heard (its list, then its events)
        self._running: set[str] = set()
        #: what became of the session this notebook used before, said by its first cell
        self.lost_before = ""
        #: the sessions this kernel has attached to (the first time, it says what it found)
        self._attached_once: set[str] = set()
        #: sessions this notebook used that someone else shut down -> who, in words: a
        #: bare cell does not quietly start a new one under the same name
        self.shut_down_elsewhere: dict[str, str] = {}
        self.sessions: dict[str, AttachedSession] = {}
        self._environ = env  # read when a session starts (os.environ: as it is then)
        self._progress: dict[str, Progress] = {}
        self._events: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._closing: set[asyncio.Future[None]] = set()
        self.lost = ""  # why the server's event stream ended

    # -- events -------------------------------------------------------------------------
    async def _follow(self) -> None:
        try:
            await self.client.follow_events(self._on_event)
            reason = "the Jupyter server closed its event stream (did it stop?)"
        except Exception as err:
            reason = f"the Jupyter server's event stream failed: {err}"
        self.lost = reason
        self._subscribed.clear()
        for session in self.sessions.values():
            session.server_lost(reason)

    def _on_event(self, kind: str, data: ServerEvent) -> None:
        """One server-sent event; ``kind``, the SSE event name, says which `data` is."""
        if kind == "snapshot":
            self._subscribed.set()
            statuses = cast(Snapshot, data).get("sessions", [])
            self._running = {str(status.get("name", "")) for status in statuses}
            for status in statuses:
                self._apply(status)
        elif kind == "session":
            self._apply(cast(SessionChanged, data)["session"])
        elif kind == "removed":
            name = cast(SessionRemoved, data)["name"]
            self._running.discard(name)
            session = self.sessions.pop(name, None)
            if session is not None:
                session.server_lost(f"session {name!r} was shut down on the server")
                closing = asyncio.ensure_future(session.close_clients())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        elif kind == "notice":
            self._on_notice(cast(SessionNotice, data))
        elif kind == "progress":
            progress = cast(SessionProgress, data)
            report = self._progress.get(progress.get("name", ""))
            if report is not None:
                report(str(progress.get("text", "")))

    def _on_notice(self, notice: SessionNotice) -> None:
        """Someone interrupted, restarted or shut down a session: a cell of ours running
        there hears it now; else our next cell there does."""
        name = notice.get("name", "")
        session = self.sessions.get(name)
        if session is None or notice.get("by", {}).get("kernel_id") == self.sender.kernel_id:
            return  # not ours, or our own doing
        text = str(notice.get("text", ""))
        if notice.get("action") == "shutdown" and len(self.shut_down_elsewhere) < MAX_NEWS:
            self.shut_down_elsewhere[name] = text
        session.told(text, str(notice.get("action", "")))

    def _apply(self, status: SessionStatus) -> None:
        self._running.add(str(status.get("name", "")))
        session = self.sessions.get(status.get("name", ""))
        if session is not None:
            session.apply_status(status)

    async def _ensure_events(self) -> None:
        if self._events is None or self._events.done():
            self.lost = ""
            self._events = asyncio.ensure_future(self._follow())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), SUBSCRIBE_WAIT_S)

    # -- the notebook's own session --------------------------------------------------------
    async def probe(self) -> None:
        """Whether the server serves jupyter_dist (raises if not); then, once, this
        notebook as the server knows it (by its file, not by the path the kernel was
        started with): the session it last used, found whatever the notebook was renamed
        to, or what became of it if it is gone; and the name of its own session, which is
        not another notebook's (a new file may get a renamed notebook's old name)."""
        self._running = {status["name"] for status in await self.list_status()}
        if not self.sender.path:
            return
        try:
            found = await self.client.notebook()
        except DistError as err:  # the sessions still work, named after the path
            log.warning("jupyter_dist: cannot ask for this notebook's session: %s", err)
            return
        self.notebook = Sender(
            str(found.get("path") or self.sender.path),
            self.sender.kernel_id,
            str(found.get("file_id") or ""),
        )
        if found.get("name"):
            self.default_name = str(found["name"])
        if found.get("session"):
            self.last_used = str(found["session"])
        else:
            self.lost_before = str(found.get("lost") or "")

    def is_running(self, name: str) -> bool:
        """Whether the server runs session ``name``, as last heard."""
        return name in self.sessions or name in self._running

    def belongs_to(self, name: str) -> str:
        """The notebook that started session ``name`` when it is another than this one
        (its path now); "" when it is this one's, or no notebook's, or not attached."""
        session = self.sessions.get(name)
        if session is None:
            return ""
        owner = str(session.status_data.get("notebook") or "")
        owner_id = str(session.status_data.get("notebook_id") or "")
        if not owner:
            return ""
        if owner_id and self.notebook.file_id:
            return "" if owner_id == self.notebook.file_id else owner
        return "" if owner == self.notebook.path else owner

    def _said_on_attach(self, name: str, started: bool, progress: Progress) -> None:
        """The first time this kernel uses session ``name``: say that its ranks kept their
        variables (a kernel restart leaves them be), or what became of the one before."""
        if name in self._attached_once:
            return
        self._attached_once.add(name)
        session = self.sessions.get(name)
        if started or session is None:
            return
        status = session.status_data
        cells = int(status.get("cells_run") or 0)
        if not cells:
            progress(f"attached to session {name!r}, which was already running")
            return
        since = time.strftime("%H:%M", time.localtime(float(status.get("started_at") or 0)))
        progress(
            f"attached to session {name!r}, which was already running: its ranks kept "
            f"their variables ({cells} cell{'s' * (cells != 1)} run there since {since}); "
            f"`%dist restart --session {name}` starts them afresh"
        )

    # -- attaching ----------------------------------------------------------------------
    def _usable(self, name: str) -> AttachedSession | None:
        session = self.sessions.get(name)
        if session is None or session.stale or session.state != SessionState.READY:
            return None  # asked again: the server knows best (a restart may just have ended)
        return session

    async def _wait_restart(self, name: str, progress: Progress) -> None:
        """A session whose ranks are being restarted (a stopped cell's, or from the
        sidebar) is waited for, saying so once, rather than refused."""
        deadline = asyncio.get_running_loop().time() + RESTART_WAIT_S
        said = False
        while (await self.client.status(name)).get("state") == SessionState.RESTARTING.value:
            if not said:
                said = True
                progress(f"waiting for session {name!r}, whose ranks are being restarted")
            if asyncio.get_running_loop().time() > deadline:
                return  # the connection's refusal says what is wrong
            await asyncio.sleep(RESTART_POLL_S)

    async def _attach(
        self, name: str, progress: Progress = lambda _: None, use: bool = False
    ) -> AttachedSession:
        await self._ensure_events()
        await self._wait_restart(name, progress)
        connection = await self.client.connection(name, use)
        status = await self.client.status(name)
        old = self.sessions.pop(name, None)
        if old is not None:
            await old.close_clients()
        session = AttachedSession(status, connection)
        if old is not None:  # what others did to it, not yet said
            session.news = old.news
        session.fetch_stacks = lambda ranks: self.client.stacks(name, ranks)
        session.client = self.client
        session.sender = self.sender
        try:
            await session.connect(CONNECT_TIMEOUT_S)
        except BaseException:
            await session.close_clients()
            raise
        self.sessions[name] = session
        return session

    async def find(self, name: str, use: bool = False) -> AttachedSession:
        """Session ``name``, attached to; ``use``: this notebook uses it from now on
        (``%dist attach``), which the server lists (its cells' turns list it anyway)."""
        if use:
            return await self._attach(name, use=True)
        return self._usable(name) or await self._attach(name)

    async def get_or_start(
        self, name: str, request: ShapeRequest, progress: Progress = lambda _: None
    ) -> tuple[AttachedSession, bool]:
        attached = self._usable(name)
        if attached is not None:
            check_same_shape(attached.spec, request)
            return attached, False
        told = self.shut_down_elsewhere.pop(name, "")
        if told:
            raise SessionError(
                f"{told}. Run the cell again to start a new session {name!r} (with none of "
                "the old one's variables)"
            )
        await self._ensure_events()
        body: SessionRequest = {
            "name": name,
            **request.to_json(),
            "cwd": os.getcwd(),
            "env": {k: self._environ[k] for k in FORWARDED_ENV if k in self._environ},
        }
        if name == self.default_name and self.sender.path:
            body["notebook"] = self.sender.path  # its next kernels find it by the notebook
        self._progress[name] = progress
        try:
            status, started = await self.client.create(body)
        finally:
            self._progress.pop(name, None)
        if started and name == self.default_name and self.lost_before:
            progress(f"{self.lost_before}; this notebook's new session is {name!r}")
            self.lost_before = ""
        if not started and heals_itself(status):  # as an embedded session's next cell does
            progress(await self.heal(name, now=True, progress=progress))
            self._attached_once.add(name)  # what the heal said is what became of it
            return self.sessions[name], False
        session = await self._attach(name, progress)
        self._said_on_attach(name, started, progress)
        return session, started

    async def restart(self, name: str, progress: Progress = lambda _: None) -> AttachedSession:
        await self._ensure_events()
        self._progress[name] = progress
        try:
            await self.client.restart(name)
        finally:
            self._progress.pop(name, None)
        return await self._attach(name)

    async def heal(
        self,
        name: str,
        ranks: Sequence[int] = (),
        spares: Sequence[HostSpec] = (),
        auto: bool | None = None,
        now: bool = True,
        progress: Progress = lambda _: None,
    ) -> str:
        """Asked of the server, which owns the ranks; the notebook then talks to the new
        ones (the survivors' connections stay)."""
        await self._ensure_events()
        body: HealRequest = {"ranks": list(ranks), "spares": [str(h) for h in spares]}
        body["now"] = now
        if auto is not None:
            body["auto"] = auto
        self._progress[name] = progress
        try:
            reply = await self.client.heal(name, body)
        finally:
            self._progress.pop(name, None)
        if now:
            await self._attach(name)
        return reply["said"]

    async def resize(
        self,
        name: str,
        counts: Sequence[int],
        spares: Sequence[HostSpec] = (),
        progress: Progress = lambda _: None,
    ) -> str:
        await self._ensure_events()
        self._progress[name] = progress
        try:
            reply = await self.client.resize(
                name, {"counts": list(counts), "spares": [str(h) for h in spares]}
            )
        finally:
            self._progress.pop(name, None)
        await self._attach(name)
        return reply["said"]

    async def interrupt(self, name: str, ranks: Sequence[int] | None = None) -> None:
        """Interrupt the session's running cell, whoever sent it; everyone is told."""
        if ranks is not None:
            await (await self.find(name)).interrupt(ranks)
            return
        await self.client.interrupt(name)

    # -- stopping -----------------------------------------------------------------------
    async def shutdown(self, name: str) -> None:
        session = self.sessions.pop(name, None)
        if session is not None:
            await session.close_clients()
        await self.client.delete(name)

    async def shutdown_all(self) -> None:
        for status in await self.client.sessions():
            with contextlib.suppress(UnknownSession):
                await self.shutdown(status["name"])

    async def list_status(self) -> list[SessionStatus]:
        return await self.client.sessions()

    async def close(self) -> None:
        """Let go of the ranks (the server keeps them) and of the event stream."""
        for session in list(self.sessions.values()):
            await session.close_clients()
        self.sessions.clear()
        if self._events is not None:
            self._events.cancel()
            with contextlib.suppress(BaseException):
                await self._events
        self.client.close()
