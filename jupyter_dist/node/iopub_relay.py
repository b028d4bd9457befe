"""A node's IOPub relay: its ranks' IOPub, checked on the node and sent on in batches.

Most of what a cell costs the notebook is IOPub: every rank's busy and idle statuses and
its output. Without a relay the notebook receives each of those messages on its own,
checks its signature and parses its four JSON parts, once per message of every rank. The
relay, a process forked by the node's agent, subscribes to the IOPub socket of each rank
of its node, checks each message's signature there, and publishes whatever arrived
together as one batch (`common.iopub_batch`): the notebook pays one receive, one HMAC and
one JSON parse a batch, and talks to one IOPub endpoint a node, not one a rank (over SSH:
one forwarded socket a node).

It adds no wait: a batch is whatever the relay finds queued when it wakes (up to
`iopub_batch.MAX_MESSAGES` or `MAX_BYTES`), so a lone message goes on at once and a burst
from many ranks goes on together. Each rank's messages stay in order (zmq queues each
publisher's apart); buffers (objects pulled, widget data) are passed on without a copy.

The agent tells it which ranks to read on a pipe, one line each: ``+URL`` to subscribe to a
rank's IOPub socket, ``-URL`` to stop; the pipe's end tells it to exit. It publishes on a
Unix socket in the agent's private folder, signed with the session's key. The agent forks
a new one if it dies; subscribers reconnect to the same path by themselves.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid

import zmq

from jupyter_dist.common.iopub_batch import BatchWriter, split_message
from jupyter_dist.common.wire_codec import WireCodec, WireError

#: the relay's socket in the agent's folder (a Unix socket path stays under ~100 bytes)
SOCKET_NAME = "relay-iopub"


def relay_url(path: str) -> str:
    return f"ipc://{path}"


class IopubRelay:
    """The relay's sockets and loop (`run_relay` runs it in the forked process)."""

    def __init__(self, key: bytes, bind_path: str, commands: int) -> None:
        self.context = zmq.Context()
        self.sub: zmq.Socket[bytes] = self.context.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.pub: zmq.Socket[bytes] = self.context.socket(zmq.PUB)
        self.pub.linger = 0
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bind_path)  # the socket of a relay that died
        self.pub.bind(relay_url(bind_path))
        os.chmod(bind_path, 0o600)
        self.codec = WireCodec(key)
        self.writer = BatchWriter(self.codec, uuid.uuid4().hex)
        self.commands = commands
        self.urls: set[str] = set()
        self.messages = 0
        self.dropped = 0
        self._inbuf = b""

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        poller.register(self.commands, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if self.commands in ready and not self._read_commands():
                return
            if self.sub in ready:
                self.drain()

    def _read_commands(self) -> bool:
        """Apply the agent's commands; False once the agent closed the pipe."""
        chunk = os.read(self.commands, 1 << 16)
        if not chunk:
            return False
        self._inbuf += chunk
        *lines, self._inbuf = self._inbuf.split(b"\n")
        for line in lines:
            url = line[1:].decode()
            if line.startswith(b"+") and url not in self.urls:
                self.sub.connect(url)
                self.urls.add(url)
            elif line.startswith(b"-") and url in self.urls:
                self.urls.discard(url)
                with contextlib.suppress(zmq.ZMQError):
                    self.sub.disconnect(url)
        return True

    def drain(self) -> None:
        """Pass on everything queued now, in batches."""
        writer = self.writer
        while True:
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                signature, parts, buffers = split_message(frames)
                if not self.codec.check(signature, parts):
                    raise WireError("invalid signature")
            except WireError as err:
                self.dropped += 1
                print(f"iopub relay: dropped a message: {err}", file=sys.stderr, flush=True)
                continue
            self.messages += 1
            writer.add(parts, buffers)
            if writer.full():
                self.pub.send_multipart(writer.take())
        if len(writer):
            self.pub.send_multipart(writer.take())

    def close(self) -> None:
        self.sub.close(0)
        self.pub.close(0)
        self.context.term()


def run_relay(key: bytes, bind_path: str, commands: int) -> int:
    """The relay process's body: until the agent closes ``commands``."""
    relay = IopubRelay(key, bind_path, commands)
    try:
        relay.run()
    finally:
        print(
            f"iopub relay: {relay.messages} messages passed on in {relay.writer.count} "
            f"batches, {relay.dropped} dropped",
            file=sys.stderr,
            flush=True,
        )
        relay.close()
    return 0
