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
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import asyncssh

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.control.launchers.base import AGENT_MODULE, AgentStreams
from jupyter_dist.control.launchers.ssh_channel import AgentOverSSH
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)


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


class SSHLauncher(AgentOverSSH):
    """Starts one node's agent over SSH."""

    kind: ClassVar[str] = "ssh"

    def __init__(
        self,
        host: HostSpec,
        python: str | None = None,
        ssh_config: str | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        super().__init__()
        self.spec = host
        self.python = host.python or python  # the hostfile's word for this node wins
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout

    @property
    def host(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return str(self.spec)

    async def connect(self) -> asyncssh.SSHClientConnection:
        """An SSH connection to the node, host key verified, with errors that say what to do."""
        where = f"node {str(self.spec)!r}"
        began = time.monotonic()
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
        except asyncio.TimeoutError:  # this limit, or the ssh config's ConnectTimeout
            waited = time.monotonic() - began
            raise AgentError(f"{where}: no SSH answer within {waited:.0f} s") from None
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
        return await self.run_agent(session, env)

    def agent_request(self, session: str, env: Mapping[str, str]) -> str:
        return agent_command(session, env, self.python)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": str(self.spec), "python": self.python}
