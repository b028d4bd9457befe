"""The notebook side's connection to one rank kernel, over the Jupyter protocol.

Four zmq sockets (shell, control, IOPub, stdin) and `common.wire_codec`: it routes every
incoming message to the handler registered for the request it answers, and carries object
push/pull as comm messages with binary buffers. The kernel addresses a cell's
``input_request`` (``input()``, ``getpass()``, a debugger's prompt) to the identity its
request came from, which the client's stdin socket shares with the shell socket its
requests leave by (its own, or its node's relay's, `NodeShell`): ``identity``.

This is the hot path of every cell, once per rank, so it does no more than it must: the
sockets are plain zmq sockets whose file descriptors the event loop watches, and a
callback drains a socket when it becomes readable (no task, future or poller per message,
as tornado's ZMQStream reads); sends go out at once unless the socket is full, and
messages are decoded without jupyter_client's date parsing. Messages stay signed and
checked.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import zmq.asyncio

from jupyter_dist.common.payloads import KernelConnection
from jupyter_dist.common.pickling import Frame
from jupyter_dist.common.wire_codec import Encoded, WireCodec, WireError
from jupyter_dist.common.wire_names import (
    ACK_EVERY,
    ACK_MSG_TYPE,
    CELL_RANKS_KEY,
    CREDIT_KEY,
    EXECUTE_REPLY_MSG_TYPE,
    FOLD_REPLIES_KEY,
    IOPUB_REPLY_KEY,
    NOTEBOOK_COUNT_KEY,
    OBJECTS_TARGET,
)
from jupyter_dist.control import zmq_frames
from jupyter_dist.control.debugger_pause import paused_after
from jupyter_dist.errors import PushError, SessionError

if TYPE_CHECKING:
    from jupyter_dist.control.iopub_fan_in import IopubFanIn
    from jupyter_dist.control.node_shell import NodeShell

log = logging.getLogger(__name__)
#: first wait before kernel_info is repeated (IOPub may not be subscribed yet); doubles
#: on each repeat up to RETRY_MAX_S
RETRY_S = 0.05
RETRY_MAX_S = 1.0
#: a receive waiting this long checks the socket itself for a message it was not woken for
RECHECK_S = 1.0
#: cells of this process whose late output (from threads they started) is still taken
PAST_CELLS = 64
#: a reader hands the loop over after this many messages in a row
BURST = 64
#: a full socket's waiting messages are sent again after this long
SEND_RETRY_S = 0.002
_POLLIN = int(zmq.POLLIN)
#: the sockets of a rank kernel the notebook side uses: (name, type, port key)
CHANNELS = (
    ("shell", zmq.DEALER, "shell_port"),
    ("control", zmq.DEALER, "control_port"),
    ("iopub", zmq.SUB, "iopub_port"),
    ("stdin", zmq.DEALER, "stdin_port"),
)

#: handler(channel, message) for the messages answering one request
Handler = Callable[[str, dict[str, Any]], None]


class ReplySink(Protocol):
    """Where the plain replies of many ranks to one cell go at once (`PacedHandler`)."""

    def take_replies(self, replies: list[tuple[int, dict[str, Any]]]) -> None:
        """``(rank, reply content)`` of each rank that ended the cell fine."""


class PacedHandler:
    """A handler whose reader may have to wait: after each message it hands on, the
    channel's pump awaits `room` before reading the next (so a consumer that falls behind
    holds the messages in the kernel's socket, not in memory)."""

    #: the rank whose messages it takes, and where that rank's plain reply may go with
    #: other ranks' (a node relay's folded replies: `IopubFanIn`); None: to the handler
    rank: int = -1
    reply_sink: ReplySink | None = None

    def __call__(self, channel: str, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def has_room(self) -> bool:
        """Whether the next message may be read now (checked after each one)."""
        return True

    async def room(self) -> None:
        """Return once `has_room`."""
        return None


class RankClient:
    """Kernel client for one rank."""

    def __init__(
        self,
        rank: int,
        connection: KernelConnection,
        key: str,
        context: zmq.asyncio.Context,
        iopub: IopubFanIn | None = None,
        shell: NodeShell | None = None,
        identity: bytes | None = None,
    ) -> None:
        """``iopub``: the session's shared IOPub subscriber (by default the client
        subscribes to its kernel's IOPub on a socket of its own); ``shell``: the socket to
        its node's relay that its shell requests and replies go through (by default a
        socket of its own to its kernel); ``identity``: that shell socket's, which its
        stdin socket takes too (by default the relay's socket's, else a fresh one)."""
        self.rank = rank
        self.identity: bytes = (
            identity
            or (shell.identity if shell is not None else b"")
            or b"jd-" + uuid.uuid4().hex.encode()
        )
        self.connection = connection
        self.codec = WireCodec(key, connection.get("signature_scheme") or "hmac-sha256")
        #: plain sockets, never waiting: the loop wakes `_on_ready` when one is readable
        self.sockets: dict[str, zmq.Socket[bytes]] = {}
        self._readers: list[int] = []
        self._paused: set[str] = set()  # channels left unread until their handler has room
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rechecks: _Rechecks | None = None
        self._outbox: dict[str, collections.deque[list[Any]]] = {}
        self._context = context
        self._fan_in = iopub
        self._node_shell = shell
        self.handlers: dict[str, Handler] = {}
        #: IOPub messages taken of each cell this process sent (acknowledged to the rank)
        self._taken: collections.OrderedDict[str, int] = collections.OrderedDict()
        #: the ended cells this process sent, newest last (`forget`)
        self.past_cells: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: called with ``(rank, msg_type, content, cell msg_id)`` of each status, error
        #: and reply of a cell on IOPub, whoever sent the cell
        self.on_activity: Callable[[int, str, dict[str, Any], str], None] | None = None
        #: called with (rank, text) for output of an ended cell of this process
        self.on_late: Callable[[int, str], None] | None = None
        #: since when (`time.monotonic`) the kernel runs code another client sent (a
        #: console on the rank), as its IOPub echo and status say; None while it does not
        self.others_code_since: float | None = None
        #: when that code last ended (0.0: none ran since this client was made)
        self.others_code_ended = 0.0
        #: since when JupyterLab's debugger (a console's) holds the kernel paused at a
        #: breakpoint or a step, as its ``debug_event`` messages on IOPub say; None while
        #: it does not (`paused_after`)
        self.debugger_paused_since: float | None = None
        self._others_cell: str | None = None
        self._comm_id: str | None = None
        self._comm_waiters: dict[str, asyncio.Future[tuple[dict[str, Any], list[Frame]]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.closed = False
        self.lost_wakeups = 0  # messages found by the reader's own check
        self._open()  # zmq connects in the background: sends queue until the kernel is up

    def _url(self, port_key: str) -> str:
        info: Any = self.connection
        ip, port = info["ip"], info[port_key]
        return f"ipc://{ip}-{port}" if info["transport"] == "ipc" else f"tcp://{ip}:{port}"

    def _open(self) -> None:
        for name, kind, port_key in CHANNELS:
            if kind == zmq.SUB and self._fan_in is not None:
                relay = self.connection.get("relay_iopub")
                self._fan_in.add(self, f"ipc://{relay}" if relay else self._url(port_key))
                continue
            if name == "shell" and self._node_shell is not None:
                self._node_shell.add(self)
                continue
            socket: zmq.Socket[bytes] = zmq.Socket(self._context, kind)
            socket.linger = 0
            if kind == zmq.DEALER and name in ("shell", "stdin"):
                socket.identity = self.identity  # the stdin requests come to it
            if kind == zmq.SUB:
                socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(self._url(port_key))
            self.sockets[name] = socket
            self._outbox[name] = collections.deque()

    # -- connection -------------------------------------------------------------------
    async def connect(
        self, timeout: float, dead: Callable[[], str | None], channel: str = "shell"
    ) -> None:
        """Open the channels and wait until ``channel`` and IOPub both answer (``control``
        answers while the kernel runs a cell: attaching to a busy session).

        IOPub is a PUB/SUB pair and drops messages until the subscription is through, so
        a kernel_info request is repeated until a busy/idle status is seen on IOPub. An
        answer to any of the requests counts, and the repeats back off: a kernel slower
        than the repeats (a loaded machine) must not fall ever further behind a queue
        of requests whose answers nobody waits for any more.
        """
        self._watch()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen, replied = asyncio.Event(), asyncio.Event()
        handler = _kernel_info_handler(seen, replied, channel)
        sent: list[str] = []
        wait = RETRY_S
        try:
            while True:
                sent.append(self.send("kernel_info_request", {}, handler=handler, channel=channel))
                if self._fan_in is not None:  # its IOPub answer tells the kernel's id
                    self._fan_in.expect(sent[-1], self)
                try:
                    await asyncio.wait_for(seen.wait(), wait)
                    await asyncio.wait_for(replied.wait(), max(0.1, deadline - loop.time()))
                    return
                except asyncio.TimeoutError:
                    pass
                wait = min(wait * 2, RETRY_MAX_S)
                reason = dead()
                if reason:
                    raise SessionError(f"rank {self.rank} exited while starting: {reason}")
                if loop.time() > deadline:
                    raise SessionError(
                        f"rank {self.rank}: kernel did not answer within {timeout:.0f} s"
                    )
        finally:
            for msg_id in sent:
                self.handlers.pop(msg_id, None)
                if self._fan_in is not None:
                    self._fan_in.expect(msg_id, None)

    def _watch(self) -> None:
        """Read every channel from the loop's own wake-ups: a callback per readable
        socket that drains it, no task or future per message."""
        if self._fan_in is not None:
            self._fan_in.watch()
        if self._node_shell is not None:
            self._node_shell.watch()
        if self._readers:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        for name, socket in self.sockets.items():
            loop.add_reader(socket.FD, self._on_ready, name)
            self._readers.append(socket.FD)
        if self.sockets:
            self._rechecks = _Rechecks.of(loop)
            self._rechecks.add(self)

    def _on_ready(self, name: str, from_check: bool = False) -> None:
        """Take what ``name``'s socket holds, at most `BURST` messages in a row (the rest
        on the loop's next turn: a flooding rank must not keep the loop from the others).

        Nothing ends reading: a reader that stopped on some error while its socket stays
        open would leave every later reply of that channel unread, and the cells waiting
        for them hanging.
        """
        if self.closed or name in self._paused:
            return
        socket = self.sockets[name]
        for _ in range(BURST):
            try:
                frames = zmq_frames.receive(socket)
            except zmq.Again:
                return
            except zmq.ZMQError as err:
                if not self.closed:
                    log.warning("rank %s: reading its %s channel failed: %r", self.rank, name, err)
                return
            if from_check:
                from_check = False
                self.lost_wakeups += 1
                log.debug("rank %s: %s message found without its wake-up", self.rank, name)
            handler = self._handle(name, frames)
            if isinstance(handler, PacedHandler) and not handler.has_room():
                self._pause(name, handler)
                return
        asyncio.get_running_loop().call_soon(self._on_ready, name)

    def _handle(self, name: str, frames: list[bytes]) -> Handler | None:
        try:
            msg = self.codec.decode(frames)
        except WireError as err:  # unsigned, or not a Jupyter message: dropped
            log.warning("rank %s: dropped a bad %s message: %s", self.rank, name, err)
            return None
        try:
            return self._route(name, msg)
        except Exception:
            log.exception("rank %s: handling a %s message failed", self.rank, name)
            return None

    def _pause(self, name: str, handler: PacedHandler) -> None:
        """Leave ``name``'s messages in the kernel's socket until ``handler`` has room."""
        self._paused.add(name)

        async def resume() -> None:
            try:
                await handler.room()
            finally:
                self._paused.discard(name)
                if not self.closed:
                    self._on_ready(name)

        self._tasks.append(asyncio.ensure_future(resume()))

    def _check_all(self) -> None:
        """Every `RECHECK_S` (`_Rechecks`), look at each socket itself for a message it
        was not woken for. A zmq socket signals new messages through an edge-triggered
        file descriptor, and anything that reads the socket's state (a send on it, among
        others) can use up that edge; the message then sits in the socket while nobody is
        woken for it. That happened to shell replies arriving as the next request went
        out, about once in a few hundred session starts on a loaded machine. A socket
        with nothing in it is told by its events, without a receive that fails."""
        if self.closed:
            return
        for name, socket in self.sockets.items():
            if int(socket.get(zmq.EVENTS)) & _POLLIN:
                self._on_ready(name, from_check=True)

    def route_iopub(self, msg: dict[str, Any]) -> Handler | None:
        """An IOPub message of this client's kernel, read by the session's `IopubFanIn`."""
        return self._route("iopub", msg)

    def take_reply(self, parent_header: dict[str, Any], content: dict[str, Any]) -> Handler | None:
        """The kernel's plain reply (``content``) to the cell ``parent_header``, one of a
        relay's folded replies: what `_route` does for the reply's message, except calling
        its handler, which it returns (the caller hands the reply to it, or to its
        `PacedHandler.reply_sink` with other ranks')."""
        parent = parent_header.get("msg_id")
        if self.on_activity is not None and parent_header.get("msg_type") == "execute_request":
            self.on_activity(self.rank, EXECUTE_REPLY_MSG_TYPE, content, str(parent))
        if not isinstance(parent, str):
            return None
        if parent in self._taken:
            self._took(parent)
        return self.handlers.get(parent)

    def route_shell(self, msg: dict[str, Any]) -> Handler | None:
        """A shell reply of this client's kernel, read by its node's `NodeShell`."""
        return self._route("shell", msg)

    def _route(self, channel: str, msg: dict[str, Any]) -> Handler | None:
        """Hand ``msg`` to whoever waits for it; return the handler it went to."""
        if msg["msg_type"] in ("comm_msg", "comm_close") and channel == "iopub":
            content = msg["content"]
            if content.get("comm_id") == self._comm_id:
                self._comm_reply(msg)
                return None
        if channel == "iopub" and msg["msg_type"] == "debug_event":
            self.debugger_paused_since = paused_after(self.debugger_paused_since, msg["content"])
        parent_header = msg.get("parent_header", {})
        parent = parent_header.get("msg_id")
        if (
            self.on_activity is not None
            and channel == "iopub"
            and msg["msg_type"] in ("status", "error", EXECUTE_REPLY_MSG_TYPE)
            and parent_header.get("msg_type") == "execute_request"
        ):  # whoever sent the cell: the owner keeps every rank's busy/idle and errors
            self.on_activity(self.rank, msg["msg_type"], msg["content"], str(parent))
        handler = self.handlers.get(parent) if parent else None
        if handler is None and channel == "iopub" and parent:
            # the notebook side's cells are not echoed (`rank.kernel_app`): an echoed
            # one is another client's, a console's, until its kernel is idle again
            if msg["msg_type"] == "execute_input":
                self._others_cell = parent
                self.others_code_since = time.monotonic()
            elif (
                parent == self._others_cell
                and msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "idle"
            ):
                self._others_cell, self.others_code_since = None, None
                self.others_code_ended = time.monotonic()
        if channel == "iopub" and parent in self._taken:
            self._took(parent)
        if handler is not None:
            handler(channel, msg)
        elif parent in self.past_cells and msg["msg_type"] == "stream" and self.on_late:
            # a thread one of this process's cells started prints after the cell ended
            self.on_late(self.rank, str(msg["content"].get("text", "")))
        return handler

    # -- requests ---------------------------------------------------------------------
    def send(
        self,
        msg_type: str,
        content: dict[str, Any],
        handler: Handler | None = None,
        channel: str = "shell",
        buffers: Sequence[Frame] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        msg_id, frames = self.codec.encode(
            msg_type, content, metadata=metadata, buffers=list(buffers) if buffers else ()
        )
        if handler is not None:
            self.handlers[msg_id] = handler
        self._send(channel, frames)
        return msg_id

    def _send(self, channel: str, frames: list[Any]) -> None:
        """Send at once, unless the socket is full or earlier messages still wait: then
        after them, in order, from a task."""
        if channel == "shell" and self._node_shell is not None:
            self._node_shell.send((self.rank,), frames)
            return
        outbox = self._outbox[channel]
        outbox.append(frames)
        if len(outbox) == 1:
            self._flush(channel)

    def _flush(self, channel: str) -> None:
        """Send what waits in ``channel``'s outbox; retry shortly if the socket is full."""
        outbox = self._outbox[channel]
        socket = self.sockets[channel]
        while outbox and not self.closed:
            try:
                zmq_frames.send(socket, outbox[0])
            except zmq.Again:
                asyncio.get_running_loop().call_later(SEND_RETRY_S, self._flush, channel)
                return
            except zmq.ZMQError as err:
                log.warning("rank %s: sending on %s failed: %r", self.rank, channel, err)
                outbox.clear()
                return
            outbox.popleft()

    def prepare_execute(
        self,
        code: str,
        silent: bool = False,
        execution_count: int | None = None,
        cell_ranks: int | None = None,
        allow_stdin: bool = False,
    ) -> Encoded:
        """A cell's execute_request, signed: the same bytes go to every rank whose client
        shares this one's key (`shares_key`), so a cell is encoded once, not once a rank.
        ``execution_count``: the notebook's count for it, which the rank's tracebacks
        then name (``Cell In[N]``), as the notebook does. ``cell_ranks``: how many ranks
        it goes to (a rank makes a destroyed process group again only for a cell of all).
        ``allow_stdin``: the ranks may ask for input (the notebook's frontend answers
        input requests); else their ``input()`` raises as in a frontend without stdin."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": allow_stdin,
            "stop_on_error": False,  # one cell at a time: nothing of others to abort
        }
        # this process paces its output, and reads the reply on IOPub, behind the output
        # (and the ranks' plain replies folded by their node's relay: `relay_batch`)
        metadata: dict[str, Any] = {CREDIT_KEY: True, IOPUB_REPLY_KEY: True, FOLD_REPLIES_KEY: True}
        if execution_count:
            metadata[NOTEBOOK_COUNT_KEY] = execution_count
        if cell_ranks is not None:
            metadata[CELL_RANKS_KEY] = cell_ranks
        return self.codec.encode("execute_request", content, metadata=metadata)

    def shares_key(self, other: RankClient) -> bool:
        return self.codec.same_signer(other.codec)

    def execute(
        self,
        code: str,
        handler: Handler,
        silent: bool = False,
        execution_count: int | None = None,
        prepared: Encoded | None = None,
        fan_out: FanOut | None = None,
    ) -> str:
        """Send a cell (``prepared`` by `prepare_execute` of a client sharing the key, or
        encoded here); with ``fan_out``, a client whose shell goes through its node's relay
        leaves the sending to it (once a node)."""
        msg_id, frames = prepared or self.prepare_execute(code, silent, execution_count)
        self.handlers[msg_id] = handler
        self._taken[msg_id] = 0
        self._send_shared(msg_id, frames, fan_out)
        return msg_id

    def _send_shared(self, msg_id: str, frames: list[Any], fan_out: FanOut | None) -> None:
        """Send a request that other ranks may get too: with ``fan_out``, through it (once
        to this rank's node's relay), else on this client's own way."""
        if fan_out is not None and self._node_shell is not None:
            fan_out.add(self._node_shell, self.rank, msg_id, frames)
        else:
            self._send("shell", frames)

    def _took(self, parent: str) -> None:
        """One IOPub message of our cell ``parent`` was taken: acknowledge every
        `ACK_EVERY` (the rank sends at most `CREDIT_WINDOW` ahead of them)."""
        taken = self._taken[parent] = self._taken[parent] + 1
        if taken % ACK_EVERY == 0:
            self.send(ACK_MSG_TYPE, {"cell": parent, "count": taken}, channel="control")

    def forget(self, msg_id: str) -> None:
        if self.handlers.pop(msg_id, None) is not None:
            past, taken = self.past_cells, self._taken
            past[msg_id] = None
            if len(past) > PAST_CELLS:  # one more than kept: one out
                past.popitem(last=False)
            while len(taken) > PAST_CELLS:
                taken.popitem(last=False)

    def answer_input(self, value: str) -> None:
        """Answer the kernel's open ``input_request`` with ``value``."""
        self.send("input_reply", {"value": value}, channel="stdin")

    def interrupt(self) -> None:
        """Ask the kernel to interrupt itself (it signals its whole process group)."""
        self.send("interrupt_request", {}, channel="control")

    def shutdown(self) -> None:
        self.send("shutdown_request", {"restart": False}, channel="control")

    # -- objects ------------------------------------------------------------------------
    def objects_comm(self, comm_id: str | None = None) -> str:
        """The id of the kernel's objects channel, opened now (``comm_open``) under
        ``comm_id`` (one for every rank: their requests can then be the same message) if
        none is open."""
        if self._comm_id is None:
            self._comm_id = comm_id or uuid.uuid4().hex
            self.send(
                "comm_open",
                {"comm_id": self._comm_id, "target_name": OBJECTS_TARGET, "data": {}},
            )
        return self._comm_id

    def objects_request(
        self,
        data: dict[str, Any],
        request_id: str,
        buffers: Sequence[Frame] = (),
        prepared: Encoded | None = None,
        fan_out: FanOut | None = None,
    ) -> tuple[asyncio.Future[tuple[dict[str, Any], list[Frame]]], Encoded]:
        """Send ``data`` (and ``buffers``) on the objects channel (`objects_comm`); returns
        the future of the kernel's answer and the request, which ``prepared`` takes for
        another client on the same channel id and key (the same bytes for every rank:
        with ``fan_out``, sent once a node)."""
        comm_id = self.objects_comm()
        fut: asyncio.Future[tuple[dict[str, Any], list[Frame]]]
        fut = asyncio.get_running_loop().create_future()
        self._comm_waiters[request_id] = fut
        fut.add_done_callback(lambda _: self._comm_waiters.pop(request_id, None))
        if prepared is None:
            content = {"comm_id": comm_id, "data": {**data, "id": request_id}}
            prepared = self.codec.encode("comm_msg", content, buffers=list(buffers))
        self._send_shared(*prepared, fan_out)
        return fut, prepared

    def _comm_reply(self, msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "comm_close":
            self._comm_id = None
            self.fail_waiters(
                PushError(
                    f"rank {self.rank} closed the objects channel (was the rank bootstrapped?)"
                )
            )
            return
        data = msg["content"].get("data", {})
        fut = self._comm_waiters.get(data.get("id", ""))
        if fut is not None and not fut.done():
            fut.set_result((data, list(msg.get("buffers") or [])))

    def fail_waiters(self, error: Exception) -> None:
        for fut in self._comm_waiters.values():
            if not fut.done():
                fut.set_exception(error)

    async def close(self) -> None:
        self.closed = True
        if self._fan_in is not None:
            self._fan_in.remove(self)
        if self._node_shell is not None:
            self._node_shell.remove(self)
        if self._loop is not None:
            for fd in self._readers:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(fd)
        self._readers.clear()
        if self._rechecks is not None:
            self._rechecks.discard(self)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for socket in self.sockets.values():
            with contextlib.suppress(Exception):
                socket.close(linger=0)


class _Rechecks:
    """One timer a loop for every client's `RankClient._check_all`: a session of 32 ranks
    wakes the loop once every `RECHECK_S` for them, not 32 times. It holds neither the
    loop nor the clients (a loop dropped with clients never closed leaves nothing
    behind)."""

    def __init__(self) -> None:
        self.clients: weakref.WeakSet[RankClient] = weakref.WeakSet()
        self._armed = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Rechecks:
        rechecks = _RECHECKS.get(loop)
        if rechecks is None:
            rechecks = _RECHECKS[loop] = cls()
        return rechecks

    def add(self, client: RankClient) -> None:
        """Check ``client`` from now on (on the running loop)."""
        self.clients.add(client)
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_later(RECHECK_S, self._run)

    def discard(self, client: RankClient) -> None:
        self.clients.discard(client)

    def _run(self) -> None:
        for client in list(self.clients):
            try:
                client._check_all()
            except Exception:  # one client's failure must not stop the others' checks
                log.exception("rank %s: checking its sockets failed", client.rank)
        self._armed = bool(self.clients)
        if self._armed:
            asyncio.get_running_loop().call_later(RECHECK_S, self._run)


_RECHECKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Rechecks] = (
    weakref.WeakKeyDictionary()
)


class FanOut:
    """One request for many ranks, sent once to each node's relay (`NodeShell`) that
    serves some of them."""

    def __init__(self) -> None:
        self._sends: dict[tuple[NodeShell, str], tuple[list[Any], list[int]]] = {}

    def add(self, shell: NodeShell, rank: int, msg_id: str, frames: list[Any]) -> None:
        send = self._sends.get((shell, msg_id))
        if send is None:
            send = self._sends[(shell, msg_id)] = (frames, [])
        send[1].append(rank)

    def send(self) -> None:
        for (shell, _), (frames, ranks) in self._sends.items():
            shell.send(ranks, frames)
        self._sends.clear()


def _kernel_info_handler(seen: asyncio.Event, replied: asyncio.Event, asked: str) -> Handler:
    """Sets ``seen`` on the request's IOPub status, ``replied`` on its reply."""

    def on_msg(channel: str, msg: dict[str, Any]) -> None:
        if channel == "iopub" and msg["msg_type"] == "status":
            seen.set()
        elif channel == asked:
            replied.set()

    return on_msg
