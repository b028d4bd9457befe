"""One socket to a node's relay for the shell requests of all its ranks, and their replies.

A cell's ``execute_request`` is the same signed message for every rank (`RankClient.
prepare_execute`); through the node's relay (`node.relay`) it is sent once a node, naming
the ranks it is for, and the relay passes it to each. Their replies come back in batches
(`common.relay_batch`), each entry naming its rank, checked and parsed once a batch and
handed to each rank's client (`RankClient.route_shell`). The socket has a fixed
``identity``: the relay passes it on to the ranks with each request, and a rank addresses
its ``input_request`` to it, on the stdin socket of the rank's client, which has the same.

Like the rank clients it reads from the event loop's wake-ups (a callback drains the
socket when it becomes readable) and sends at once unless the socket is full.

If the relay stops (its agent starts another at the same socket, to which this one
reconnects), whatever it held is gone, and the ranks' replies to requests it passed on go
to a socket that no longer exists. The socket's monitor tells the moment the connection
breaks, and `on_lost` then tells the session, so that no cell waits for those answers. A
connection that never got through zmq's handshake carried nothing and loses nothing: over
SSH the forward's local end accepts and then closes while the node's relay is not yet
listening, and zmq connects again by itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from jupyter_dist.common.relay_batch import is_batch, read_batch, targets_frame
from jupyter_dist.common.wire_codec import WireCodec, WireError
from jupyter_dist.control import zmq_frames

if TYPE_CHECKING:
    from jupyter_dist.control.rank_client import RankClient

log = logging.getLogger(__name__)
#: the drain hands the loop over after this many batches in a row
BURST = 64
#: a wait this long checks the socket for a message it was not woken for
RECHECK_S = 1.0
#: a full socket's waiting requests are sent again after this long
SEND_RETRY_S = 0.002


class NodeShell:
    """The notebook side's shell socket to one node's relay."""

    def __init__(
        self,
        context: zmq.Context[Any],
        key: str,
        signature_scheme: str,
        url: str,
        identity: bytes | None = None,
    ) -> None:
        self.url = url
        self.identity = identity or b"jd-" + uuid.uuid4().hex.encode()
        self.socket: zmq.Socket[bytes] = zmq.Socket(context, zmq.DEALER)
        self.socket.linger = 0
        self.socket.identity = self.identity
        # a plain socket (the context may be an asyncio one, whose sockets return futures)
        address = f"inproc://jupyter-dist-relay-monitor-{uuid.uuid4().hex}"
        self.socket.monitor(address, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.monitor: zmq.Socket[bytes] = zmq.Socket(context, zmq.PAIR)
        self.monitor.linger = 0
        self.monitor.connect(address)
        self.socket.connect(url)
        #: called with this node's ranks when the connection to the relay broke
        self.on_lost: Callable[[list[int]], None] | None = None
        self.disconnects = 0
        #: a connection to the relay completed zmq's handshake and has not broken since:
        #: only such a connection can have carried answers, so only its end loses them
        self.connected = False
        self.codec = WireCodec(key, signature_scheme)
        self.clients: dict[int, RankClient] = {}
        self._outbox: collections.deque[list[Any]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recheck: asyncio.TimerHandle | None = None
        self.closed = False
        self.sent = 0  # requests sent, each for any number of ranks
        self.batches = 0  # reply batches, and the replies they carried
        self.replies = 0
        self.lost_wakeups = 0

    def add(self, client: RankClient) -> None:
        self.clients[client.rank] = client
        self.watch()

    def remove(self, client: RankClient) -> None:
        if self.clients.get(client.rank) is client:
            del self.clients[client.rank]

    def watch(self) -> None:
        """Read from the running loop's wake-ups (once; a no-op without a loop)."""
        if self._loop is None and not self.closed:
            self._loop = zmq_frames.running_loop()
            if self._loop is not None:
                self._loop.add_reader(self.monitor.FD, self._on_monitor)
                self._loop.add_reader(self.socket.FD, self._on_ready)
                self._recheck = self._loop.call_later(RECHECK_S, self._check)

    # -- requests ---------------------------------------------------------------------
    def send(self, ranks: Sequence[int], frames: Sequence[Any]) -> None:
        """Send a request (its frames from the delimiter on) to ``ranks`` of this node:
        at once, unless the socket is full or earlier requests still wait."""
        self._outbox.append([targets_frame(list(ranks)), *frames])
        self.sent += 1
        if len(self._outbox) == 1:
            self._flush()

    def _flush(self) -> None:
        outbox = self._outbox
        while outbox and not self.closed:
            try:
                zmq_frames.send(self.socket, outbox[0])
            except zmq.Again:
                asyncio.get_running_loop().call_later(SEND_RETRY_S, self._flush)
                return
            except zmq.ZMQError as err:
                log.warning("sending to the relay at %s failed: %r", self.url, err)
                outbox.clear()
                return
            outbox.popleft()
        if self._loop is not None:  # a send can use up the socket's wake-up edge
            self._loop.call_soon(self._on_ready)

    # -- replies ----------------------------------------------------------------------
    def _on_ready(self, from_check: bool = False) -> None:
        if self.closed:
            return
        for _ in range(BURST):
            try:
                frames = zmq_frames.receive(self.socket)
            except zmq.Again:
                return
            except zmq.ZMQError as err:
                if not self.closed:
                    log.warning("reading the relay at %s failed: %r", self.url, err)
                return
            if from_check:
                from_check = False
                self.lost_wakeups += 1
            self._dispatch(frames)
        asyncio.get_running_loop().call_soon(self._on_ready)

    def _dispatch(self, frames: list[bytes]) -> None:
        try:
            if not is_batch(frames):
                raise WireError("not a relay batch")
            messages = read_batch(self.codec, frames)
        except WireError as err:
            log.warning("dropped a bad reply from the relay at %s: %s", self.url, err)
            return
        self.batches += 1
        self.replies += len(messages)
        for msg in messages:
            client = self.clients.get(msg.get("rank", -1))
            if client is None:
                continue  # a rank whose client is gone (restarted, closed)
            try:
                client.route_shell(msg)
            except Exception:
                log.exception("rank %s: handling a shell reply failed", client.rank)

    def _on_monitor(self) -> None:
        while not self.closed:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
                continue
            if event["event"] != zmq.EVENT_DISCONNECTED or not self.connected:
                # a connection that never got through: the relay was not listening yet
                # (over SSH the local end of the forward accepts, then closes when the
                # node's socket is not there); nothing went over it, so nothing is lost,
                # and zmq connects again by itself
                continue
            self.connected = False
            self.disconnects += 1
            log.warning("the connection to the relay at %s broke", self.url)
            if self.on_lost is not None and self.clients:
                try:
                    self.on_lost(sorted(self.clients))
                except Exception:
                    log.exception("telling of the relay at %s failed", self.url)

    def _check(self) -> None:
        if self.closed or self._loop is None:
            return
        self._on_monitor()
        self._on_ready(from_check=True)
        self._recheck = self._loop.call_later(RECHECK_S, self._check)

    def close(self) -> None:
        self.closed = True
        if self._loop is not None:
            for fd in (self.socket.FD, self.monitor.FD):
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(fd)
        if self._recheck is not None:
            self._recheck.cancel()
        with contextlib.suppress(Exception):
            self.socket.disable_monitor()
        for socket in (self.monitor, self.socket):
            with contextlib.suppress(Exception):
                socket.close(linger=0)
