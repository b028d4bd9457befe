"""``python -m jupyter_dist.node.dial_back HOST:PORT --credentials FILE``: a node that
dials its session's owner instead of waiting for SSH.

It makes the TCP connection to the owner's listener (``control.launchers.dial_back``) and
runs an SSH *server* on it (asyncssh's reverse direction), which:

* shows the host key of the credentials, by which the owner knows the node (and which the
  owner alone trusts), and accepts only the session's client key: no password, no other
  key, nothing before that;
* runs nothing but the node's agent (``python -m jupyter_dist.node``, with this process's
  interpreter): the exec request is JSON naming the session and the agent's variables;
  the agent's stdio is the channel's, and signals sent on the channel reach it. No shell,
  no subsystem, no terminal, no agent or X11 forwarding;
* forwards connections only to Unix sockets in the private folders of the agents it runs
  (their rank and relay sockets): no TCP forwarding, no other path, no listening.

When the connection ends the agent's stdin closes, and it kills its ranks. The node then
dials again (a session that restarts starts new agents on new connections) until no
listener answers for ``--retry`` seconds, and exits.

With ``--watch-stdin`` the credentials are stdin's first line, and the end of stdin
(whoever started this process exited, or was killed: a Ray actor, a pod's main process)
ends the node: its connection closes, its agents stop their ranks, and it exits.

The credentials (JSON: ``node``, ``host_key``, the private key in OpenSSH form, and
``client_key``, the public key it accepts) are secret, and one node's alone: they come in
a file of this user's that no one else may read (mode 0600), or on stdin with
``--credentials -``; never on the command line or in the environment. With
``--remove-credentials`` the file is removed once read, before anything is started (a
Kubernetes pod's, which its init container left in a memory-backed folder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import asyncssh

from jupyter_dist.common.private_files import read_private_file
from jupyter_dist.common.process_tree import unblock_signals
from jupyter_dist.node.agent import DIR_PREFIX

log = logging.getLogger(__name__)
#: the agent this process runs for the owner (``control.launchers.base.AGENT_MODULE``)
AGENT_MODULE = "jupyter_dist.node"
CREDENTIALS_MAX_BYTES = 64 * 1024
#: seconds between dials while no listener answers
REDIAL_S = 1.0
#: seconds an agent gets to stop its ranks after its connection ended, before SIGKILL
AGENT_STOP_S = 30.0
#: seconds a dial may take (a link that drops every packet answers nothing)
CONNECT_TIMEOUT_S = 15.0
#: SSH keepalive: a request every this many seconds, and the connection is closed (the
#: agent's stdin with it) after `KEEPALIVE_COUNT_MAX` unanswered: a link lost without a
#: reset ends the ranks sooner than the agent's own deadline
KEEPALIVE_INTERVAL_S = 5.0
KEEPALIVE_COUNT_MAX = 3
#: signals the owner may send the agent
SIGNALS = {"INT", "TERM", "KILL", "QUIT", "USR1", "USR2", "HUP"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SESSION = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_CHUNK = 64 * 1024


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as a pair; anything else is refused."""
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"address {text[:80]!r}: expected HOST:PORT (port 1-65535)")
    return host, int(port)


@dataclass(frozen=True)
class Credentials:
    node: int
    host_key: asyncssh.SSHKey
    client_key: asyncssh.SSHKey


def parse_credentials(text: str, node: int | None = None) -> Credentials:
    """One node's credentials' JSON (node ``node``'s, when given); errors name the field,
    never its value."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("credentials: not JSON (expected node, host_key, client_key)") from None
    if not isinstance(data, dict):
        raise ValueError(
            "credentials: expected one node's, a JSON object with node, host_key, client_key"
        )
    if node is not None and data.get("node") != node:
        raise ValueError(f"credentials: they are node {data.get('node')!r}'s, not node {node}'s")
    node = data.get("node")
    if not isinstance(node, int) or isinstance(node, bool) or node < 0:
        raise ValueError(f"credentials: node {node!r}: expected a node index (0, 1, ...)")
    keys: dict[str, asyncssh.SSHKey] = {}
    for field, load in (
        ("host_key", asyncssh.import_private_key),
        ("client_key", asyncssh.import_public_key),
    ):
        try:
            keys[field] = load(str(data[field]))
        except (KeyError, asyncssh.KeyImportError):
            raise ValueError(f"credentials: {field}: missing or not an SSH key") from None
    return Credentials(node, keys["host_key"], keys["client_key"])


def read_credentials(
    source: str, first_line: bool = False, node: int | None = None, remove: bool = False
) -> Credentials:
    """From stdin (``-``: all of it, or its ``first_line``) or a file of this user's that
    others cannot read, removed once read when ``remove`` says so (before what it holds
    is checked: it is read once, good or not)."""
    if source == "-":
        if first_line:
            return parse_credentials(sys.stdin.readline(CREDENTIALS_MAX_BYTES), node)
        return parse_credentials(sys.stdin.read(CREDENTIALS_MAX_BYTES), node)
    try:
        mode = os.lstat(source).st_mode
        if stat.S_IMODE(mode) & 0o077:
            raise ValueError(f"mode {stat.S_IMODE(mode):o}, expected 600 (chmod 600 {source})")
        text = read_private_file(source, CREDENTIALS_MAX_BYTES).decode()  # type: ignore[arg-type]
        if remove:
            os.unlink(source)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"credentials file {source!r}: {err}") from None
    return parse_credentials(text, node)


def agent_request(command: str | None) -> tuple[str, dict[str, str]]:
    """The session and the agent's variables of an exec request; ValueError otherwise."""
    if command is None:
        raise ValueError("only the agent runs here (no shell)")
    try:
        data = json.loads(command)
    except ValueError:
        raise ValueError("only the agent runs here: expected {session, env} as JSON") from None
    session = data.get("session") if isinstance(data, dict) else None
    env = data.get("env", {}) if isinstance(data, dict) else None
    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise ValueError(f"session {str(session)[:60]!r}: expected letters, digits, . _ -")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("env: expected an object of variable names to strings")
    return session, env


class NodeServer(asyncssh.SSHServer):
    """The SSH server's policy for one connection (see the module's docstring)."""

    def __init__(self, node: DialBackNode) -> None:
        self.node = node

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.info("dial-back: connection lost: %s", exc)

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def connection_requested(self, dest_host: str, dest_port: int, *_: Any) -> bool:
        return False

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False

    def unix_server_requested(self, listen_path: str) -> bool:
        return False

    def unix_connection_requested(self, dest_path: str) -> bool:
        allowed = self.node.agent_socket(dest_path)
        if not allowed:
            log.warning("dial-back: refused forwarding to %r", dest_path)
        return allowed


class DialBackNode:
    """Dials the owner, serves each connection, and dials again after it ends."""

    def __init__(self, host: str, port: int, credentials: Credentials, retry_s: float) -> None:
        self.host = host
        self.port = port
        self.credentials = credentials
        self.retry_s = retry_s
        self.agents: dict[int, asyncio.subprocess.Process] = {}
        self._conn: asyncssh.SSHServerConnection | None = None
        self._leaving = False

    def watch_stdin(self) -> None:
        """End the node when stdin ends (read on a thread: stdin may be a pipe or a file)."""
        loop = asyncio.get_running_loop()

        def read() -> None:
            with contextlib.suppress(Exception):
                while sys.stdin.buffer.read(_CHUNK):
                    pass
            loop.call_soon_threadsafe(self.leave)

        threading.Thread(target=read, name="jupyter-dist-stdin", daemon=True).start()

    def leave(self) -> None:
        """Close the connection and dial no more; `run` returns once the agents are gone."""
        self._leaving = True
        log.info("dial-back node %d: stdin ended; leaving", self.credentials.node)
        if self._conn is not None:
            self._conn.close()

    def agent_socket(self, path: str) -> bool:
        """Whether ``path`` is in the private folder of an agent this process runs."""
        folder = os.path.dirname(os.path.realpath(path))
        name = os.path.basename(folder)
        if not any(name.startswith(f"{DIR_PREFIX}{pid}-") for pid in self.agents):
            return False
        try:
            info = os.lstat(folder)
        except OSError:
            return False
        return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()

    async def run(self) -> int:
        """Serve connections until none can be made for ``retry_s``."""
        last = time.monotonic()
        served = False
        while not self._leaving:
            try:
                conn = await self._dial()
            except (OSError, asyncssh.Error) as err:
                if self._leaving:
                    break
                if time.monotonic() - last > self.retry_s:
                    what = "no listener" if served else "cannot connect"
                    print(
                        f"dial-back node {self.credentials.node}: {what} at "
                        f"{self.host}:{self.port} for {self.retry_s:.0f} s ({err}); exiting",
                        file=sys.stderr,
                    )
                    return 0 if served else 1
                await asyncio.sleep(REDIAL_S)
                continue
            served = True
            self._conn = conn
            if self._leaving:
                conn.close()
            log.info("dial-back node %d: connected", self.credentials.node)
            await conn.wait_closed()
            self._conn = None
            await self._agents_gone()
            last = time.monotonic()
        await self._agents_gone()
        return 0

    async def _dial(self) -> asyncssh.SSHServerConnection:
        creds = self.credentials
        authorized = asyncssh.import_authorized_keys(creds.client_key.export_public_key().decode())
        return await asyncssh.connect_reverse(
            self.host,
            self.port,
            server_factory=lambda: NodeServer(self),
            server_host_keys=[creds.host_key],
            authorized_client_keys=authorized,
            process_factory=self._serve,
            encoding=None,
            allow_pty=False,
            x11_forwarding=False,
            agent_forwarding=False,
            allow_scp=False,
            gss_host=None,
            config=[],
            connect_timeout=CONNECT_TIMEOUT_S,
            keepalive_interval=KEEPALIVE_INTERVAL_S,
            keepalive_count_max=KEEPALIVE_COUNT_MAX,
            login_timeout=30.0,
        )

    async def _serve(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        """One exec request: the agent, its stdio on the channel."""
        try:
            if process.subsystem is not None:
                raise ValueError("only the agent runs here (no subsystem)")
            session, env = agent_request(process.command)
        except ValueError as err:
            process.stderr.write(f"dial-back: {err}\n".encode())
            process.exit(2)
            return
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            AGENT_MODULE,
            "--session",
            session,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **env},
        )
        self.agents[agent.pid] = agent
        try:
            outs = [
                asyncio.ensure_future(_pump(agent.stdout, process.stdout)),
                asyncio.ensure_future(_pump(agent.stderr, process.stderr)),
            ]
            feed = asyncio.ensure_future(_feed(process, agent))
            code = await agent.wait()
            await asyncio.gather(*outs, return_exceptions=True)
            feed.cancel()
            with contextlib.suppress(Exception):
                if code < 0:
                    process.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
                else:
                    process.exit(code)
        finally:
            self.agents.pop(agent.pid, None)

    async def _agents_gone(self) -> None:
        """After a connection ended: its agents stop their ranks (stdin closed); one that
        has not within `AGENT_STOP_S` is killed."""
        deadline = time.monotonic() + AGENT_STOP_S
        while self.agents and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for agent in list(self.agents.values()):
            with contextlib.suppress(ProcessLookupError):
                agent.kill()


async def _pump(source: asyncio.StreamReader | None, sink: asyncssh.SSHWriter[bytes]) -> None:
    """The agent's stdout or stderr onto the channel, until either ends."""
    assert source is not None
    with contextlib.suppress(Exception):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()


async def _feed(
    process: asyncssh.SSHServerProcess[bytes], agent: asyncio.subprocess.Process
) -> None:
    """The channel onto the agent's stdin, and its signals to the agent; the stdin closes
    when the channel or the connection ends, however it ends."""
    assert agent.stdin is not None
    try:
        while True:
            try:
                data = await process.stdin.read(_CHUNK)
            except asyncssh.SignalReceived as sig:
                if sig.signal in SIGNALS:
                    with contextlib.suppress(ProcessLookupError):
                        agent.send_signal(signal.Signals[f"SIG{sig.signal}"])
                continue
            except (asyncssh.BreakReceived, asyncssh.TerminalSizeChanged):
                continue
            if not data:
                break
            agent.stdin.write(data)
            await agent.stdin.drain()
    except Exception as err:  # the connection broke: as an end of stdin
        log.info("dial-back: the channel ended: %s", err)
    finally:
        agent.stdin.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_dist.node.dial_back",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("address", help="HOST:PORT of the session owner's listener")
    parser.add_argument(
        "--credentials",
        required=True,
        help="a file of mode 0600 holding the node's credentials, or - to read them on stdin",
    )
    parser.add_argument(
        "--remove-credentials",
        action="store_true",
        help="remove the credentials file once read, before anything is started",
    )
    parser.add_argument(
        "--node",
        type=int,
        default=None,
        help="which node this is: credentials of another node are refused",
    )
    parser.add_argument(
        "--watch-stdin",
        action="store_true",
        help="with --credentials -: they are stdin's first line, and the node exits (its "
        "agents' ranks with it) when stdin ends",
    )
    parser.add_argument(
        "--retry",
        type=float,
        default=60.0,
        help="seconds to keep dialling while no listener answers (default 60)",
    )
    args = parser.parse_args(argv)
    unblock_signals()  # started by a thread that blocks some (a Ray actor's)
    try:
        host, port = parse_address(args.address)
        if args.watch_stdin and args.credentials != "-":
            raise ValueError("--watch-stdin: expected --credentials - (they come on stdin)")
        if args.remove_credentials and args.credentials == "-":
            raise ValueError("--remove-credentials: expected --credentials FILE")
        credentials = read_credentials(
            args.credentials, args.watch_stdin, args.node, args.remove_credentials
        )
        if not 0 < args.retry <= 86400:
            raise ValueError(f"--retry {args.retry}: expected seconds, more than 0, at most 86400")
    except ValueError as err:
        print(f"dial-back: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    node = DialBackNode(host, port, credentials, args.retry)

    async def run() -> int:
        if args.watch_stdin:
            node.watch_stdin()
        return await node.run()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
