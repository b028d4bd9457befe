"""One IOPub socket for every rank of a session: fan-in of the messages a cell costs most.

A rank answers the notebook side's cells on IOPub, behind their output
(`rank.iopub_reply`): all of a cell's messages but its request travel on IOPub. A SUB
socket may connect to any number of publishers, so the session subscribes to all its
ranks' IOPub sockets through one: zmq queues each rank's messages on its own pipe and
hands them over fairly, and a burst from many ranks is read in one drain, with one
wake-up of the event loop, instead of one socket read (and the system calls behind it)
per rank.

Where the ranks' node runs a relay (`node.relay`), the session subscribes to the relay
instead of to each rank: one endpoint a node, and a burst from the node's ranks arrives as
one batch (`common.relay_batch`), checked and parsed once. The plain replies of a node's
ranks to one cell come folded into one entry there; each rank's client does for its
reply what it does for a reply's message (`RankClient.take_reply`), and the replies whose
handlers share a sink (the cell's tracker) go to it together (`ReplySink.take_replies`).

A message says which kernel sent it: the ``session`` of its header, the kernel's own id,
the same on all its channels. The first message of a kernel not yet known is matched by
its parent request (a ``kernel_info_request`` its client sent while connecting,
`expect`), and the kernel's id is remembered from then on. Messages stay signed and
checked; each rank's client routes its own (`RankClient.route_iopub`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any

import zmq

from jupyter_dist.common.relay_batch import (
    folded_replies,
    is_batch,
    plain_reply_content,
    read_batch,
)
from jupyter_dist.common.wire_codec import WireCodec, WireError, message
from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE, FOLDED_REPLIES_MSG_TYPE
from jupyter_dist.control.rank_client import PacedHandler, RankClient, ReplySink
from jupyter_dist.control.zmq_frames import receive, running_loop

log = logging.getLogger(__name__)
#: the drain hands the loop over after this many messages in a row
BURST = 256
#: a wait this long checks the socket for a message it was not woken for
RECHECK_S = 1.0


class IopubFanIn:
    """The IOPub subscriber of one session's rank clients."""

    def __init__(self, context: zmq.Context[Any], key: str, signature_scheme: str) -> None:
        self.socket: zmq.Socket[bytes] = zmq.Socket(context, zmq.SUB)
        self.socket.linger = 0
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.codec = WireCodec(key, signature_scheme)
        self._urls: dict[RankClient, str] = {}
        self._subscribers: collections.Counter[str] = collections.Counter()  # clients a URL
        self._by_session: dict[str, RankClient] = {}
        self._expected: dict[str, RankClient] = {}  # `expect`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recheck: asyncio.TimerHandle | None = None
        self._paused = False
        #: messages of a batch read but not handed over yet (reading paused amid it)
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._tasks: set[asyncio.Future[None]] = set()
        self.closed = False
        self.lost_wakeups = 0
        self.unknown = 0  # messages of kernels no client here knows (dropped)
        #: what the last of those were: (msg_type, the type of the request answered)
        self.last_unknown: collections.deque[tuple[str, str]] = collections.deque(maxlen=8)
        self.welcomes = 0  # a kernel greets each new subscriber before it is known
        self.batches = 0  # batches from node relays, and the messages they carried
        self.batched = 0

    def add(self, client: RankClient, url: str) -> None:
        """Subscribe to ``client``'s kernel at ``url`` (its own socket, or its node's relay,
        which other clients share)."""
        self._urls[client] = url
        self._subscribers[url] += 1
        if self._subscribers[url] == 1:
            self.socket.connect(url)
        self.watch()

    @property
    def endpoints(self) -> set[str]:
        """The sockets subscribed to: one a rank, or one a node with relays."""
        return set(self._subscribers)

    def remove(self, client: RankClient) -> None:
        url = self._urls.pop(client, None)
        for session in [s for s, c in self._by_session.items() if c is client]:
            del self._by_session[session]
        for msg_id in [m for m, c in self._expected.items() if c is client]:
            del self._expected[msg_id]
        if url is None:
            return
        self._subscribers[url] -= 1
        if self._subscribers[url] <= 0:
            del self._subscribers[url]
            if not self.closed:
                with contextlib.suppress(zmq.ZMQError):
                    self.socket.disconnect(url)

    def watch(self) -> None:
        """Read from the running loop's wake-ups (once; a no-op without a loop)."""
        if self._loop is not None:
            return
        self._loop = running_loop()  # none yet: the first `add` in one starts reading
        if self._loop is not None:
            self._loop.add_reader(self.socket.FD, self._on_ready)
            self._recheck = self._loop.call_later(RECHECK_S, self._check)

    def _on_ready(self, from_check: bool = False) -> None:
        if self.closed or self._paused or not self._route_pending():
            return
        for _ in range(BURST):
            try:
                frames = receive(self.socket)
            except zmq.Again:
                return
            except zmq.ZMQError as err:
                if not self.closed:
                    log.warning("reading the ranks' IOPub failed: %r", err)
                return
            if from_check:
                from_check = False
                self.lost_wakeups += 1
            self._pending.extend(self._decode(frames))
            if not self._route_pending():
                return
        asyncio.get_running_loop().call_soon(self._on_ready)

    def _decode(self, frames: list[bytes]) -> list[dict[str, Any]]:
        """The messages of a message or of a relay's batch (none of a bad one)."""
        batch = is_batch(frames)
        try:
            messages = read_batch(self.codec, frames) if batch else [self.codec.decode(frames)]
        except WireError as err:  # unsigned, or not a Jupyter message: dropped
            log.warning("dropped a bad IOPub message: %s", err)
            return []
        if batch:
            self.batches += 1
            self.batched += sum(  # a folded entry carries several ranks' replies
                len(m["content"].get("replies", ()))
                if m["msg_type"] == FOLDED_REPLIES_MSG_TYPE
                else 1
                for m in messages
            )
        return messages

    def _route_pending(self) -> bool:
        """Route the messages read and not yet handed over, until a handler that wants a
        pause has no room (the rest of a batch then waits with it); False if it paused."""
        pending = self._pending
        while pending:
            msg = pending.popleft()
            if msg["msg_type"] == FOLDED_REPLIES_MSG_TYPE:
                handler = self._route_folded(msg)
            else:
                handler = self._route(msg)
            if isinstance(handler, PacedHandler) and not handler.has_room():
                self._pause(handler)
                return False
        return True

    def _route(self, msg: dict[str, Any]) -> Any:
        session = msg["header"].get("session")
        client = self._by_session.get(session) if isinstance(session, str) else None
        if client is None:
            client = self._sender_of(msg)
            if client is None:
                if msg["header"].get("msg_type") == "iopub_welcome":
                    self.welcomes += 1  # answers no request; no client needs it
                else:
                    self.unknown += 1
                    self.last_unknown.append(
                        (
                            str(msg["header"].get("msg_type")),
                            str(msg["parent_header"].get("msg_type")),
                        )
                    )
                return None
            if isinstance(session, str):
                self._by_session[session] = client
        try:
            return client.route_iopub(msg)
        except Exception:
            log.exception("rank %s: handling an iopub message failed", client.rank)
            return None

    def _route_folded(self, msg: dict[str, Any]) -> Any:
        """A relay's folded plain replies of its ranks to one cell (`relay_batch`): each
        to its client, and to its handler's `reply_sink` together with the others there;
        returns the last handler (the caller checks it for room)."""
        parent = msg["parent_header"]
        sinks: dict[int, tuple[ReplySink, list[tuple[int, dict[str, Any]]]]] = {}
        last: Any = None
        by_session = self._by_session
        # the replies of one cell mostly say the same (count and group): one content for
        # all of those (nobody changes it)
        contents: dict[tuple[int, str | None], dict[str, Any]] = {}
        for session, count, group in folded_replies(msg):
            client = by_session.get(session)
            if client is None:  # a kernel no client here knows (a message of it would be)
                self.unknown += 1
                self.last_unknown.append((EXECUTE_REPLY_MSG_TYPE, str(parent.get("msg_type"))))
                continue
            content = contents.get((count, group))
            if content is None:
                content = contents[(count, group)] = plain_reply_content(count, group)
            try:
                handler = client.take_reply(parent, content)
                if handler is None:
                    continue
                last = handler
                if isinstance(handler, PacedHandler) and handler.reply_sink is not None:
                    sink = handler.reply_sink
                    taken = sinks.get(id(sink))
                    if taken is None:
                        taken = sinks[id(sink)] = (sink, [])
                    taken[1].append((handler.rank, content))
                    continue
                header = {"msg_type": EXECUTE_REPLY_MSG_TYPE, "session": session}
                handler("iopub", message(header, parent, {}, content, []))
            except Exception:
                log.exception("rank %s: handling its reply failed", client.rank)
        for sink, replies in sinks.values():
            try:
                sink.take_replies(replies)
            except Exception:
                log.exception("handling the replies of ranks %s failed", [r for r, _ in replies])
        return last

    def expect(self, msg_id: str, client: RankClient | None) -> None:
        """``client`` sent request ``msg_id`` to its kernel alone (None: forget it): the
        IOPub messages answering it tell which kernel id is that client's."""
        if client is None:
            self._expected.pop(msg_id, None)
        else:
            self._expected[msg_id] = client

    def _sender_of(self, msg: dict[str, Any]) -> RankClient | None:
        """The client whose request ``msg`` answers (a kernel's first messages)."""
        parent = msg["parent_header"].get("msg_id")
        return self._expected.get(parent) if isinstance(parent, str) else None

    def _pause(self, handler: Any) -> None:
        self._paused = True

        async def resume() -> None:
            try:
                await handler.room()
            finally:
                self._paused = False
                if not self.closed:
                    self._on_ready()

        task = asyncio.ensure_future(resume())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check(self) -> None:
        if self.closed or self._loop is None:
            return
        self._on_ready(from_check=True)
        self._recheck = self._loop.call_later(RECHECK_S, self._check)

    def close(self) -> None:
        self.closed = True
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.socket.FD)
        if self._recheck is not None:
            self._recheck.cancel()
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            self.socket.close(linger=0)
