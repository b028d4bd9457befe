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

The listener is reachable by anyone who can route to it, so it accepts TCP itself
(``dial_back_door.py``): a bounded number of connections may be proving their keys at
once, fewer from one address, each has `HANDSHAKE_S` to do so, and refusals are counted,
not kept. A node's key lets in one connection at a time. It listens only while a node has
no connection, on one address: the one given, when it is this machine's.
"""

from __future__ import annotations

import asyncio
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
from jupyter_dist.control.launchers.dial_back_door import Door, PeerAllowance, Refusals
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
#: seconds a connection has to prove its node's key (asyncssh's own default is 30)
HANDSHAKE_S = 5.0


class DialBackListener:
    """One session's listener: the keys, the TCP port nodes dial, and each node's
    connection, waiting for its node's launcher or in its hands.

    ``host``/``port``: where to listen (``""``: every interface; an address that is not
    this machine's, every interface of its family, see `Door.bind`; port 0: a free one,
    see `address`); ``advertise``: the name or address nodes are told to dial, when it is
    not ``host`` (default: ``host``, else this machine's hostname).

    What it lets in (see ``dial_back_door.py`` for the door): a bounded number of
    connections proving their keys at once, fewer from one address, each closed when it
    has not within `HANDSHAKE_S`; one connection for each node's key at a time (another
    with a key whose node holds one, waiting or in use, is refused). It listens only while
    a node has no connection: until every node dialled in, and again, on the same port,
    when one's connection ends (a restart, a lost link) or a node is given new keys
    (`renew`, a `resize` that grows).
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
        #: each node's connection, waiting in its queue or taken by its launcher
        self._live: dict[int, asyncssh.SSHClientConnection] = {}
        #: connections refused, for tests and logs: counted by reason, a sample kept
        self.refusals = Refusals()
        self._allowance = PeerAllowance()
        self._allowance.size_for(nodes)
        self._door: Door | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._listen_error: OSError | None = None
        self._closed = False

    async def start(self) -> None:
        """Listen; nodes may dial from now on."""
        self._door = Door(self._handshake, self.refusals, self._allowance)
        await self._door.bind(self.host, self.port)
        self.port = self._door.port
        log.info(
            "dial-back listener for %d nodes on %s (bound to %s)",
            self.nodes,
            self.address,
            self._door.bound,
        )

    @property
    def address(self) -> str:
        """``HOST:PORT`` the nodes dial."""
        host = self.advertise or self.host or socket.gethostname()
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def listening(self) -> bool:
        """Whether a dial reaches it now (see the class's docstring)."""
        return self._door is not None and self._door.listening

    @property
    def refused(self) -> list[str]:
        """The last refusals, a line each (`Refusals.sample`)."""
        return list(self.refusals.sample)

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
        with the old key, is refused, and a connection of it still waiting is closed. The
        listener listens until the new one dials in."""
        self._check_node(node)
        del self._node_of[self.host_keys[node].public_data]
        self.host_keys[node] = asyncssh.generate_private_key(KEY_ALGORITHM)
        self._node_of[self.host_keys[node].public_data] = node
        self._forget(node)
        self._update_listening()

    def resize(self, nodes: int) -> None:
        """Serve ``nodes`` nodes from now on (the session was resized): each new node gets
        a host key of its own, and the listener listens until it dials in; the keys of the
        nodes past ``nodes`` are forgotten, so that such a node, dialling again, is
        refused, and its connections still waiting close."""
        if not 1 <= nodes <= MAX_NODES:
            raise AgentError(f"dial-back: {nodes} nodes, expected 1 to {MAX_NODES}")
        for node in range(nodes, self.nodes):
            del self._node_of[self.host_keys[node].public_data]
            self._forget(node)
        del self.host_keys[nodes:], self._arrived[nodes:]
        for node in range(self.nodes, nodes):
            key = asyncssh.generate_private_key(KEY_ALGORITHM)
            self.host_keys.append(key)
            self._node_of[key.public_data] = node
            self._arrived.append(asyncio.Queue())
        self.nodes = nodes
        self._allowance.size_for(nodes)
        self._update_listening()

    def _forget(self, node: int) -> None:
        """Node ``node``'s connection is no longer its own (new keys, or no node): one
        waiting is closed; one a launcher holds is left to it."""
        self._live.pop(node, None)
        queue = self._arrived[node]
        while not queue.empty():
            queue.get_nowait().close()

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
        self._update_listening()
        if self._listen_error is not None and not self.listening:
            raise AgentError(
                f"dial-back node {node}: cannot listen on port {self.port} again for it to "
                f"dial in: {self._listen_error}"
            )
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

    # -- connections -------------------------------------------------------------------------
    def _handshake(self, sock: socket.socket, peer: str, key: str) -> None:
        """An admitted TCP connection: its SSH handshake, bounded by `HANDSHAKE_S`."""
        task = asyncio.ensure_future(self._prove(sock, peer, key))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _prove(self, sock: socket.socket, peer: str, key: str) -> None:
        link = _Dialled(self, peer)
        host, port = _peer_address(sock)
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    host, port, sock=sock, client_factory=lambda: link, **self._ssh_options()
                ),
                HANDSHAKE_S,
            )
        except asyncio.TimeoutError:
            sock.close()
            self.refusals.add(f"no key proven within {HANDSHAKE_S:g} s", peer)
            return
        except asyncio.CancelledError:
            sock.close()
            raise
        except Exception as exc:  # whatever ended it, it is a refusal to count, not a crash
            sock.close()
            if link.why is not None:  # its host key, refused: asyncssh's words add nothing
                self.refusals.add(link.why, peer)
            else:
                self.refusals.add(_failure(exc), peer, str(exc))
            return
        finally:
            assert self._door is not None
            self._door.done(key)
        self._admit(conn, link)

    def _ssh_options(self) -> dict[str, Any]:
        return {
            "known_hosts": _no_known_hosts,  # every key goes to `_Dialled`: `_may_dial`
            "server_host_key_algs": [KEY_ALGORITHM],
            "x509_trusted_certs": None,
            "client_keys": [self.client_key],
            "username": USER,
            "config": [],
            "agent_path": None,
            "agent_forwarding": False,
            "gss_host": None,
            "password": None,
            "preferred_auth": "publickey",
            "keepalive_interval": KEEPALIVE_INTERVAL_S,
            "keepalive_count_max": KEEPALIVE_COUNT_MAX,
            "login_timeout": HANDSHAKE_S * 2,  # `_prove`'s own bound comes first
        }

    def _may_dial(self, key: asyncssh.SSHKey, link: _Dialled) -> bool:
        """Whether a connection showing host key ``key`` may go on proving it holds it:
        the key of a node that has no connection."""
        node = self._node_of.get(key.public_data)
        if node is None:
            link.why = "a host key that is not the session's"
            return False
        if node in self._live and not _link_of(self._live[node]).closed:
            link.why = "its node is connected already"
            return False
        return True

    def _admit(self, conn: asyncssh.SSHClientConnection, link: _Dialled) -> None:
        key = conn.get_server_host_key()
        node = self._node_of.get(key.public_data) if key is not None else None
        if key is None or node is None or self._closed:  # new keys or closed meanwhile
            conn.close()
            self.refusals.add("a host key that is not the session's", link.peer)
            return
        if not self._may_dial(key, link):  # two of one node proved their key at once
            conn.close()
            self.refusals.add(link.why or "", link.peer)
            return
        link.node = node
        self._live[node] = conn
        log.info("dial-back node %d connected from %s", node, link.peer)
        self._arrived[node].put_nowait(conn)
        self._update_listening()

    def _lost(self, link: _Dialled) -> None:
        """A connection ended: its node, if it was this one's, has none."""
        if link.node is not None and self._live.get(link.node) is link.conn:
            del self._live[link.node]
            self._update_listening()

    def _update_listening(self) -> None:
        """Listen while a node has no connection; not otherwise."""
        door = self._door
        if door is None or self._closed:
            return
        if len(self._live) < self.nodes and not door.listening:
            try:
                door.open()
            except OSError as err:
                self._listen_error = err
                log.warning("dial-back: cannot listen on port %d again: %s", self.port, err)
                return
            self._listen_error = None
            waiting = [n for n in range(self.nodes) if n not in self._live]
            log.info("dial-back: listening on %s for node(s) %s", self.address, _nodes(waiting))
        elif len(self._live) >= self.nodes and door.listening:
            door.shut()
            log.info("dial-back: every node is connected; not listening on port %d", self.port)

    def _check_node(self, node: int) -> None:
        if not 0 <= node < self.nodes:
            raise AgentError(f"dial-back node {node}: expected 0 to {self.nodes - 1}")

    async def close(self) -> None:
        """Stop listening and close the connections no launcher took."""
        self._closed = True
        if self._door is not None:
            self._door.close()
        handshakes = list(self._handshakes)
        for task in handshakes:
            task.cancel()
        if handshakes:
            await asyncio.gather(*handshakes, return_exceptions=True)
        for queue in self._arrived:
            while not queue.empty():
                queue.get_nowait().close()


class _Dialled(LinkWatch):
    """A connection a node dialled: its address, its node once proven, why it was refused;
    the listener hears when it ends."""

    def __init__(self, listener: DialBackListener, peer: str) -> None:
        super().__init__()
        self.listener = listener
        self.peer = peer
        self.node: int | None = None
        self.conn: asyncssh.SSHClientConnection | None = None
        self.why: str | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        return self.listener._may_dial(key, self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.listener._lost(self)


def _no_known_hosts(
    _host: str, _addr: str, _port: int | None
) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
    """No key is known ahead: each is asked of the connection's `_Dialled`."""
    return [], [], []


def _peer_address(sock: socket.socket) -> tuple[str, int]:
    try:
        name = sock.getpeername()
    except OSError:
        return "?", 0
    return str(name[0]), int(name[1])


def _failure(exc: BaseException) -> str:
    """A refusal's reason, one of a few: never the peer's own words."""
    if isinstance(exc, asyncssh.PermissionDenied):
        return "it did not accept the session's client key"
    if isinstance(exc, (asyncssh.ConnectionLost, ConnectionError, EOFError)):
        return "it closed the connection before proving its key"
    if isinstance(exc, asyncssh.Error):
        return f"SSH {type(exc).__name__}"
    return type(exc).__name__


def _nodes(nodes: list[int]) -> str:
    shown = ", ".join(map(str, nodes[:8]))
    return shown + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")


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
