"""The registry of named sessions: find one, or start it, and stop them all.

Runs wherever the control plane runs: inside the notebook kernel (the embedded default)
or inside the Jupyter server (the server extension). It imports nothing of IPython or tornado.

A start runs as a task of its own (`SessionManager._starts`), so that stopping every
session (`SessionManager.shutdown_all`, and `SessionManager.close` when the owner stops)
stops those still starting too: the start is cancelled, which undoes what it made (the
session's agents, a Ray driver, a dial-back listener), and its caller is told why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from jupyter_dist.common.gpus import discover_gpus
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.notebook_names import numbered
from jupyter_dist.common.payloads import ManagerEvent, SessionStatus
from jupyter_dist.common.ports import PORTS_VAR
from jupyter_dist.common.spec import (
    DEFAULT_SESSION,
    SessionSpec,
    ShapeRequest,
    check_same_shape,
    resolve_shape,
)
from jupyter_dist.control.cell_queue import Sender
from jupyter_dist.control.launchers import launcher_for
from jupyter_dist.control.limits import SessionLimits, check_room
from jupyter_dist.control.notebook_paths import NotebookPaths, moved
from jupyter_dist.control.rank_group import RankGroup
from jupyter_dist.control.session import (
    LauncherFactory,
    Progress,
    Session,
    SessionState,
    SessionTimeouts,
)
from jupyter_dist.errors import SessionError, SpecError, UnknownSession
from jupyter_dist.settings import max_ranks_per_node

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionDefaults:
    """What a session gets when its request does not say (the server's options)."""

    hosts: tuple[HostSpec, ...] = ()  # nodes for requests that name none (but --nodes 1)
    ssh_config: str | None = None
    master_ports: str | None = None  # "lo-hi": where MASTER_PORT may be
    max_ranks_per_node: int | None = None  # None: settings.max_ranks_per_node()

    def apply(self, request: ShapeRequest) -> ShapeRequest:
        if self.hosts and not request.hosts and request.nodes != 1:
            count = request.nodes or len(self.hosts)
            if count > len(self.hosts):
                raise SpecError(
                    f"--nodes {count}: the server knows {len(self.hosts)} hosts "
                    f"({', '.join(map(str, self.hosts))}); give --hosts, or fewer nodes"
                )
            request = dataclasses.replace(request, hosts=self.hosts[:count], nodes=count)
        if self.ssh_config and request.ssh_config is None:
            request = dataclasses.replace(request, ssh_config=self.ssh_config)
        return request


class SessionManager:
    """Named sessions, started on demand, within ``limits`` (`control.limits`: by default
    any number of sessions, and on one node as many ranks in all as one session may
    have there)."""

    #: the name of the session a notebook's cells start when they name none
    default_name = DEFAULT_SESSION
    #: the session a notebook used before this process started ("": none; a server's
    #: notebook kernel hears it from the server, `ServerSessions.last_used`)
    last_used = ""

    def __init__(
        self,
        timeouts: SessionTimeouts | None = None,
        defaults: SessionDefaults | None = None,
        launchers: LauncherFactory = launcher_for,
        limits: SessionLimits | None = None,
    ) -> None:
        self.defaults = defaults or SessionDefaults()
        self.limits = limits or SessionLimits()
        self.launchers = launchers  # how each session starts its nodes' agents
        self.where = "this process"
        self.sessions: dict[str, Session] = {}
        #: sessions between their `check_room` and the end of their start, by name
        self.starting: dict[str, SessionSpec] = {}
        #: the start of each session in ``starting`` that got as far as starting
        self._starts: dict[str, asyncio.Task[None]] = {}
        #: why starts are refused and stopped now ("": they are not): `close`
        self._closing = ""
        #: why the starts `shutdown_all` or `close` stopped were stopped, for their callers
        self._stopped_starts: dict[asyncio.Task[None], str] = {}
        self.timeouts = timeouts or SessionTimeouts()
        self._locks: dict[str, asyncio.Lock] = {}
        self._watchers: set[asyncio.Queue[ManagerEvent]] = set()
        self._listeners: list[Callable[[ManagerEvent], None]] = []
        #: kernel id -> how many event streams that notebook kernel holds open
        self.clients: Counter[str] = Counter()
        #: per notebook: the session it last used, what became of its sessions
        self.paths = NotebookPaths()

    # -- change events, for UIs ------------------------------------------------------
    def subscribe(self, maxsize: int = 1000) -> asyncio.Queue[ManagerEvent]:
        """A queue receiving ``{"type": "session", "session": status}`` on every change,
        ``{"type": "removed", "name": ...}`` when a session goes away and
        ``{"type": "progress", "name": ..., "text": ...}`` while one starts."""
        queue: asyncio.Queue[ManagerEvent] = asyncio.Queue(maxsize)
        self._watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[ManagerEvent]) -> None:
        self._watchers.discard(queue)

    def add_listener(self, listener: Callable[[ManagerEvent], None]) -> None:
        """Call ``listener`` with each event `subscribe` queues, as it happens (for the
        server's session record, which must never lag behind a start or stop)."""
        self._listeners.append(listener)

    def _publish(self, event: ManagerEvent) -> None:
        for listener in self._listeners:
            listener(event)
        for queue in self._watchers:
            if queue.full():  # a slow reader loses the oldest news, never blocks us
                queue.get_nowait()
            queue.put_nowait(event)

    def _session_changed(self, session: RankGroup) -> None:
        if (self._watchers or self._listeners) and isinstance(session, Session):
            self._publish({"type": "session", "session": session.status()})

    def names(self) -> list[str]:
        return sorted(self.sessions)

    def get(self, name: str) -> Session:
        session = self.sessions.get(name)
        if session is None or session.state == SessionState.STOPPED:
            running = ", ".join(self.names()) or "none"
            raise UnknownSession(
                f"no session named {name!r} (running: {running}); a %%distributed cell starts one"
            )
        return session

    def _progress(self, name: str, progress: Progress) -> Progress:
        """``progress`` that also tells the watchers (a notebook waiting on the server)."""

        def report(text: str) -> None:
            progress(text)
            if self._watchers:
                self._publish({"type": "progress", "name": name, "text": text})

        return report

    async def find(self, name: str, use: bool = False) -> Session:
        """Session ``name`` (``use``: a notebook uses it from now on; in-process sessions
        have one notebook, so nothing more is done)."""
        return self.get(name)

    def is_running(self, name: str) -> bool:
        return self._running(name) is not None

    def belongs_to(self, name: str) -> str:
        """The notebook that started session ``name`` when it is another than the one
        asking: "" here, where every session is this process's (a server's notebook kernel
        asks the server, `ServerSessions.belongs_to`)."""
        return ""

    async def list_status(self) -> list[SessionStatus]:
        return self.status()

    async def restart(self, name: str, progress: Progress = lambda _: None) -> Session:
        session = self.get(name)
        await session.restart(self._progress(name, progress))
        return session

    async def get_or_start(
        self,
        name: str,
        request: ShapeRequest,
        progress: Progress = lambda _: None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        notebook: Sender | None = None,
    ) -> tuple[Session, bool]:
        """The session ``name``, started with ``request`` if it does not exist; its ranks
        run in ``cwd`` (default: this process's folder) with ``env`` on top of their node's
        environment. The session's knobs (OMP_NUM_THREADS, GLOO_SOCKET_IFNAME, ...) are
        read from ``env``, then from this process's environment. ``notebook``: the
        notebook that asks (under a server), whose session it is if it starts now: the
        sidebar and the notebooks that join it say so, and the notebook's next kernels
        find it by the notebook's file, whatever it is renamed to.

        Returns the session and whether it was started now.
        """
        progress = self._progress(name, progress)
        request = self.defaults.apply(request)
        rank_vars = dict(env or {})
        knobs = {**os.environ, **rank_vars}
        if self.defaults.master_ports and PORTS_VAR not in knobs:
            knobs[PORTS_VAR] = self.defaults.master_ports
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            self._check_open(name)
            session = self.sessions.get(name)
            if session is not None and session.state != SessionState.STOPPED:
                check_same_shape(session.spec, request)
                return session, False
            here = socket.gethostname()
            spec = resolve_shape(
                name, request, len(discover_gpus()), here, self.defaults.max_ranks_per_node
            )
            running = {
                n: s.spec
                for n, s in self.sessions.items()
                if n != name and s.state != SessionState.STOPPED
            }
            node_max = self.defaults.max_ranks_per_node or max_ranks_per_node()
            check_room(spec, running, self.starting, self.limits, node_max, here)
            self.starting[name] = spec  # at once: a start beside this one counts it
            try:
                session = Session(
                    spec,
                    timeouts=self.timeouts,
                    cwd=cwd,
                    env=knobs,
                    launchers=self.launchers,
                    rank_vars=rank_vars,
                )
                session.on_change = self._session_changed
                if notebook is not None:
                    session.notebook, session.notebook_id = notebook.path, notebook.file_id
                    self.paths.lost.pop(notebook.notebook, None)  # its successor: said
                progress(f"starting session {name!r}: {spec.describe()}")
                await self._start(session, progress)
                self.sessions[name] = session
            finally:
                del self.starting[name]
            return session, True

    def _check_open(self, name: str) -> None:
        if self._closing:
            raise SessionError(f"session {name!r} cannot start: {self._closing}")

    async def _start(self, session: Session, progress: Progress) -> None:
        """``session.start`` as a task `shutdown_all` can stop; a start it stopped raises
        `SessionError` saying why (one whose caller was cancelled stays cancelled)."""
        start = asyncio.ensure_future(session.start(progress))
        self._starts[session.name] = start
        try:
            await start  # a cancelled caller cancels the start with it
        except asyncio.CancelledError:
            why = self._stopped_starts.pop(start, None)
            if why is None:  # the caller was cancelled, not the start alone
                raise
            raise SessionError(
                f"session {session.name!r} did not start: {why}; nothing of it is left"
            ) from None
        finally:
            self._starts.pop(session.name, None)
            self._stopped_starts.pop(start, None)

    async def interrupt(self, name: str, ranks: Sequence[int] | None = None) -> None:
        await self.get(name).interrupt(ranks)

    async def heal(
        self,
        name: str,
        ranks: Sequence[int] = (),
        spares: Sequence[HostSpec] = (),
        auto: bool | None = None,
        now: bool = True,
        progress: Progress = lambda _: None,
        new_group: str = "",
    ) -> str:
        """Heal session ``name`` (`Session.heal`, ``ranks`` replaced too) after taking
        ``spares`` (hosts a lost node may move to) and ``auto`` (heal lost nodes before the
        next cell without being asked); with ``now`` False only those are taken."""
        session = self.get(name)
        if spares:
            session.spares = tuple(dict.fromkeys([*session.spares, *spares]))
        if auto is not None:
            session.recovery.auto_heal = auto
        if not now:
            return ""
        return await session.heal(ranks, self._progress(name, progress), new_group)

    async def resize(
        self,
        name: str,
        counts: Sequence[int],
        spares: Sequence[HostSpec] = (),
        progress: Progress = lambda _: None,
    ) -> str:
        """Give session ``name`` ``counts`` ranks per node (`Session.resize`)."""
        session = self.get(name)
        if spares:
            session.spares = tuple(dict.fromkeys([*session.spares, *spares]))
        limit = self.defaults.max_ranks_per_node or max_ranks_per_node()
        if max(counts) > limit:
            raise SpecError(
                f"resize: {max(counts)} ranks on a node, over the limit of {limit} a node"
            )
        return await session.resize(counts, self._progress(name, progress))

    async def shutdown(self, name: str, why: str = "") -> None:
        """Stop session ``name``; ``why`` (who asked, what is lost) is kept for the
        notebook it is named after, whose next kernel says it."""
        session = self.get(name)
        try:
            await session.shutdown()
        finally:
            self.sessions.pop(name, None)
            if session.notebook:
                when = time.strftime("%H:%M:%S")
                self.paths.note_lost(
                    session.notebook_id or session.notebook,
                    f"{why or f'session {name!r} was shut down'} (at {when})",
                )
            self._publish({"type": "removed", "name": name})

    async def shutdown_all(self) -> None:
        """Stop every session, those still starting too."""
        await self._stop_all("every session was shut down")

    async def _stop_all(self, why: str) -> list[str]:
        """Stop every session, those still starting too (their starts are cancelled, which
        undoes what they made; their callers hear ``why``); the names of the starts
        stopped."""
        starts = [(name, start) for name, start in self._starts.items() if not start.done()]
        for name, start in starts:
            log.info("session %s: its start is stopped: %s", name, why)
            self._stopped_starts[start] = why
            start.cancel()
        sessions = list(self.sessions.values())
        self.sessions.clear()
        for session in sessions:
            self._publish({"type": "removed", "name": session.name})
        await asyncio.gather(
            *(start for _, start in starts),
            *(s.shutdown() for s in sessions),
            return_exceptions=True,
        )
        return [name for name, _ in starts]

    async def close(self, why: str) -> list[str]:
        """The owner stops: every session stops, those starting too, and none starts
        from now on (a start asked meanwhile is refused saying ``why``); the names of the
        starts stopped."""
        self._closing = why
        return await self._stop_all(why)

    # -- who uses the sessions (notebook kernels attached under a server) --------------
    def attach(self, name: str, sender: Sender) -> None:
        """``sender``'s notebook uses session ``name`` (a turn on its ranks, or
        ``%dist attach``): it is listed as using it, and it is the session the notebook
        last used."""
        session = self.get(name)
        if sender.kernel_id:
            self.paths.note_used(sender.notebook, name)
        if sender.kernel_id and sender.kernel_id not in session.notebooks:
            session.notebooks[sender.kernel_id] = {**sender.to_json(), "since": time.time()}
            self._session_changed(session)

    def client_came(self, kernel_id: str) -> None:
        self.clients[kernel_id] += 1

    async def client_left(self, kernel_id: str) -> None:
        """A notebook kernel's event stream closed; when it was its last one the kernel
        is gone (it died, or was restarted): its waiting requests are withdrawn, its
        running cell interrupted, and the others told."""
        self.clients[kernel_id] -= 1
        if self.clients[kernel_id] > 0:
            return
        del self.clients[kernel_id]
        await self.forget_sender(kernel_id)

    async def forget_sender(self, kernel_id: str) -> None:
        """Notebook kernel ``kernel_id`` is gone: its waiting requests are withdrawn, its
        running cell interrupted, the others told, and it is no longer listed."""
        for session in list(self.sessions.values()):
            left = session.notebooks.pop(kernel_id, None)
            running, _withdrawn = session.turns.drop_sender(kernel_id)
            if running is not None:
                self.tell(
                    session.name,
                    "sender-gone",
                    running.sender,
                    f"the cell from {running.sender.label} in session {session.name!r} was "
                    "interrupted: its notebook's kernel went away",
                )
                if session.state == SessionState.READY:
                    await session.interrupt(list(running.ranks) or None)
            if left is not None:
                self._session_changed(session)

    async def prune_senders(self, alive: Callable[[str], bool], stream_grace: float) -> None:
        """Forget the notebook kernels that are not ``alive`` (whatever event streams name
        them), and stop listing as attached those without an event stream for more than
        ``stream_grace`` seconds since they attached."""
        named = set(self.clients)
        for session in self.sessions.values():
            named.update(session.notebooks)
            turns = [session.turns.running, *session.turns.waiting]
            named.update(t.sender.kernel_id for t in turns if t is not None)
        named.discard("")
        for kernel_id in sorted(k for k in named if not alive(k)):
            self.clients.pop(kernel_id, None)
            await self.forget_sender(kernel_id)
        now = time.time()
        for session in list(self.sessions.values()):
            quiet = [
                k
                for k, entry in session.notebooks.items()
                if k not in self.clients and now - entry["since"] > stream_grace
            ]
            for kernel_id in quiet:
                del session.notebooks[kernel_id]
            if quiet:
                self._session_changed(session)

    # -- notebooks renamed, and the notebook a kernel runs -----------------------------
    def notebook_renamed(self, old: str, new: str) -> None:
        """Notebook (or folder) ``old`` is ``new`` now: every session, notebook listed as
        attached and queued request that names it names the new path, at once (a cell
        running meanwhile goes on: a session keeps its name). A file that gets the old
        name later is another notebook (`notebook_session`)."""
        self.paths.rename(old, new)
        old, new = old.strip("/"), new.strip("/")
        for session in self.sessions.values():
            changed = False
            now = moved(session.notebook, old, new)
            if now is not None:
                session.notebook, changed = now, True
            for entry in session.notebooks.values():
                now = moved(entry["path"], old, new)
                if now is not None:
                    entry["path"], changed = now, True
            for turn in [session.turns.running, *session.turns.waiting]:
                now = None if turn is None else moved(turn.sender.path, old, new)
                if turn is not None and now is not None:
                    turn.sender, changed = dataclasses.replace(turn.sender, path=now), True
            if changed:
                self._session_changed(session)

    def _belongs(self, session: Session, notebook: Sender) -> bool:
        """Whether ``notebook`` started ``session`` (the same file; by path where either
        has no file id)."""
        if session.notebook_id and notebook.file_id:
            return session.notebook_id == notebook.file_id
        return bool(session.notebook) and session.notebook == notebook.path

    def _running(self, name: str) -> Session | None:
        session = self.sessions.get(name)
        return session if session is not None and session.state != SessionState.STOPPED else None

    def notebook_session(self, notebook: Sender) -> tuple[Session | None, str]:
        """The session ``notebook`` last used, else one it started, if one runs; else what
        became of the last one it started ("" if nothing is known)."""
        if not notebook.notebook:
            return None, ""
        used = self._running(self.paths.last_used.get(notebook.notebook, ""))
        if used is not None:
            return used, ""
        for name in self.names():
            session = self.sessions[name]
            if session.state != SessionState.STOPPED and self._belongs(session, notebook):
                return session, ""
        return None, self.paths.lost.get(notebook.notebook, "")

    def name_for(self, notebook: Sender, name: str) -> str:
        """``name`` (the one made from the notebook's path), or, when a session of another
        notebook holds it (a renamed notebook keeps its session's name, and a new file may
        get its old name), the first of ``name-2``, ``name-3``, ... that none holds."""
        number = 1
        candidate = name
        while number <= len(self.sessions) + len(self.starting) + 1:
            held = self._running(candidate)
            if (held is None and candidate not in self.starting) or (
                held is not None and self._belongs(held, notebook)
            ):
                return candidate
            number += 1
            candidate = numbered(name, number)
        return candidate

    def tell(self, name: str, action: str, by: Sender, text: str) -> None:
        """Tell every notebook attached to session ``name`` (and the sidebar)."""
        self._publish(
            {"type": "notice", "name": name, "action": action, "by": by.to_json(), "text": text}
        )

    def tell_action(self, name: str, action: str, by: Sender) -> str:
        """Before ``action`` (interrupt, restart, shutdown) is done to session ``name``
        on ``by``'s request: say who asked, and what is lost (returns what was said)."""
        session = self.get(name)
        running = session.turns.running
        if action == "interrupt":
            text = f"session {name!r} was interrupted from {by.label}"
            if running is not None:
                text += (
                    f": the {running.kind} from {running.sender.label} was interrupted; "
                    "what each rank did follows"
                )
        elif action == "restart":
            text = f"session {name!r} was restarted from {by.label}; its variables are gone"
        else:
            text = f"session {name!r} was shut down from {by.label}; its variables are gone"
        self.tell(name, action, by, text)
        return text

    def status(self) -> list[SessionStatus]:
        return [self.sessions[n].status() for n in self.names()]
