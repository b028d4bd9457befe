"""The ``ssh`` launcher: the agent runs on another machine, reached with asyncssh.

Host keys are always verified, jump hosts' too, against the known_hosts files the ssh config
names (``~/.ssh/known_hosts`` or ``UserKnownHostsFile``, plus ``GlobalKnownHostsFile``); a
config that leaves none (``UserKnownHostsFile none``, which asyncssh reads as "check
nothing") refuses every key. The SSH agent is never forwarded, nor GSSAPI credentials
delegated, whatever the config says. Hosts, users, ports, keys and jump hosts resolve
through the ssh config like ``ssh`` does. Rank kernels listen on Unix sockets on their
node; the notebook side reaches them through forwarded Unix sockets in a private local
folder, so no kernel port is ever open to the network. When the SSH connection drops, the
agent's stdin closes and it kills every rank it started.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, ClassVar

import asyncssh

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.control.launchers.base import (
    AGENT_MODULE,
    AgentStreams,
    Launcher,
    with_install_hint,
)
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)
KERNEL_CHANNELS = ("shell_port", "iopub_port", "control_port", "stdin_port", "hb_port")


#: ssh's own default for UserKnownHostsFile (ssh also reads ``~/.ssh/known_hosts2``)
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def user_known_hosts(configured: object) -> str:
    """The known_hosts file a user would add a key to: the config's first one (unless it
    is ``/dev/null``), or ssh's default."""
    if isinstance(configured, list) and configured and configured[0] != os.devnull:
        return str(configured[0])
    return DEFAULT_KNOWN_HOSTS


def usable_known_hosts(path: str) -> bool:
    """A readable regular file: not ``/dev/null``, not missing (ssh reads those as empty)."""
    full = os.path.expanduser(path)
    return os.path.isfile(full) and os.access(full, os.R_OK)


def known_hosts_files(user: object, global_: object) -> list[str]:
    """The known_hosts files to check a host key against, from the ssh config's
    ``UserKnownHostsFile`` and ``GlobalKnownHostsFile`` values (a list of paths, ``[]`` for
    ``none``, None when unset): as ssh reads them, keeping only files that can hold a key.

    asyncssh alone would check nothing at all for ``UserKnownHostsFile none``, and fail
    with a bare OSError on a file that does not exist; an empty answer here means the
    connection must be refused.
    """
    paths: list[str] = []
    if user is None:
        paths.append(DEFAULT_KNOWN_HOSTS)
    elif isinstance(user, list):
        paths.extend(str(p) for p in user)
    if isinstance(global_, list):
        paths.extend(str(p) for p in global_)
    return [os.path.expanduser(p) for p in paths if usable_known_hosts(p)]


def trust_no_key(_host: str, _addr: str, _port: int | None) -> tuple[list[str], ...]:
    """A known_hosts lookup that finds nothing: every host key is refused."""
    return [], [], []


def unknown_key_message(where: str, problem: str, host: str, port: object, add_to: str) -> str:
    """Why the connection was refused, and how to add the host's key to ``add_to``."""
    keyscan = f"ssh-keyscan -H{f' -p {port}' if port not in (22, None, ()) else ''} {host}"
    return (
        f"{where}: {problem}, so the connection was refused (host keys are always checked, "
        f"whatever StrictHostKeyChecking says). Check the key, then add it to known_hosts, "
        f"e.g. `{keyscan} >> {add_to}`"
    )


#: SSH keepalive when the ssh config sets no ServerAliveInterval: a request every this
#: many seconds, and the connection is closed after `KEEPALIVE_COUNT_MAX` unanswered
KEEPALIVE_INTERVAL_S = 5.0
KEEPALIVE_COUNT_MAX = 3
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def agent_command(session: str, env: Mapping[str, str], python: str | None) -> str:
    """The remote shell line: the notebook's interpreter path if the node has it (shared
    file systems, identical images), else ``python3`` from the remote PATH. Variable
    names must be names: anything else is refused, not quoted into the shell line."""
    bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
    if bad:
        raise AgentError(
            f"environment variable name {bad[0][:60]!r}: expected letters, digits and _ "
            "(not starting with a digit)"
        )
    assigns = " ".join(f"{shlex.quote(k)}={shlex.quote(v)}" for k, v in env.items())
    chosen = shlex.quote(python or sys.executable)
    pick = f"p={chosen}" if python else f'p={chosen}; [ -x "$p" ] || p=python3'
    return f'{pick}; exec env {assigns} "$p" -m {AGENT_MODULE} --session {shlex.quote(session)}'


class LinkWatch(asyncssh.SSHClient):
    """Remembers how the SSH connection to a node ended."""

    def __init__(self) -> None:
        self.closed = False
        self.error: Exception | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc


class SSHLauncher(Launcher):
    """Starts one node's agent over SSH."""

    kind: ClassVar[str] = "ssh"

    def __init__(
        self,
        host: HostSpec,
        python: str | None = None,
        ssh_config: str | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        self.spec = host
        self.python = host.python or python  # the hostfile's word for this node wins
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout
        self.conn: asyncssh.SSHClientConnection | None = None
        self.process: asyncssh.SSHClientProcess[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[asyncssh.SSHListener] = []
        self._tunnel_dir: str | None = None
        self._relays: dict[str, str] = {}  # the node's relay socket -> its local end
        self.link = LinkWatch()

    @property
    def host(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return str(self.spec)

    async def connect(self) -> asyncssh.SSHClientConnection:
        """An SSH connection to the node, host key verified, with errors that say what to do."""
        where = f"node {str(self.spec)!r}"
        try:
            return await asyncio.wait_for(
                self._connect(
                    self.spec.name, self.spec.port, self.spec.user, where, client=self.link
                ),
                self.connect_timeout,
            )
        except asyncssh.PermissionDenied:
            raise AgentError(
                f"{where}: SSH login refused; check the user and that your key is loaded "
                "(ssh-agent) or named by IdentityFile in ~/.ssh/config"
            ) from None
        except asyncio.TimeoutError:
            raise AgentError(
                f"{where}: no SSH answer within {self.connect_timeout:.0f} s"
            ) from None
        except (OSError, asyncssh.Error) as err:
            raise AgentError(f"{where}: cannot connect over SSH: {err}") from None

    async def _connect(
        self,
        host: str,
        port: int | None,
        user: str | None,
        where: str,
        tunnel: asyncssh.SSHClientConnection | None = None,
        client: asyncssh.SSHClient | None = None,
    ) -> asyncssh.SSHClientConnection:
        """One SSH connection, through ``tunnel`` or the config's jump hosts, each of them
        with its host key checked against the known_hosts files the config names, and no
        agent or credentials forwarded, whatever the config says. Keepalive requests go
        out unless the config sets ServerAliveInterval, so that a link lost without a
        reset closes the connection; ``client`` hears how the connection ends."""
        kwargs: dict[str, Any] = {}
        if port:
            kwargs["port"] = port
        if user:
            kwargs["username"] = user
        if self.ssh_config:
            kwargs["config"] = [os.path.expanduser(self.ssh_config)]
        try:
            options = await asyncssh.SSHClientConnectionOptions.construct(host=host, **kwargs)
            jumps = options.tunnel if tunnel is None else None
            if isinstance(jumps, str):  # ProxyJump: each hop is opened (and checked) here
                for hop in jumps.split(","):
                    hop_user, _, hop_host = hop.rpartition("@")
                    hop_host, colon, hop_port = hop_host.rpartition(":")
                    if not colon:
                        hop_host, hop_port = hop_port, ""
                    elif not hop_port.isdigit():
                        raise AgentError(
                            f"{where}: ProxyJump {jumps!r}: the port of {hop!r} is "
                            f"{hop_port!r}, not a number (expected [user@]host[:port],...)"
                        )
                    tunnel = await self._connect(
                        hop_host,
                        int(hop_port) if hop_port else None,
                        hop_user or None,
                        f"{where}: jump host {hop_host!r}",
                        tunnel,
                    )
            user_files = options.config.get("UserKnownHostsFile", None)
            files = known_hosts_files(user_files, options.config.get("GlobalKnownHostsFile", None))
            add_to = user_known_hosts(user_files)
            if tunnel is not None:
                kwargs["tunnel"] = tunnel
            if options.config.get("ServerAliveInterval", None) is None:
                kwargs["keepalive_interval"] = KEEPALIVE_INTERVAL_S
                if options.config.get("ServerAliveCountMax", None) is None:
                    kwargs["keepalive_count_max"] = KEEPALIVE_COUNT_MAX
            if client is not None:
                kwargs["client_factory"] = lambda: client
            try:
                conn = await asyncssh.connect(
                    host,
                    # no file: trust no key (asyncssh would check nothing, or fall back to
                    # ~/.ssh/known_hosts), so that the connection still fails as it would
                    known_hosts=files or trust_no_key,
                    agent_forwarding=False,  # a rank node gets no use of the user's keys
                    gss_delegate_creds=False,
                    **kwargs,
                )
            except asyncssh.HostKeyNotVerifiable as err:
                if files:
                    problem = f"its SSH host key is unknown or has changed ({err.reason})"
                    how = " or connect once with `ssh`"
                else:
                    problem = (
                        "its SSH host key cannot be checked: the ssh config leaves no "
                        "known_hosts file to check it against (UserKnownHostsFile none, "
                        "/dev/null or a file that does not exist)"
                    )
                    how = ", and make UserKnownHostsFile name that file (or leave it out)"
                raise AgentError(
                    unknown_key_message(where, problem, options.host, options.port, add_to) + how
                ) from None
        except BaseException:
            if tunnel is not None:  # the jump hosts' connections are this one's to close
                tunnel.close()
            raise
        if tunnel is not None:
            conn.set_tunnel(tunnel)  # closed with this connection
        return conn

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        self.conn = await self.connect()
        command = agent_command(session, env, self.python)
        log.debug("node %s: starting agent: %s", self.spec, command)
        self.process = await self.conn.create_process(command, encoding=None)
        self._tasks.append(asyncio.ensure_future(self._drain_stderr()))
        return AgentStreams(self.process.stdout, self.process.stdin)

    async def _drain_stderr(self) -> None:
        assert self.process is not None
        while line := await self.process.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self._stderr.append(text)
            log.debug("node %s agent stderr: %s", self.spec, text)

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
            return f"the SSH connection to the node was lost{why}"
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

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": str(self.spec), "python": self.python}
