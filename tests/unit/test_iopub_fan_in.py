"""One subscriber reads every rank's IOPub and hands each message to its own rank's
client, by the kernel id in the header, learnt from the kernel's first answer."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import zmq

from jupyter_dist.common.wire_codec import WireCodec
from jupyter_dist.control.iopub_fan_in import IopubFanIn

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
