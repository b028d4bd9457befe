"""A node's relay (a real relay process) between sockets standing in for rank kernels and
the notebook side's own readers (`IopubFanIn`, `NodeShell`): every message reaches its own
client, in order, through one endpoint a channel; a burst goes in batches; a request for
many ranks is sent once and reaches each; a forged message stops at the relay."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import zmq

from jupyter_dist.common.wire_codec import DELIMITER, WireCodec
from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE, FOLD_REPLIES_KEY
from jupyter_dist.control.iopub_fan_in import IopubFanIn
from jupyter_dist.control.node_shell import NodeShell
from jupyter_dist.node.relay import IOPUB_SOCKET, SHELL_SOCKET
from tests.unit.test_iopub_fan_in import KEY, Client, Kernel, greet

Relay = tuple[subprocess.Popen[str], Path]


class ShellClient(Client):
    """A rank client as the node shell sees it: replies by rank."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.replies: list[dict[str, Any]] = []

    def route_shell(self, msg: dict[str, Any]) -> None:
        self.replies.append(msg)


class ReplyClient(ShellClient):
    """A rank client that takes its kernel's folded plain replies, noting which of the
    fan-in's batches each came in."""

    def __init__(self, rank: int, fan_in: IopubFanIn) -> None:
        super().__init__(rank)
        self.fan_in = fan_in
        self.taken: list[tuple[str, int]] = []  # (cell, batch)

    def take_reply(self, parent: dict[str, Any], content: dict[str, Any]) -> None:
        assert content["status"] == "ok"
        self.taken.append((parent["msg_id"], self.fan_in.batches))


@pytest.fixture
def relay(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Relay]:
    """A relay process; ``indirect`` parametrizing gives it its `HOLD_S`."""
    hold = f", {float(request.param)!r}" if hasattr(request, "param") else ""
    code = "import sys; from jupyter_dist.node.relay import run_relay; "
    code += f"run_relay({KEY!r}.encode(), {str(tmp_path)!r}, sys.stdin.fileno(){hold})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc, tmp_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _stop(proc: subprocess.Popen[str]) -> str:
    """Close the relay's command pipe (the agent's end): it exits; its log."""
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.close()
    assert proc.wait(20) == 0
    return proc.stderr.read()


async def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_kernels_iopub_comes_through_the_relay_in_order_and_in_batches(
    relay: Relay,
) -> None:
    """What the relay finds queued when it wakes goes on as one batch: a burst published
    while the relay is held (stopped, as a busy machine may leave it) comes through in a
    few batches, each kernel's messages in order. How many messages a batch holds when the
    relay is not held is the machine's to say, not the test's."""
    proc, folder = relay
    url = f"ipc://{folder / IOPUB_SOCKET}"

    async def exchange() -> tuple[list[Client], IopubFanIn, int]:
        context: zmq.Context[Any] = zmq.Context()
        kernels = [Kernel(context, f"ipc://{folder}/k{r}") for r in range(3)]
        for r, kernel in enumerate(kernels):
            _tell(proc, f"+{r} {kernel.url} ipc://{folder}/shell{r}")
        clients = [Client(r) for r in range(3)]
        fan_in = IopubFanIn(context, KEY, "hmac-sha256")
        for client in clients:
            fan_in.add(client, url)  # type: ignore[arg-type]
            fan_in.expect(f"info-{client.rank}", client)  # type: ignore[arg-type]
        # the relay's connection to kernel 2 ends when it stops serving rank 2
        left = kernels[2].socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            assert fan_in.endpoints == {url}
            # both subscriptions (relay to kernels, fan-in to relay) complete in the
            # background
            await greet(kernels, clients, tries=500)
            assert all(c.got for c in clients), "the kernels were not heard through the relay"
            batches = fan_in.batches
            proc.send_signal(signal.SIGSTOP)  # a burst piles up in front of the relay
            try:
                for i in range(200):  # a burst: all three at once
                    for r, kernel in enumerate(kernels):
                        kernel.publish("cell", f"{r}:{i}")
                kernels[0].publish("cell", "big", buffers=(b"\x01" * (1 << 20),))
            finally:
                proc.send_signal(signal.SIGCONT)
            await _until(lambda: all(c.got[-1] in (f"{c.rank}:199", "big") for c in clients),
                         "the burst")  # fmt: skip
            burst_batches = fan_in.batches - batches
            _tell(proc, "-2")  # a rank no longer served: its messages no longer come
            await _until(lambda: left.poll(0) != 0, "the relay to leave kernel 2")
            for r, kernel in enumerate(kernels):
                kernel.publish("cell", f"{r}:after")
            await _until(lambda: clients[1].got[-1] == "1:after", "the last message")
            await asyncio.sleep(0.2)  # a chance for a message of rank 2 to (wrongly) come
            return clients, fan_in, burst_batches
        finally:
            fan_in.close()
            left.close(linger=0)
            for kernel in kernels:
                kernel.socket.close(linger=0)
            context.term()

    clients, fan_in, burst_batches = asyncio.run(exchange())
    for client in clients:
        burst = [t for t in client.got if t.startswith(f"{client.rank}:") and t[2:].isdigit()]
        assert burst == [f"{client.rank}:{i}" for i in range(200)], client.got[:10]
    assert clients[0].got[-2:] == ["big", "0:after"]
    assert clients[0].buffers == [b"\x01" * (1 << 20)]
    assert "2:after" not in clients[2].got
    assert fan_in.unknown == 0
    # 601 messages that were queued together: batches of many, not one at a time
    assert burst_batches <= 601 / 4, f"a held burst went in {burst_batches} batches"
    assert "0 dropped" in _stop(proc)


class ShellKernel:
    """A shell socket standing in for a rank kernel's: answers each request it gets."""

    def __init__(self, context: zmq.Context[Any], url: str, rank: int) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.bind(url)
        self.url = url
        self.rank = rank
        self.codec = WireCodec(KEY)
        self.requests: list[dict[str, Any]] = []

    def answer(self) -> None:
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            split = frames.index(DELIMITER)
            msg = self.codec.decode(frames)  # the notebook's own signature, checked
            self.requests.append(msg)
            _, reply = self.codec.encode(
                "execute_reply",
                {"status": "ok", "from": self.rank},
                parent=msg["header"],
                buffers=[b"x" * self.rank] if self.rank else (),
            )
            self.socket.send_multipart([*frames[:split], *reply])


def test_a_request_for_many_ranks_is_sent_once_and_each_reply_reaches_its_rank(
    relay: Relay,
) -> None:
    proc, folder = relay

    async def exchange() -> tuple[list[ShellKernel], list[ShellClient], NodeShell]:
        context: zmq.Context[Any] = zmq.Context()
        kernels = [ShellKernel(context, f"ipc://{folder}/s{r}", r) for r in range(3)]
        for kernel in kernels:
            _tell(proc, f"+{kernel.rank} ipc://{folder}/io{kernel.rank} {kernel.url}")
        shell = NodeShell(context, KEY, "hmac-sha256", f"ipc://{folder / SHELL_SOCKET}")
        clients = [ShellClient(r) for r in range(3)]
        for client in clients:
            shell.add(client)  # type: ignore[arg-type]
        notebook = WireCodec(KEY)
        try:
            _, frames = notebook.encode("execute_request", {"code": "x = 1"})
            shell.send([0, 1, 2], frames)
            _, frames = notebook.encode("execute_request", {"code": "y = 2"})
            shell.send([1], frames)
            _, frames = notebook.encode("execute_request", {"code": "z = 3"})
            shell.send([7], frames)  # a rank this node does not serve

            def answered() -> bool:
                for kernel in kernels:
                    kernel.answer()
                return [len(c.replies) for c in clients] == [1, 2, 1]

            await _until(answered, "the replies")
            await asyncio.sleep(0.2)
            return kernels, clients, shell
        finally:
            shell.close()
            for kernel in kernels:
                kernel.socket.close(linger=0)
            context.term()

    kernels, clients, shell = asyncio.run(exchange())
    assert [[r["content"]["code"] for r in k.requests] for k in kernels] == [
        ["x = 1"],
        ["x = 1", "y = 2"],
        ["x = 1"],
    ]
    first = {k.requests[0]["header"]["msg_id"] for k in kernels}
    assert len(first) == 1  # one request, the same for every rank
    for client in clients:
        assert all(r["content"]["from"] == client.rank for r in client.replies)
        assert all(r["rank"] == client.rank for r in client.replies)
    assert [bytes(b) for b in clients[2].replies[0]["buffers"]] == [b"xx"]
    assert shell.sent == 3 and shell.replies == 4
    log = _stop(proc)
    assert "dropped a request for rank 7, which is not served here" in log
    assert "3 requests fanned out" in log


def test_a_message_not_signed_with_the_session_key_stops_at_the_relay(relay: Relay) -> None:
    proc, folder = relay

    async def exchange() -> Client:
        context: zmq.Context[Any] = zmq.Context()
        kernel = Kernel(context, f"ipc://{folder}/k0")
        forger = Kernel(context, f"ipc://{folder}/forger", key="not the session's")
        forger.codec.session = kernel.codec.session  # claims to be the kernel
        _tell(proc, f"+0 {kernel.url} ipc://{folder}/s0")
        _tell(proc, f"+1 {forger.url} ipc://{folder}/s1")
        client = Client(0)
        fan_in = IopubFanIn(context, KEY, "hmac-sha256")
        fan_in.add(client, f"ipc://{folder / IOPUB_SOCKET}")  # type: ignore[arg-type]
        fan_in.expect("info-0", client)  # type: ignore[arg-type]
        try:
            for _ in range(500):
                kernel.publish("info-0", "hello")
                forger.publish("info-0", "forged")
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
    assert "dropped a message: invalid signature" in _stop(proc)


def test_a_bad_command_is_said_and_the_relay_goes_on(relay: Relay) -> None:
    proc, folder = relay
    _tell(proc, "+x not-a-url")
    _tell(proc, "hello")
    _tell(proc, f"+0 ipc://{folder}/k0 ipc://{folder}/s0")
    log = _stop(proc)
    assert log.count("expected +RANK IOPUB_URL SHELL_URL or -RANK") == 2


def test_only_a_connection_that_got_through_can_lose_the_relays_answers(tmp_path: Path) -> None:
    """Over SSH the local end of a forward accepts and closes at once while the node's
    relay is not listening yet: those connections carried nothing, and no cell is told
    that answers were lost. Once a connection got through zmq's handshake, its end is
    the relay lost."""
    import socket
    import threading

    path = tmp_path / "relay-shell"
    refusing = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    refusing.bind(str(path))
    refusing.listen(16)
    refused = threading.Event()

    def accept_and_close() -> None:
        while True:
            try:
                conn, _ = refusing.accept()
            except OSError:
                return
            conn.close()
            refused.set()

    threading.Thread(target=accept_and_close, daemon=True).start()
    lost: list[list[int]] = []

    async def scenario() -> NodeShell:
        context: zmq.Context[Any] = zmq.Context()
        shell = NodeShell(context, KEY, "hmac-sha256", f"ipc://{path}")
        shell.on_lost = lost.append
        shell.clients[3] = cast(Any, object())  # a rank of this node (only its number is told)
        shell.watch()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not refused.is_set() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # zmq connects again every 0.1 s, and is closed again
        shell._on_monitor()
        assert refused.is_set() and lost == [] and shell.disconnects == 0
        refusing.close()
        path.unlink()
        relay = context.socket(zmq.ROUTER)
        relay.linger = 0
        relay.bind(f"ipc://{path}")
        shell.send([3], [b"ping"])
        assert await asyncio.wait_for(asyncio.to_thread(relay.recv_multipart), 30)
        while not shell.connected and loop.time() < deadline:
            shell._on_monitor()
            await asyncio.sleep(0.05)
        relay.close(0)  # the relay stops
        while not lost and loop.time() < deadline:
            await asyncio.sleep(0.05)
        shell.close()
        context.term()
        return shell

    shell = asyncio.run(scenario())
    assert lost == [[3]] and shell.disconnects == 1


def _publish_reply(kernel: Kernel, cell: str) -> None:
    """A rank's plain reply to ``cell`` on IOPub, as `rank.iopub_reply` sends it."""
    content = {"status": "ok", "execution_count": 1, "user_expressions": {}, "payload": []}
    parent = {"msg_id": cell, "msg_type": "execute_request"}
    _id, frames = kernel.codec.encode(EXECUTE_REPLY_MSG_TYPE, content, parent=parent)
    kernel.socket.send_multipart([b"kernel.execute_reply", *frames])


async def _quick_cell(
    proc: subprocess.Popen[str], folder: Path, replying: list[int]
) -> list[ReplyClient]:
    """A folding cell sent to ranks 0-2 through the relay; the ranks of ``replying``
    reply on IOPub one after another; returns once each of them was taken."""
    context: zmq.Context[Any] = zmq.Context()
    kernels = [Kernel(context, f"ipc://{folder}/k{r}") for r in range(3)]
    shells = [ShellKernel(context, f"ipc://{folder}/s{r}", r) for r in range(3)]
    for r in range(3):
        _tell(proc, f"+{r} {kernels[r].url} {shells[r].url}")
    fan_in = IopubFanIn(context, KEY, "hmac-sha256")
    clients = [ReplyClient(r, fan_in) for r in range(3)]
    shell = NodeShell(context, KEY, "hmac-sha256", f"ipc://{folder / SHELL_SOCKET}")
    for client in clients:
        fan_in.add(client, f"ipc://{folder / IOPUB_SOCKET}")  # type: ignore[arg-type]
        fan_in.expect(f"info-{client.rank}", client)  # type: ignore[arg-type]
        shell.add(client)  # type: ignore[arg-type]
    try:
        await greet(kernels, clients, tries=500)
        assert all(c.got for c in clients), "the kernels were not heard through the relay"
        cell, frames = WireCodec(KEY).encode(
            "execute_request", {"code": "x = 1"}, metadata={FOLD_REPLIES_KEY: True}
        )
        shell.send([0, 1, 2], frames)

        def answered() -> bool:  # the relay passed the request on to every rank
            for kernel in shells:
                kernel.answer()
            return all(c.replies for c in clients)

        await _until(answered, "the request to reach every rank")
        for r in replying:  # ranks ending apart, as they do on a busy machine
            _publish_reply(kernels[r], cell)
            await asyncio.sleep(0.05)
        await _until(lambda: all(clients[r].taken for r in replying), "the replies")
        await asyncio.sleep(0.1)  # a chance for a reply to (wrongly) come twice
        return clients
    finally:
        shell.close()
        fan_in.close()
        for socket in [*(k.socket for k in kernels), *(k.socket for k in shells)]:
            socket.close(linger=0)
        context.term()


@pytest.mark.parametrize("relay", [600.0], indirect=True)
def test_the_plain_replies_of_a_quick_cell_come_in_one_batch(relay: Relay) -> None:
    """Ranks that end a cell one after another: the relay holds the first replies back
    for the last (its hold is long here), and the notebook side reads them all in one
    batch, one folded entry."""
    proc, folder = relay
    clients = asyncio.run(_quick_cell(proc, folder, [0, 1, 2]))
    taken = [c.taken for c in clients]
    assert all(len(t) == 1 for t in taken), taken
    assert len({batch for t in taken for _cell, batch in t}) == 1, taken
    assert "0 dropped" in _stop(proc)


@pytest.mark.parametrize("relay", [0.2], indirect=True)
def test_replies_held_for_a_rank_that_never_replies_go_after_the_hold(
    relay: Relay,
) -> None:
    proc, folder = relay
    clients = asyncio.run(_quick_cell(proc, folder, [0, 1]))
    assert [len(c.taken) for c in clients] == [1, 1, 0]
    assert "0 dropped" in _stop(proc)
