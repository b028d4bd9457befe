"""The ``dial_back`` launcher: nodes connect to this side, which then drives them over SSH.

For clusters where this side cannot reach a node's sshd (Ray actors, Kubernetes pods), each
node runs one small process, ``python -m jupyter_dist.node.dial_back HOST:PORT`` (see
`node_command`), that makes the TCP connection to a `DialBackListener` here and runs an SSH
*server* over it (asyncssh's reverse direction). From then on this side is the SSH client,
exactly as with `SSHLauncher`: it runs the agent as the connection's process, speaks the
agent protocol on its stdio and forwards the rank and relay sockets (`AgentOverSSH`).

Every session's listener makes fresh keys: one client key pair for this side and one host
key pair per node. A node accepts only the session's client key, and this side accepts
only the host keys it made, which also say which node dialled in (node N holds host key
N). Everything on the link is SSH: encrypted, authenticated, and nothing runs before both
keys are proven. A node's private keys travel to it in a credentials file (mode 0600) or
on its stdin, never on a command line. A connection that ends is what a closed stdin is to
the agent: it kills its ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import socket
from collections.abc import Mapping
from typing import Any, ClassVar

import asyncssh

from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers.base import AgentStreams
from jupyter_dist.control.launchers.ssh_channel import AgentOverSSH, LinkWatch
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)

#: the node side's module: ``python -m jupyter_dist.node.dial_back HOST:PORT``
NODE_MODULE = "jupyter_dist.node.dial_back"
#: the SSH user name this side logs in as (the node's server ignores it)
USER = "jupyter-dist"
KEY_ALGORITHM = "ssh-ed25519"
#: SSH keepalive: a request every this many seconds; the connection is closed after
#: `KEEPALIVE_COUNT_MAX` unanswered
KEEPALIVE_INTERVAL_S = 5.0
KEEPALIVE_COUNT_MAX = 3
#: the most nodes one listener serves
MAX_NODES = 4096


class DialBackListener:
    """One session's listener: the keys, the TCP port nodes dial, and the connections
    waiting for their node's launcher.

    ``host``/``port``: where to listen (``""``: every interface; port 0: a free one, see
    `address`); ``advertise``: the name or address nodes are told to dial, when it is not
    ``host`` (default: ``host``, else this machine's hostname).
    """

    def __init__(
        self,
        nodes: int,
        host: str = "",
        port: int = 0,
        advertise: str | None = None,
        connect_timeout: float = 120.0,
    ) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise AgentError(f"dial-back: {nodes} nodes, expected 1 to {MAX_NODES}")
        self.nodes = nodes
        self.host = host
        self.port = port
        self.advertise = advertise
        self.connect_timeout = connect_timeout
        self.client_key = asyncssh.generate_private_key(KEY_ALGORITHM)
        self.host_keys = [asyncssh.generate_private_key(KEY_ALGORITHM) for _ in range(nodes)]
        self._node_of = {k.public_data: n for n, k in enumerate(self.host_keys)}
        self._arrived: list[asyncio.Queue[asyncssh.SSHClientConnection]] = [
            asyncio.Queue() for _ in range(nodes)
        ]
        self._server: asyncssh.SSHAcceptor | None = None
        #: connections refused, for tests and logs: a line each, without key material
        self.refused: list[str] = []

    async def start(self) -> None:
        """Listen; nodes may dial from now on."""
        self._server = await asyncssh.listen_reverse(
            self.host,
            self.port,
            acceptor=self._accepted,
            error_handler=self._failed,
            client_factory=LinkWatch,
            known_hosts=self._trusted,  # asked on each connection: `renew` takes effect
            client_keys=[self.client_key],
            username=USER,
            config=[],
            agent_path=None,
            agent_forwarding=False,
            gss_host=None,
            password=None,
            preferred_auth="publickey",
            keepalive_interval=KEEPALIVE_INTERVAL_S,
            keepalive_count_max=KEEPALIVE_COUNT_MAX,
            login_timeout=30.0,
        )
        self.port = self._server.get_port()
        log.info("dial-back listener for %d nodes on %s", self.nodes, self.address)

    @property
    def address(self) -> str:
        """``HOST:PORT`` the nodes dial."""
        host = self.advertise or self.host or socket.gethostname()
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def credentials(self, node: int) -> str:
        """What node ``node`` must be handed, in secret: its host key and the client key
        it accepts (JSON text; a file of mode 0600 or the node process's stdin)."""
        self._check_node(node)
        return json.dumps(
            {
                "node": node,
                "host_key": self.host_keys[node].export_private_key().decode(),
                "client_key": self.client_key.export_public_key().decode(),
            }
        )

    def renew(self, node: int) -> None:
        """Fresh credentials for node ``node`` (a new host key; `credentials` hands it out)
        for the machine that takes a lost node's place: the lost one, should it dial again
        with the old key, is refused, and a connection of it still waiting is closed."""
        self._check_node(node)
        del self._node_of[self.host_keys[node].public_data]
        self.host_keys[node] = asyncssh.generate_private_key(KEY_ALGORITHM)
        self._node_of[self.host_keys[node].public_data] = node
        queue = self._arrived[node]
        while not queue.empty():
            queue.get_nowait().close()

    def resize(self, nodes: int) -> None:
        """Serve ``nodes`` nodes from now on (the session was resized): each new node gets
        a host key of its own; the keys of the nodes past ``nodes`` are forgotten, so that
        such a node, dialling again, is refused, and its connections still waiting close."""
        if not 1 <= nodes <= MAX_NODES:
            raise AgentError(f"dial-back: {nodes} nodes, expected 1 to {MAX_NODES}")
        for node in range(nodes, self.nodes):
            del self._node_of[self.host_keys[node].public_data]
            queue = self._arrived[node]
            while not queue.empty():
                queue.get_nowait().close()
        del self.host_keys[nodes:], self._arrived[nodes:]
        for node in range(self.nodes, nodes):
            key = asyncssh.generate_private_key(KEY_ALGORITHM)
            self.host_keys.append(key)
            self._node_of[key.public_data] = node
            self._arrived.append(asyncio.Queue())
        self.nodes = nodes

    def _trusted(
        self, _host: str, _addr: str, _port: int | None
    ) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
        """The host keys a node may show: the current one of each node."""
        return [k.convert_to_public() for k in self.host_keys], [], []

    def write_credentials(self, node: int, path: str) -> None:
        """`credentials` into a new file ``path`` of mode 0600 (an existing one is refused)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.credentials(node))

    def node_command(self, credentials_path: str = "-", python: str = "python3") -> str:
        """The line to run on a node; with ``-`` its credentials come on stdin."""
        return (
            f"{shlex.quote(python)} -m {NODE_MODULE} {shlex.quote(self.address)} "
            f"--credentials {shlex.quote(credentials_path)}"
        )

    def launcher(self, spec: SessionSpec, node: int) -> DialBackLauncher:
        """The session's launcher of node ``node`` (a `LauncherFactory`)."""
        self._check_node(node)
        return DialBackLauncher(self, node)

    async def connection(self, node: int) -> asyncssh.SSHClientConnection:
        """The next connection of node ``node``, waiting for it up to ``connect_timeout``."""
        self._check_node(node)
        queue = self._arrived[node]
        try:
            while True:
                conn = await asyncio.wait_for(queue.get(), self.connect_timeout)
                if not _link_of(conn).closed:
                    return conn
        except asyncio.TimeoutError:
            raise AgentError(
                f"dial-back node {node}: it did not connect to {self.address} within "
                f"{self.connect_timeout:.0f} s; run on it: {self.node_command()} "
                "(with its credentials on stdin)"
            ) from None

    def _accepted(self, conn: asyncssh.SSHClientConnection) -> None:
        key = conn.get_server_host_key()
        node = self._node_of.get(key.public_data) if key is not None else None
        if node is None:  # known_hosts let it through: cannot happen, but never run on it
            conn.close()
            return
        log.info("dial-back node %d connected from %s", node, _link_of(conn).peer)
        self._arrived[node].put_nowait(conn)

    def _failed(self, conn: asyncssh.SSHClientConnection, exc: Exception) -> None:
        owner = conn.get_owner()
        peer = owner.peer if isinstance(owner, LinkWatch) else "?"
        line = f"{peer}: {type(exc).__name__}: {exc}"
        self.refused.append(line)
        log.warning("dial-back: refused a connection from %s", line)

    def _check_node(self, node: int) -> None:
        if not 0 <= node < self.nodes:
            raise AgentError(f"dial-back node {node}: expected 0 to {self.nodes - 1}")

    async def close(self) -> None:
        """Stop listening and close the connections no launcher took."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for queue in self._arrived:
            while not queue.empty():
                queue.get_nowait().close()


def _link_of(conn: asyncssh.SSHClientConnection) -> LinkWatch:
    owner = conn.get_owner()
    assert isinstance(owner, LinkWatch)
    return owner


class DialBackLauncher(AgentOverSSH):
    """Node ``node`` of a `DialBackListener`'s session: whoever dials in with its key."""

    kind: ClassVar[str] = "dial_back"
    link_name = "the connection the node dialled in on"

    def __init__(self, listener: DialBackListener, node: int) -> None:
        super().__init__()
        self.listener = listener
        self.node = node
        self._address: str | None = None  # as it dialled in; kept once the link is gone

    @property
    def host(self) -> str:
        return self._address or f"dial-back node {self.node}"

    @property
    def label(self) -> str | None:
        """Its address as it dialled in: nodes in containers often share a hostname."""
        return self._address

    def peer_address(self) -> str | None:
        return self._address

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        self.conn = await self.listener.connection(self.node)
        self.link = _link_of(self.conn)
        self._address = super().peer_address()
        return await self.run_agent(session, env)

    def agent_request(self, session: str, env: Mapping[str, str]) -> str:
        """The node runs nothing but the agent: the request names the session and the
        agent's variables, as JSON (`jupyter_dist.node.dial_back` checks both)."""
        return json.dumps({"session": session, "env": dict(env)})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "address": self.listener.address}


__all__ = ["DialBackLauncher", "DialBackListener"]
