"""One subscriber reads every rank's IOPub and hands each message to its own rank's
client, by the kernel id in the header, learnt from the kernel's first answer."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import zmq
import zmq.asyncio

from jupyter_dist.common.events import RankFinished
from jupyter_dist.common.relay_batch import BatchWriter, split_message
from jupyter_dist.common.wire_codec import WireCodec
from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE
from jupyter_dist.control.cell_tracker import CellTracker
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.iopub_fan_in import IopubFanIn
from jupyter_dist.control.rank_client import RankClient

KEY = "fan-in-key"


class Kernel:
    """A publisher standing in for a rank kernel's IOPub (its own session id)."""

    def __init__(self, context: zmq.Context[Any], url: str, key: str = KEY) -> None:
        self.socket = context.socket(zmq.PUB)
        self.socket.bind(url)
        self.codec = WireCodec(key)
        self.url = url

    def publish(self, parent: str, text: str, buffers: tuple[bytes, ...] = ()) -> None:
        _id, frames = self.codec.encode(
            "stream", {"name": "stdout", "text": text}, parent={"msg_id": parent}, buffers=buffers
        )
        self.socket.send_multipart([b"kernel.stream", *frames])

    def welcome(self) -> None:
        """What a kernel sends each new subscriber: answers no request."""
        _id, frames = self.codec.encode("iopub_welcome", {"subscription": ""}, parent={})
        self.socket.send_multipart([b"", *frames])


class Client:
    """What the fan-in needs of a rank client: where its kernel's messages go."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.got: list[str] = []
        self.buffers: list[bytes] = []

    def route_iopub(self, msg: dict[str, Any]) -> None:
        self.got.append(msg["content"]["text"])
        self.buffers.extend(bytes(b) for b in msg["buffers"])


async def greet(kernels: list[Kernel], clients: list[Client], tries: int = 200) -> None:
    """Subscriptions reach publishers in the background: each kernel publishes an answer
    to its client's first request until the client has heard it."""
    for _ in range(tries):
        for kernel, client in zip(kernels, clients, strict=True):
            if not client.got:
                kernel.publish(f"info-{client.rank}", "hello")
        await asyncio.sleep(0.02)
        if all(c.got for c in clients):
            return


async def _exchange(folder: str) -> tuple[list[Client], IopubFanIn]:
    context: zmq.Context[Any] = zmq.Context()
    kernels = [Kernel(context, f"ipc://{folder}/k{r}") for r in range(3)]
    clients = [Client(r) for r in range(3)]
    fan_in = IopubFanIn(context, KEY, "hmac-sha256")
    for kernel, client in zip(kernels, clients, strict=True):
        fan_in.add(client, kernel.url)  # type: ignore[arg-type]
        fan_in.expect(f"info-{client.rank}", client)  # type: ignore[arg-type]
    # a kernel subscribed to whose messages answer nothing its client asked: dropped
    stranger, silent = Kernel(context, f"ipc://{folder}/stranger"), Client(9)
    fan_in.add(silent, stranger.url)  # type: ignore[arg-type]
    try:
        await greet(kernels, clients)
        # from now on each kernel is known by its id: a shared parent (one request sent
        # to every rank) still reaches the right client
        cell = uuid.uuid4().hex
        for kernel in reversed(kernels):
            kernel.publish(cell, f"from {kernels.index(kernel)}")
        stranger.publish(cell, "nobody asked")
        for _ in range(200):
            await asyncio.sleep(0.02)
            if all(len(c.got) >= 2 and c.got[-1].startswith("from") for c in clients):
                break
        for _ in range(200):  # a greeting of a kernel not known yet: not a stranger's
            stranger.welcome()
            await asyncio.sleep(0.02)
            if fan_in.welcomes:
                break
        return [*clients, silent], fan_in
    finally:
        fan_in.close()
        for kernel in [*kernels, stranger]:
            kernel.socket.close(linger=0)
        context.term()


def test_each_kernels_messages_reach_its_own_client(tmp_path: Any) -> None:
    *clients, silent = asyncio.run(_exchange(str(tmp_path)))[0]
    for client in clients:
        assert set(client.got) == {"hello", f"from {client.rank}"}, client.got
    assert silent.got == []


def test_a_kernel_that_answers_nothing_asked_is_dropped_and_counted(tmp_path: Any) -> None:
    _clients, fan_in = asyncio.run(_exchange(str(tmp_path)))
    assert fan_in.unknown >= 1
    assert fan_in.welcomes >= 1


def _folded_batch(kernels: list[WireCodec], cell: str, key: str = KEY) -> list[Any]:
    """A node relay's batch of every kernel's plain reply to ``cell``, folded."""
    writer = BatchWriter(WireCodec(key), "relay-1")
    writer.fold_replies_to(cell)
    for count, kernel in enumerate(kernels, start=1):
        content = {"status": "ok", "execution_count": count, "user_expressions": {}}
        _id, frames = kernel.encode(
            EXECUTE_REPLY_MSG_TYPE,
            {**content, "payload": []},
            parent={"msg_id": cell, "msg_type": "execute_request"},
        )
        _topic, _signature, parts, buffers = split_message([b"kernel.reply", *frames])
        writer.add_iopub(parts, buffers)
    return [bytes(f) for f in writer.take()]


def test_folded_replies_end_every_rank_of_the_cell_at_once(tmp_path: Any) -> None:
    """The bulk path: one entry for 32 ranks' replies; each rank's client and session see
    its reply, and the cell's tracker finishes every rank, none left out."""
    context = zmq.asyncio.Context()
    fan_in = IopubFanIn(context, KEY, "hmac-sha256")
    connection: Any = {"transport": "ipc", "ip": str(tmp_path / "k")}
    connection.update({"shell_port": 1, "control_port": 2, "iopub_port": 3, "stdin_port": 4})
    clients = [RankClient(r, connection, KEY, context, iopub=fan_in) for r in range(32)]
    kernels = [WireCodec(KEY) for _ in clients]
    activity: list[tuple[int, str, str]] = []
    for client, kernel in zip(clients, kernels, strict=True):
        fan_in._by_session[kernel.session] = client  # as learnt from its first answer
        client.on_activity = lambda rank, kind, _content, cell: activity.append((rank, kind, cell))
    events = EventQueue()
    tracker = CellTracker({r: ("node", r) for r in range(32)}, events)
    # the cell as `RankGroup` sends it: one request, a handler a rank
    cell = "cell-1"
    for client in clients:
        client.handlers[cell] = tracker.handler(client.rank)
        client._taken[cell] = 0
    try:
        fan_in._pending.extend(fan_in._decode(_folded_batch(kernels[:20], cell)))
        # a forged batch (another key) and a replayed one are dropped whole
        fan_in._pending.extend(fan_in._decode(_folded_batch(kernels[20:], cell, "another key")))
        assert fan_in._route_pending()
        assert tracker.busy_ranks == list(range(20, 32))
        again = _folded_batch(kernels[20:], cell)
        fan_in._pending.extend(fan_in._decode(again))
        assert fan_in._decode(again) == []
        assert fan_in._route_pending()
        assert tracker.done.is_set() and tracker.busy_ranks == []
        result = tracker.result()
        assert result.failures == () and sorted(result.elapsed) == list(range(32))
        finished = [e for e in events.take_all() if isinstance(e, RankFinished)]
        assert sorted(e.rank for e in finished) == list(range(32))
        assert {e.status for e in finished} == {"ok"}
        assert [p.reply["execution_count"] for p in tracker.progress.values()] == [
            *range(1, 21),
            *range(1, 13),
        ]
        assert sorted(activity) == [(r, EXECUTE_REPLY_MSG_TYPE, cell) for r in range(32)]
        assert all(client._taken[cell] == 1 for client in clients)
        assert fan_in.batches == 2 and fan_in.unknown == 0
    finally:
        fan_in.close()
        for client in clients:
            for socket in client.sockets.values():
                socket.close(linger=0)
        context.term()


def test_a_folded_reply_of_an_unknown_kernel_is_counted_and_the_others_go_on(
    tmp_path: Any,
) -> None:
    context = zmq.asyncio.Context()
    fan_in = IopubFanIn(context, KEY, "hmac-sha256")
    got: list[tuple[str, dict[str, Any]]] = []

    class Known:
        rank = 0

        def take_reply(self, parent: dict[str, Any], content: dict[str, Any]) -> Any:
            return lambda channel, msg: got.append((channel, msg))

    known, stranger = WireCodec(KEY), WireCodec(KEY)
    fan_in._by_session[known.session] = Known()  # type: ignore[assignment]
    try:
        fan_in._pending.extend(fan_in._decode(_folded_batch([stranger, known], "cell-1")))
        assert fan_in._route_pending()
        assert fan_in.unknown == 1
        # a handler with no reply sink gets the reply as its message
        ((channel, msg),) = got
        assert channel == "iopub" and msg["msg_type"] == EXECUTE_REPLY_MSG_TYPE
        assert msg["header"]["session"] == known.session
        assert msg["parent_header"]["msg_id"] == "cell-1"
        assert msg["content"]["execution_count"] == 2
    finally:
        fan_in.close()
        context.term()
