"""A node's relay: its ranks' IOPub and shell, checked on the node and carried in batches.

Most of what a cell costs the notebook is messages: a request to every rank, and from each
its output and its reply (on IOPub, `rank.iopub_reply`). Without a relay the notebook sends
each request on its own and receives each answer on its own, checks its signature and
parses its four JSON parts, once per message of every rank. The relay, a process forked by
the node's agent, stands between the notebook side and the ranks of its node:

* **IOPub**: it subscribes to every rank's IOPub socket, checks each message's signature
  and publishes whatever arrived together as one batch (`common.relay_batch`) on one
  socket, ``relay-iopub``, that every subscriber of the session shares.
* **Shell**: a notebook process connects one DEALER socket to its ROUTER, ``relay-shell``,
  and sends a request once for any number of the node's ranks (its first frame names them,
  ``b"0,1,5"``); the relay passes the same frames to each rank's shell through a DEALER of
  its own, with the notebook's identity in front, which the kernel's reply carries back.
  The replies that arrived together go back to that notebook as one batch, each entry
  naming its rank. A cell whose request asks for it (`FOLD_REPLIES_KEY`) has the plain
  replies of its ranks folded into one entry on IOPub (`relay_batch`).

The notebook side then pays one send a node for a cell, and one receive, one HMAC and one
JSON parse a batch of answers; it talks to two sockets a node, not three a rank (over
SSH: two forwarded sockets a node). Control (interrupts, output credit) stays direct.

A batch is whatever the relay finds queued when it wakes (up to
`relay_batch.MAX_MESSAGES` or `MAX_BYTES`), so a lone message goes on at once and a burst
from many ranks goes on together. One wait only: a batch of nothing but folded plain
replies to a cell, some of whose ranks here have not replied yet, waits for their replies,
for the next message of any kind, or `HOLD_S`, whichever comes first. The ranks of a cell
end at different moments (on a busy machine, a quick cell's over tens of milliseconds),
and without the wait each moment was a batch of its own: one more wake-up, receive,
signature check and parse on the notebook side (at 32 ranks about five a cell instead of
one or two). The cell ends no later (its last reply goes at once); the notebook only
learns of its faster ranks' ends up to `HOLD_S` later. Each rank's messages stay in order
(zmq queues each peer's apart); buffers (objects pushed and pulled, widget data) are
passed on without a copy.

The agent tells it which ranks to serve on a pipe, one line each: ``+RANK IOPUB_URL
SHELL_URL`` to serve a rank, ``-RANK`` to stop; the pipe's end tells it to exit. Its two
sockets are Unix sockets in the agent's private folder, and what it sends is signed with
the session's key. The agent forks a new one if it dies; the notebook side's sockets
reconnect to the same paths by themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from typing import Any

import zmq

from jupyter_dist.common.relay_batch import BatchWriter, parse_targets, split_message
from jupyter_dist.common.wire_codec import WireCodec, WireError
from jupyter_dist.common.wire_names import CREDIT_WINDOW, FOLD_REPLIES_KEY

#: the relay's sockets in the agent's folder (a Unix socket path stays under ~100 bytes)
IOPUB_SOCKET = "relay-iopub"
SHELL_SOCKET = "relay-shell"
#: batches the IOPub socket keeps for a subscriber that does not read: the output credit
#: of `CREDIT_WINDOW` messages a rank (`rank.iopub_credit`), 4 times over, for 64 ranks
PUB_QUEUE = 4 * CREDIT_WINDOW * 64
_FOLD_KEY = FOLD_REPLIES_KEY.encode()
#: seconds a run of folded replies may wait for the rest of its cell's ranks here (their
#: replies then reach the notebook in one batch, not one a wake-up)
HOLD_S = 0.1


def relay_url(path: str) -> str:
    return f"ipc://{path}"


class NodeRelay:
    """The relay's sockets and loop (`run_relay` runs it in the forked process)."""

    def __init__(self, key: bytes, folder: str, commands: int, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self.context = zmq.Context()
        self.sub: zmq.Socket[bytes] = self._socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.pub = self._socket(zmq.PUB)
        # what the ranks' credit lets through to a reader that paused must wait here,
        # not be dropped: a batch holds one message or more
        self.pub.sndhwm = PUB_QUEUE
        self._bind(self.pub, os.path.join(folder, IOPUB_SOCKET))
        self.router = self._socket(zmq.ROUTER)
        self._bind(self.router, os.path.join(folder, SHELL_SOCKET))
        self.codec = WireCodec(key)
        relay_id = uuid.uuid4().hex
        self.iopub = BatchWriter(self.codec, relay_id)
        #: replies waiting for each notebook socket, by its identity
        self.replies: dict[bytes, BatchWriter] = {}
        self._relay_id = relay_id
        self.commands = commands
        self.iopub_urls: dict[int, str] = {}
        self.shells: dict[int, zmq.Socket[bytes]] = {}
        self.rank_of: dict[zmq.Socket[bytes], int] = {}
        self.poller = zmq.Poller()
        for socket in (self.sub, self.router):
            self.poller.register(socket, zmq.POLLIN)
        self.poller.register(commands, zmq.POLLIN)
        self.messages = 0
        self.requests = 0
        self.dropped = 0
        self._inbuf = b""
        #: since when the IOPub batch waits for more replies of its cell (`_send_iopub`)
        self._held_since: float | None = None

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] = self.context.socket(kind)
        socket.linger = 0
        return socket

    def _bind(self, socket: zmq.Socket[bytes], path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the socket of a relay that died
        socket.bind(relay_url(path))
        os.chmod(path, 0o600)

    # -- the loop -------------------------------------------------------------------
    def run(self) -> None:
        while True:
            ready = dict(self.poller.poll(self._hold_left_ms()))
            if self.commands in ready and not self._read_commands():
                return
            if self.sub in ready:
                self._drain_iopub()
            else:
                self._send_iopub()
            if self.router in ready:
                self._fan_out()
            for socket in ready:
                if socket in self.rank_of:
                    self._take_replies(socket)
            self._send_replies()

    def _read_commands(self) -> bool:
        """Apply the agent's commands; False once the agent closed the pipe."""
        chunk = os.read(self.commands, 1 << 16)
        if not chunk:
            return False
        self._inbuf += chunk
        *lines, self._inbuf = self._inbuf.split(b"\n")
        for line in lines:
            try:
                words = line.decode().split()
                if line.startswith(b"+") and len(words) == 3:
                    self.add(int(words[0][1:]), words[1], words[2])
                elif line.startswith(b"-") and len(words) == 1:
                    self.remove(int(words[0][1:]))
                else:
                    raise ValueError("expected +RANK IOPUB_URL SHELL_URL or -RANK")
            except (ValueError, zmq.ZMQError) as err:
                self._say(f"a command {line[:200]!r} failed: {err}")
        return True

    def add(self, rank: int, iopub_url: str, shell_url: str) -> None:
        self.remove(rank)  # a rank started again
        self.sub.connect(iopub_url)
        self.iopub_urls[rank] = iopub_url
        shell = self._socket(zmq.DEALER)
        shell.connect(shell_url)
        self.shells[rank] = shell
        self.rank_of[shell] = rank
        self.poller.register(shell, zmq.POLLIN)

    def remove(self, rank: int) -> None:
        url = self.iopub_urls.pop(rank, None)
        if url is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sub.disconnect(url)
        shell = self.shells.pop(rank, None)
        if shell is not None:
            del self.rank_of[shell]
            self.poller.unregister(shell)
            shell.close(0)

    def _checked(self, frames: list[Any]) -> tuple[list[Any], list[bytes], list[Any]] | None:
        """``(identities, parts, buffers)`` of a rank's message whose signature is the
        session's; None (said in the log) for anything else."""
        try:
            idents, signature, parts, buffers = split_message(frames)
            if not self.codec.check(signature, parts):
                raise WireError("invalid signature")
        except WireError as err:
            self.dropped += 1
            self._say(f"dropped a message: {err}")
            return None
        self.messages += 1
        return idents, parts, buffers

    def _drain_iopub(self) -> None:
        """Publish everything queued now, in batches."""
        writer = self.iopub
        while True:
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            checked = self._checked(frames)
            if checked is None:
                continue
            writer.add_iopub(checked[1], checked[2])
            if writer.full():
                self._held_since = None
                self.pub.send_multipart(writer.take())
        self._send_iopub()

    def _send_iopub(self) -> None:
        """Publish what waits, unless it is a run of folded replies whose cell has ranks
        here yet to reply (`BatchWriter.awaits_replies`): that waits for them, for any
        other message, or for `hold_s`, whichever comes first."""
        writer = self.iopub
        if not len(writer):
            self._held_since = None
            return
        if writer.awaits_replies():
            now = time.monotonic()
            if self._held_since is None:
                self._held_since = now
            if now - self._held_since < self.hold_s:
                return
        self._held_since = None
        self.pub.send_multipart(writer.take())

    def _hold_left_ms(self) -> int | None:
        """How long the poll may wait: while a batch is held, until it is to go."""
        if self._held_since is None:
            return None
        left = self._held_since + self.hold_s - time.monotonic()
        return max(1, int(left * 1000) + 1)

    def _fan_out(self) -> None:
        """Pass each queued request on to every rank it names. The request is passed on
        as it came (the kernel checks its signature); a rank not served here is said in
        the log (its agent reports it exited)."""
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 3:
                self._say(f"dropped a request of {len(frames)} frames")
                continue
            try:
                ranks = parse_targets(frames[1].bytes)
            except ValueError as err:
                self._say(f"dropped a request: {err}")
                continue
            self.requests += 1
            if len(frames) >= 8 and _FOLD_KEY in frames[6].bytes:
                self._fold_replies_to(frames[4].bytes, sum(r in self.shells for r in ranks))
            message = [frames[0], *frames[2:]]  # the notebook's identity, then the request
            for rank in ranks:
                shell = self.shells.get(rank)
                if shell is None:
                    self._say(f"dropped a request for rank {rank}, which is not served here")
                    continue
                try:
                    shell.send_multipart(message, zmq.NOBLOCK)
                except zmq.Again:
                    self._say(f"dropped a request for rank {rank}: its queue is full")

    def _fold_replies_to(self, header: bytes, expected: int) -> None:
        """The request with ``header`` asks for its plain replies folded (its sender
        reads them so: `relay_batch`); one whose header is not JSON is passed on as is."""
        try:
            msg_id = json.loads(header).get("msg_id")
        except (ValueError, AttributeError):
            return
        if isinstance(msg_id, str):
            self.iopub.fold_replies_to(msg_id, expected)

    def _take_replies(self, shell: zmq.Socket[bytes]) -> None:
        rank = self.rank_of[shell]
        while True:
            try:
                frames = shell.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            checked = self._checked(frames)
            if checked is None:
                continue
            idents, parts, buffers = checked
            if len(idents) != 1:
                self._say(f"dropped a reply of rank {rank} with {len(idents)} identities")
                continue
            identity = idents[0].bytes
            writer = self.replies.get(identity)
            if writer is None:
                writer = self.replies[identity] = BatchWriter(self.codec, self._relay_id)
            writer.add(parts, buffers, rank)
            if writer.full():
                self._send_reply_batch(identity, writer)

    def _send_replies(self) -> None:
        for identity, writer in self.replies.items():
            if len(writer):
                self._send_reply_batch(identity, writer)

    def _send_reply_batch(self, identity: bytes, writer: BatchWriter) -> None:
        # a notebook socket that is gone: zmq drops what is routed to it
        self.router.send_multipart([identity, *writer.take()])

    def _say(self, text: str) -> None:
        print(f"relay: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        for socket in [self.sub, self.pub, self.router, *self.shells.values()]:
            socket.close(0)
        self.context.term()


def run_relay(key: bytes, folder: str, commands: int, hold_s: float = HOLD_S) -> int:
    """The relay process's body: until the agent closes ``commands``."""
    relay = NodeRelay(key, folder, commands, hold_s)
    try:
        relay.run()
    finally:
        relay._say(
            f"{relay.messages} messages passed on, {relay.requests} requests fanned out, "
            f"{relay.dropped} dropped"
        )
        relay.close()
    return 0
