"""The door of a dial-back listener: the TCP socket nodes dial, and which of the
connections it accepts reach an SSH handshake.

Anyone who can route to the listener can open a TCP connection to it, and each open one
holds a file descriptor of the process that listens (a notebook kernel, or the Jupyter
server that owns the session). So a connection is reset the moment it is accepted, holding
nothing, when

* `Door.max_pending` connections are proving their keys already (`pending_bound`: a share
  of the process's descriptor limit, at most `MAX_PENDING`);
* its address has `PeerAllowance.per_peer` connections proving their keys already;
* its address dialled more often than its allowance: a token bucket of
  `PeerAllowance.burst` dials at once, refilled at `PEER_RATE` a second (IPv6 addresses
  count by their /64, which one holder has).

The listener (``dial_back.py``) closes an admitted connection that has not proven its key
within its handshake's time. Refusals are counted by reason (`Refusals`), a few kept as a
sample, and a warning is logged at most every `LOG_EVERY_S`.

The door listens only while the listener asks (`Door.open`, `Door.shut`), and its port
stays the listener's in between: on Linux the socket stays bound, shut for reading (no
longer listening: a dial is refused by the system), and listens again on the same port;
elsewhere it is closed and bound again to the same port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import ipaddress
import logging
import resource
import socket
import struct
import time
from collections.abc import Callable

from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)

#: the most connections of one listener proving their keys at once
MAX_PENDING = 256
#: ... and at most this share of the process's file descriptor limit
DESCRIPTOR_SHARE = 8
MIN_PENDING = 8
#: connections of one address proving their keys at once (more where a session has more
#: nodes: nodes behind one NAT, or on one machine, share an address)
PEER_PENDING = 16
#: dials an address may make at once, and a second after that (the same: more nodes)
PEER_BURST = 32
PEER_RATE = 10.0
#: addresses whose allowance is remembered; past it, full buckets are forgotten first
MAX_PEERS = 1024
#: refusal lines kept, and seconds between warnings in the log
SAMPLE = 20
LOG_EVERY_S = 60.0
#: the listening socket's backlog, and connections accepted per wake-up
BACKLOG = 128
ACCEPT_BATCH = 64
#: seconds accepting pauses after the process ran out of descriptors (asyncio's own)
PAUSE_S = 1.0
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def pending_bound() -> int:
    """How many connections may prove their keys at once in this process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_PENDING
    return max(MIN_PENDING, min(MAX_PENDING, soft // DESCRIPTOR_SHARE))


def peer_key(host: str) -> str:
    """What an address's allowance is counted by: itself (an IPv4-mapped IPv6 address as
    IPv4), an IPv6 address by its /64."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Refusals:
    """The connections a listener refused: how many for each reason (a fixed few), the
    last `SAMPLE` as lines (address, reason, detail; never key material), and a warning
    in the log for the first, then at most one every `LOG_EVERY_S` saying how many went
    unsaid since."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.sample: collections.deque[str] = collections.deque(maxlen=SAMPLE)
        self._warned_at = -LOG_EVERY_S
        self._unsaid = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, reason: str, peer: str, detail: str = "") -> None:
        self.counts[reason] += 1
        said = "".join(c if c.isprintable() else "?" for c in detail[:200])  # a peer's words
        line = f"{peer}: {reason}" + (f" ({said})" if said else "")
        self.sample.append(line)
        now = time.monotonic()
        if now - self._warned_at < LOG_EVERY_S:
            self._unsaid += 1
            log.debug("dial-back: refused a connection from %s", line)
            return
        since = f"; {self._unsaid} more refused since the last warning" if self._unsaid else ""
        log.warning("dial-back: refused a connection from %s%s", line, since)
        self._warned_at, self._unsaid = now, 0


class PeerAllowance:
    """Each address's dials: a token bucket, and its connections proving their keys."""

    def __init__(self) -> None:
        self.burst = float(PEER_BURST)
        self.per_peer = PEER_PENDING
        self.pending: collections.Counter[str] = collections.Counter()
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def size_for(self, nodes: int) -> None:
        """A session of ``nodes`` nodes: they may all share one address."""
        self.burst = float(max(PEER_BURST, 2 * nodes))
        self.per_peer = max(PEER_PENDING, nodes)

    def admit(self, key: str, now: float) -> str | None:
        """None, counting one more connection of ``key`` proving its key; else why not."""
        if self.pending[key] >= self.per_peer:
            return f"more than {self.per_peer} connections of its address proving their keys"
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * PEER_RATE)
        self._buckets[key] = (tokens - 1, now) if tokens >= 1 else (tokens, now)
        self._forget(now)
        if tokens < 1:
            return f"its address dialled more than {PEER_RATE:g} times a second"
        self.pending[key] += 1
        return None

    def done(self, key: str) -> None:
        """A connection of ``key`` proved its key or ended."""
        self.pending[key] -= 1
        if self.pending[key] <= 0:
            del self.pending[key]

    def _forget(self, now: float) -> None:
        if len(self._buckets) <= MAX_PEERS:
            return
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * PEER_RATE >= self.burst:
                del self._buckets[key]
        while len(self._buckets) > MAX_PEERS:
            self._buckets.popitem(last=False)  # the longest unheard of


def _reset(sock: socket.socket) -> None:
    """Close at once, with a reset: nothing is left waiting on this side."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def peer_text(addr: tuple[str, int]) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Door:
    """One listener's socket, bound once, listening while open; each admitted connection
    goes to ``arrived(sock, peer, key)``, whose handshake must end with `done(key)`."""

    def __init__(
        self,
        arrived: Callable[[socket.socket, str, str], None],
        refusals: Refusals,
        allowance: PeerAllowance,
    ) -> None:
        self._arrived = arrived
        self.refusals = refusals
        self.allowance = allowance
        self.max_pending = pending_bound()
        self.pending = 0
        self.port = 0
        self.bound = ""  # the address the socket is bound to ("::" may take IPv4 too)
        self._family: int = socket.AF_INET
        self._dual = False
        self._sock: socket.socket | None = None
        self._listening = False
        self._closed = False
        self._paused: asyncio.TimerHandle | None = None
        self._exhausted_at = -LOG_EVERY_S

    @property
    def listening(self) -> bool:
        return self._listening

    # -- binding ---------------------------------------------------------------------------
    async def bind(self, host: str, port: int) -> None:
        """Bind to ``host`` (``""``: every interface, IPv6 and IPv4 on one socket where the
        system can) and ``port`` (0: a free one), then listen.

        ``host`` is where the nodes' connections arrive. When it is not an address of this
        machine (a NAT's or a Kubernetes Service's that forwards to it), those connections
        arrive at an address of this machine this side cannot know, so the door listens
        on every interface of ``host``'s family (IPv4 alone for an IPv4 address)."""
        for family, addr, dual in await _candidates(host):
            try:
                self._sock = _bound(family, addr, port, dual)
            except OSError as err:
                if err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    continue  # not this machine's (or no IPv6 here)
                raise AgentError(
                    f"dial-back: cannot listen on {addr} port {port or '(any)'}: {err}"
                ) from None
            self._family, self.bound, self._dual = family, addr, dual
            break
        else:
            family, addr, dual = await _everywhere(host)
            log.info(
                "dial-back: %s is not an address of this machine (a NAT's or a Service's "
                "that forwards here?): listening on every %s interface",
                host,
                "IPv6 and IPv4" if dual else "IPv4" if family == socket.AF_INET else "IPv6",
            )
            try:
                self._sock = _bound(family, addr, port, dual)
            except OSError as err:
                raise AgentError(f"dial-back: cannot listen on port {port}: {err}") from None
            self._family, self.bound, self._dual = family, addr, dual
        self.port = self._sock.getsockname()[1]
        self.open()

    def open(self) -> None:
        """Listen (again, on the same port)."""
        if self._listening or self._closed:
            return
        if self._sock is not None:
            self._sock.listen(BACKLOG)
            if self._sock.getsockname()[1] != self.port:  # the system let the port go
                self._sock.close()
                self._sock = None
        if self._sock is None:
            self._sock = _bound(self._family, self.bound, self.port, self._dual)
            self._sock.listen(BACKLOG)
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._readable)
        self._listening = True

    def shut(self) -> None:
        """Stop listening, keeping the port (see the module's docstring)."""
        if not self._listening or self._sock is None:
            return
        self._stop_reading()
        self._listening = False
        try:
            self._sock.shutdown(socket.SHUT_RD)  # Linux: no longer listening, still bound
        except OSError:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            self._stop_reading()
            self._sock.close()
            self._sock = None
        self._listening = False

    def _stop_reading(self) -> None:
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())

    # -- accepting -------------------------------------------------------------------------
    def _readable(self) -> None:
        assert self._sock is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in _EXHAUSTED:
                    self._exhausted(err)
                return
            self._admit(sock, addr)

    def _exhausted(self, err: OSError) -> None:
        """Out of descriptors (others of this process hold them): try again shortly."""
        now = time.monotonic()
        if now - self._exhausted_at >= LOG_EVERY_S:
            log.warning("dial-back: cannot accept a connection on port %d: %s", self.port, err)
            self._exhausted_at = now
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        loop.remove_reader(self._sock.fileno())
        self._paused = loop.call_later(PAUSE_S, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._listening and self._sock is not None:
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._readable)

    def _admit(self, sock: socket.socket, addr: tuple[str, int]) -> None:
        peer, key = peer_text(addr), peer_key(addr[0])
        if self.pending >= self.max_pending:
            why: str | None = f"more than {self.max_pending} connections proving their keys"
        else:
            why = self.allowance.admit(key, time.monotonic())
        if why is not None:
            _reset(sock)
            self.refusals.add(why, peer)
            return
        self.pending += 1
        self._arrived(sock, peer, key)

    def done(self, key: str) -> None:
        """An admitted connection's handshake ended (its key proven, or not)."""
        self.pending -= 1
        self.allowance.done(key)


async def _candidates(host: str) -> list[tuple[int, str, bool]]:
    """The addresses ``host`` names, as (family, address, dual stack)."""
    if not host:
        return [(socket.AF_INET6, "::", True), (socket.AF_INET, "0.0.0.0", False)]
    if host in ("0.0.0.0", "::"):
        return [(socket.AF_INET if host == "0.0.0.0" else socket.AF_INET6, host, False)]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as err:
        raise AgentError(f"dial-back: cannot listen on {host!r}: {err}") from None
    found: list[tuple[int, str, bool]] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            entry = (int(family), str(sockaddr[0]), False)
            if entry not in found:
                found.append(entry)
    return found


async def _everywhere(host: str) -> tuple[int, str, bool]:
    """Every interface of the families ``host``'s addresses are of."""
    families = {family for family, _, _ in await _candidates(host)}
    if families == {socket.AF_INET}:
        return socket.AF_INET, "0.0.0.0", False
    if families == {socket.AF_INET6}:
        return socket.AF_INET6, "::", False
    return socket.AF_INET6, "::", True


def _bound(family: int, addr: str, port: int, dual: bool) -> socket.socket:
    """A non-blocking socket bound to ``addr``: ``port``, named explicitly (a port the
    system picked is let go when a Linux socket stops listening; one named is kept)."""
    for attempt in range(1, 6):
        chosen = port or _free_port(family, addr, dual)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _options(sock, family, dual)
            sock.bind((addr, chosen))
            sock.setblocking(False)
            return sock
        except OSError as err:
            sock.close()
            if port or err.errno != errno.EADDRINUSE or attempt == 5:
                raise  # (a free port taken between the look and the bind: another)
    raise AssertionError("unreachable")


def _free_port(family: int, addr: str, dual: bool) -> int:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        _options(probe, family, dual)
        probe.bind((addr, 0))
        return int(probe.getsockname()[1])


def _options(sock: socket.socket, family: int, dual: bool) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)


__all__ = ["Door", "PeerAllowance", "Refusals", "peer_key", "pending_bound"]
