"""What a dial-back listener (``control/launchers/dial_back.py`` and its door,
``dial_back_door.py``) lets in, on real sockets of the loopback interface: a flood of
silent connections neither exhausts its process's descriptors nor keeps a node out; one
that proves no key is closed within seconds; a node's key lets in one connection at a
time; it listens only while a node has no connection, on the address it was given."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import queue
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import asyncssh
import pytest

from jupyter_dist.control.launchers.dial_back import HANDSHAKE_S, DialBackListener
from jupyter_dist.node.dial_back import parse_credentials
from tests.async_run import in_loop

pytestmark = pytest.mark.slow

#: a listener for one node in a process of its own, with at most 256 descriptors
LISTENER = r"""
import asyncio, json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from jupyter_dist.control.launchers.dial_back import DialBackListener

async def main():
    listener = DialBackListener(1, "127.0.0.1", connect_timeout=120)
    await listener.start()
    print(json.dumps({"port": listener.port, "credentials": listener.credentials(0)}), flush=True)
    conn = await listener.connection(0)
    print(json.dumps({"connected": dict(listener.refusals.counts)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    conn.close()
    await listener.close()

asyncio.run(main())
"""
#: silent connections the flood keeps open, from another address than the node's
FLOOD = 400
FLOOD_FROM = "127.0.0.2"


class Flood:
    """`FLOOD` silent TCP connections to ``port``, each that the listener closes opened
    again, on a thread, until `stop`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.opened = 0
        self.closed = 0  # by the listener
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                while len(sel.get_map()) < FLOOD:
                    sock = socket.socket()
                    sock.bind((FLOOD_FROM, 0))
                    sock.setblocking(False)
                    sock.connect_ex(("127.0.0.1", self.port))
                    sel.register(sock, selectors.EVENT_READ)
                    self.opened += 1
                for key, _ in sel.select(0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        if sock.recv(4096):
                            continue  # the listener's SSH banner: say nothing back
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass  # reset
                    sel.unregister(sock)
                    sock.close()
                    self.closed += 1
                self._stop.wait(0.005)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()


def lines_of(stream: object) -> queue.SimpleQueue[str]:
    """A pipe's lines as they come, read on a thread."""
    out: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            out.put(line)

    threading.Thread(target=read, daemon=True).start()
    return out


@contextlib.contextmanager
def running(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_flood_of_silent_connections_neither_exhausts_descriptors_nor_keeps_a_node_out() -> None:
    """400 silent connections held open against a listener whose process may hold 256
    descriptors: those past its bounds are closed at once, and a real node dialling from
    another address connects while the flood goes on."""
    with running([sys.executable, "-c", LISTENER]) as listener:
        said = lines_of(listener.stdout)
        first = json.loads(said.get(timeout=60))
        with Flood(first["port"]) as flood:
            while flood.opened < FLOOD:  # the flood is on before the node dials
                assert listener.poll() is None, listener.stderr.read()  # type: ignore[union-attr]
                threading.Event().wait(0.05)
            node_argv = [sys.executable, "-m", "jupyter_dist.node.dial_back"]
            node_argv += [f"127.0.0.1:{first['port']}", "--credentials", "-", "--retry", "60"]
            with running(node_argv) as node:
                assert node.stdin is not None
                node.stdin.write(first["credentials"])
                node.stdin.close()
                try:
                    connected = json.loads(said.get(timeout=90))["connected"]
                except queue.Empty:
                    pytest.fail("the node did not connect through the flood within 90 s")
                flooded = flood.opened
        assert listener.stdin is not None
        listener.stdin.close()
        listener.wait(30)
        errors = listener.stderr.read()  # type: ignore[union-attr]
    assert "Too many open files" not in errors, errors
    assert "accept" not in errors, errors
    assert flooded > FLOOD and flood.closed > 0, (flooded, flood.closed)
    assert any("connections of its address" in reason for reason in connected), connected


def dial_and_close(port: int, count: int) -> int:
    """``count`` TCP connections to ``port``, a hundred at a time, each closed once made
    (or reset): how many were made."""
    made = 0
    for first in range(0, count, 100):
        socks = {}
        poller = select.poll()
        for _ in range(min(100, count - first)):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks[sock.fileno()] = sock
            poller.register(sock, select.POLLOUT)
        deadline = time.monotonic() + 30
        while socks and time.monotonic() < deadline:
            for fd, _ in poller.poll(1000):
                sock = socks.pop(fd)
                poller.unregister(fd)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                made += error in (0, errno.ECONNRESET, errno.EPIPE)
                sock.close()
        for sock in socks.values():
            sock.close()
    return made


async def eof_within(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """What came before the other end closed, which it must within ``timeout``."""
    got = b""
    while chunk := await asyncio.wait_for(reader.read(4096), timeout):
        got += chunk
    return got


async def dial_as(listener: DialBackListener, node: int) -> asyncssh.SSHServerConnection:
    """What a node's dial-back process does first: the SSH server's side of a connection
    to the listener, showing node ``node``'s host key."""
    creds = parse_credentials(listener.credentials(node))
    authorized = asyncssh.import_authorized_keys(creds.client_key.export_public_key().decode())
    return await asyncssh.connect_reverse(
        "127.0.0.1",
        listener.port,
        server_host_keys=[creds.host_key],
        authorized_client_keys=authorized,
        config=[],
    )


async def until(test: Callable[[], bool], timeout: float = 60) -> None:
    """Once ``test()`` holds; a failure naming it when it has not within ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not test():
        assert loop.time() < deadline, f"not within {timeout} s: {test.__doc__ or test}"
        await asyncio.sleep(0.02)


async def reachable(port: int) -> bool:
    """Whether a TCP connection to ``port`` is accepted (closed at once)."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return False
    writer.close()
    return True


@in_loop
async def test_a_silent_connection_is_closed_within_seconds_and_refusals_are_counted() -> None:
    """A connection that says nothing is closed within seconds (asyncssh's own limit is
    30 s); a thousand dials from one address are refused, counted by reason, a few kept."""
    listener = DialBackListener(1, "127.0.0.1", connect_timeout=60)
    await listener.start()
    try:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        opened = loop.time()
        dials = asyncio.ensure_future(asyncio.to_thread(dial_and_close, listener.port, 1000))
        banner = await eof_within(reader, 25)
        closed_after = loop.time() - opened
        writer.close()
        assert banner.startswith(b"SSH-2.0-"), banner
        assert closed_after < 25, f"a silent connection was kept {closed_after:.0f} s"
        made = await dials
        assert made > 950, made
        await until(lambda: listener.refusals.total >= made + 1)
        counts = listener.refusals.counts
        assert counts[f"no key proven within {HANDSHAKE_S:g} s"] >= 1, counts
        at_once = sum(n for why, n in counts.items() if "its address" in why)
        assert at_once > made / 2, counts  # reset at once, past the address's allowance
        assert len(counts) <= 4, counts
        assert len(listener.refused) <= 20
    finally:
        await listener.close()


@in_loop
async def test_a_node_key_lets_in_one_connection_and_it_listens_only_while_one_is_missing() -> None:
    listener = DialBackListener(1, "127.0.0.1", connect_timeout=60)
    await listener.start()
    port = listener.port
    nodes: list[asyncssh.SSHServerConnection] = []
    try:
        assert listener.listening and await reachable(port)
        nodes.append(await dial_as(listener, 0))
        conn0 = await listener.connection(0)
        assert not listener.listening and not await reachable(port)

        # a node more: it listens, on the same port, until that node dials in
        listener.resize(2)
        assert listener.listening and listener.port == port and await reachable(port)
        # node 0's key again, while node 0 is connected: refused
        with pytest.raises(asyncssh.HostKeyNotVerifiable):
            await dial_as(listener, 0)
        await until(lambda: listener.refusals.counts["its node is connected already"] == 1)
        nodes.append(await dial_as(listener, 1))
        conn1 = await listener.connection(1)
        assert not listener.listening and not await reachable(port)

        # node 1 given new keys (a lost node's place taken): it listens until they dial in
        listener.renew(1)
        assert listener.listening and await reachable(port)
        nodes.append(await dial_as(listener, 1))
        renewed = await listener.connection(1)
        assert renewed is not conn1
        assert not listener.listening and not await reachable(port)

        # a restart: node 0's connection ends, and node 0 dials again
        conn0.close()
        await conn0.wait_closed()
        assert listener.listening and await reachable(port)
        nodes.append(await dial_as(listener, 0))
        again = await listener.connection(0)
        assert again is not conn0 and not listener.listening
    finally:
        for node in nodes:
            node.close()
        await listener.close()


@in_loop
async def test_it_binds_the_address_given_or_every_interface_of_its_family() -> None:
    """An address of this machine is listened on alone; one that is not (a NAT's, which
    forwards to an address of this machine that cannot be known) on every IPv4 one."""
    here = DialBackListener(1, "127.0.0.1")
    nat = DialBackListener(1, "192.0.2.1")  # TEST-NET-1: no machine's address
    await here.start()
    await nat.start()
    try:
        assert here._door is not None and nat._door is not None
        assert here._door.bound == "127.0.0.1"
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.2", here.port)
        assert nat._door.bound == "0.0.0.0"
        assert nat.address == f"192.0.2.1:{nat.port}"
        assert await reachable(nat.port)
    finally:
        await here.close()
        await nat.close()
