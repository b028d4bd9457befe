"""A node's agent driven over one SSH connection, whoever opened it: the agent runs as the
connection's process, its stdio is the agent protocol, and its rank and relay sockets are
forwarded to a private local folder.

`SSHLauncher` (``ssh.py``) connects to the node's sshd; `DialBackLauncher`
(``dial_back.py``) is handed the connection a node opened to this side. Both are an
`AgentOverSSH`: once a launcher has its connection, running the agent, tunnelling its
sockets, telling how it ended and stopping it are done here.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping
from typing import Any

import asyncssh

from jupyter_dist.control.launchers.base import AgentStreams, Launcher, with_install_hint
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)
KERNEL_CHANNELS = ("shell_port", "iopub_port", "control_port", "stdin_port", "hb_port")


class LinkWatch(asyncssh.SSHClient):
    """Remembers how the SSH connection to a node ended."""

    def __init__(self) -> None:
        self.closed = False
        self.error: Exception | None = None
        self.peer = "?"  # the other end's address and port

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        peer = conn.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc


class AgentOverSSH(Launcher):
    """The part of a launcher that drives an agent over an SSH connection it holds."""

    #: what the end of the connection is called in messages
    link_name = "the SSH connection to the node"

    def __init__(self) -> None:
        self.conn: asyncssh.SSHClientConnection | None = None
        self.process: asyncssh.SSHClientProcess[bytes] | None = None
        self.link = LinkWatch()
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[asyncssh.SSHListener] = []
        self._tunnel_dir: str | None = None
        self._relays: dict[str, str] = {}  # the node's relay socket -> its local end

    @abc.abstractmethod
    def agent_request(self, session: str, env: Mapping[str, str]) -> str:
        """The exec request that starts the agent on the node."""

    async def run_agent(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        """Start the agent on `conn` (made by the subclass's ``start``)."""
        assert self.conn is not None
        command = self.agent_request(session, env)
        log.debug("node %s: starting agent: %s", self.host, command)
        self.process = await self.conn.create_process(command, encoding=None)
        self._tasks.append(asyncio.ensure_future(self._drain_stderr()))
        return AgentStreams(self.process.stdout, self.process.stdin)

    async def _drain_stderr(self) -> None:
        assert self.process is not None
        while line := await self.process.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self._stderr.append(text)
            log.debug("node %s agent stderr: %s", self.host, text)

    def stderr_tail(self) -> str:
        return with_install_hint("\n".join(self._stderr))

    def peer_address(self) -> str | None:
        if self.conn is None:
            return None
        peer = self.conn.get_extra_info("peername")
        return str(peer[0]) if peer else None

    async def tunnel(self, rank: int, connection: Mapping[str, Any]) -> dict[str, Any]:
        """Forward a rank kernel's Unix sockets to a private local folder."""
        if self.conn is None:
            raise AgentError(f"node {self.host!r}: not connected")
        if connection.get("transport") != "ipc":
            raise AgentError(f"node {self.host!r}: rank {rank} does not listen on Unix sockets")
        if self._tunnel_dir is None:
            self._tunnel_dir = tempfile.mkdtemp(prefix="jd-ssh-")
        local = os.path.join(self._tunnel_dir, f"r{rank}")
        remote = str(connection["ip"])
        for key in KERNEL_CHANNELS:
            port = connection[key]
            path = f"{local}-{port}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # left by this rank's previous life (restart)
            await self._forward(path, f"{remote}-{port}")
        tunnelled = {**connection, "ip": local}
        for key in ("relay_iopub", "relay_shell"):
            relay = connection.get(key)
            if relay:  # the node's relay: one forwarded socket for all its ranks
                if relay not in self._relays:
                    path = os.path.join(self._tunnel_dir, f"relay-{len(self._relays)}")
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    await self._forward(path, str(relay))
                    self._relays[str(relay)] = path
                tunnelled[key] = self._relays[str(relay)]
        return tunnelled

    async def _forward(self, path: str, remote: str) -> None:
        assert self.conn is not None
        listener = await self.conn.forward_local_path(path, remote)
        self._listeners.append(listener)
        os.chmod(path, 0o600)  # owner only, in an owner-only folder

    async def signal(self, signum: int) -> None:
        if self.process is not None:
            with contextlib.suppress(Exception):
                self.process.send_signal(signal.Signals(signum).name.removeprefix("SIG"))

    def alive(self) -> bool:
        return self.process is not None and self.process.exit_status is None

    def link_lost(self) -> bool:
        return self.link.closed

    async def describe_exit(self) -> str:
        if self.process is None:
            return "the agent was never started"
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.process.wait_closed(), 1.0)
        if self.link.closed:
            why = f" ({self.link.error})" if self.link.error else ""
            return f"{self.link_name} was lost{why}"
        status, sig = self.process.exit_status, self.process.exit_signal
        if sig:
            return f"the agent was killed by signal SIG{sig[0]}"
        if status is not None and status >= 0:
            return f"the agent exited (exit code {status})"
        return "the agent exited"

    async def stop(self, timeout: float = 5.0) -> None:
        if self.process is not None:
            with contextlib.suppress(Exception):
                self.process.stdin.write_eof()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(self.process.wait_closed(), timeout)
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        if self.conn is not None:
            self.conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.wait_closed(), timeout)
        for task in self._tasks:
            task.cancel()
        if self._tunnel_dir:
            shutil.rmtree(self._tunnel_dir, ignore_errors=True)
            self._tunnel_dir = None
        self._relays.clear()
