"""A node's IOPub relay (a real relay process) between publishers standing in for rank
kernels and the session's fan-in: every message reaches its own client, in order, through
one endpoint; a burst goes in batches; a forged message stops at the relay."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from jupyter_dist.control.iopub_fan_in import IopubFanIn
from tests.unit.test_iopub_fan_in import KEY, Client, Kernel, greet


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    path = str(tmp_path / "relay")
    code = "import sys; from jupyter_dist.node.iopub_relay import run_relay; "
    code += f"run_relay({KEY!r}.encode(), {path!r}, sys.stdin.fileno())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


async def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_kernels_messages_come_through_the_relay_in_order_and_in_batches(
    relay: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    proc, path = relay

    async def exchange() -> tuple[list[Client], IopubFanIn]:
        context: zmq.Context[Any] = zmq.Context()
        kernels = [Kernel(context, f"ipc://{tmp_path}/k{r}") for r in range(3)]
        for kernel in kernels:
            _tell(proc, f"+{kernel.url}")
        clients = [Client(r) for r in range(3)]
        fan_in = IopubFanIn(context, KEY, "hmac-sha256")
        for client in clients:
            fan_in.add(client, f"ipc://{path}")  # type: ignore[arg-type]
            fan_in.expect(f"info-{client.rank}", client)  # type: ignore[arg-type]
        try:
            assert fan_in.endpoints == {f"ipc://{path}"}
            # both subscriptions (relay to kernels, fan-in to relay) complete in the
            # background
            await greet(kernels, clients, tries=500)
            batches = fan_in.batches
            for i in range(200):  # a burst: all three at once
                for r, kernel in enumerate(kernels):
                    kernel.publish("cell", f"{r}:{i}")
            kernels[0].publish("cell", "big", buffers=(b"\x01" * (1 << 20),))
            await _until(lambda: all(c.got[-1] in (f"{c.rank}:199", "big") for c in clients),
                         "the burst")  # fmt: skip
            assert fan_in.batches - batches < 600 / 4, "a burst went one message at a time"
            # a stopped subscription: that kernel's messages no longer come
            _tell(proc, f"-{kernels[2].url}")
            await asyncio.sleep(0.5)
            for r, kernel in enumerate(kernels):
                kernel.publish("cell", f"{r}:after")
            await _until(lambda: clients[1].got[-1] == "1:after", "the last message")
            await asyncio.sleep(0.2)
            return clients, fan_in
        finally:
            fan_in.close()
            for kernel in kernels:
                kernel.socket.close(linger=0)
            context.term()

    clients, fan_in = asyncio.run(exchange())
    for client in clients:
        burst = [t for t in client.got if t.startswith(f"{client.rank}:") and t[2:].isdigit()]
        assert burst == [f"{client.rank}:{i}" for i in range(200)], client.got[:10]
    assert clients[0].got[-2:] == ["big", "0:after"]
    assert clients[0].buffers == [b"\x01" * (1 << 20)]
    assert "2:after" not in clients[2].got
    assert fan_in.unknown == 0
    assert proc.stdin is not None
    proc.stdin.close()  # the agent's end of the pipe: the relay exits
    assert proc.wait(20) == 0
    assert proc.stderr is not None
    assert "0 dropped" in proc.stderr.read()


def test_a_message_not_signed_with_the_session_key_stops_at_the_relay(
    relay: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    proc, path = relay

    async def exchange() -> Client:
        context: zmq.Context[Any] = zmq.Context()
        kernel = Kernel(context, f"ipc://{tmp_path}/k0")
        forger = Kernel(context, f"ipc://{tmp_path}/forger", key="not the session's")
        forger.codec.session = kernel.codec.session  # claims to be the kernel
        _tell(proc, f"+{kernel.url}")
        _tell(proc, f"+{forger.url}")
        client = Client(0)
        fan_in = IopubFanIn(context, KEY, "hmac-sha256")
        fan_in.add(client, f"ipc://{path}")  # type: ignore[arg-type]
        fan_in.expect("info", client)  # type: ignore[arg-type]
        try:
            for _ in range(500):
                kernel.publish("info", "hello")
                forger.publish("info", "forged")
                await asyncio.sleep(0.02)
                if client.got:
                    break
            await asyncio.sleep(0.3)
            return client
        finally:
            fan_in.close()
            kernel.socket.close(linger=0)
            forger.socket.close(linger=0)
            context.term()

    client = asyncio.run(exchange())
    assert client.got and set(client.got) == {"hello"}
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(20)
    assert proc.stderr is not None
    assert "dropped a message: invalid signature" in proc.stderr.read()
