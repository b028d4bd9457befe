"""A widget update waiting in a rank's IO queue is skipped when a later one replaces it;
nothing else is skipped or reordered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jupyter_client.session import Session

from jupyter_dist.rank.superseded_updates import Superseded

SESSION = Session(key=b"secret")


def comm_msg(comm: str, data: dict[str, Any], buffers: list[bytes] | None = None) -> list[Any]:
    """A comm message serialized as ipykernel's comms send it, with their topic."""
    msg = SESSION.msg("comm_msg", {"comm_id": comm, "data": data})
    return [f"comm-{comm}".encode(), *SESSION.serialize(msg), *(buffers or [])]


def update(comm: str, buffers: list[bytes] | None = None, **state: Any) -> list[Any]:
    paths = [["picture"]] if buffers else []
    return comm_msg(comm, {"method": "update", "state": state, "buffer_paths": paths}, buffers)


def stream(text: str) -> list[Any]:
    return [b"stream.stdout", *SESSION.serialize(SESSION.msg("stream", {"text": text}))]


class IOThread:
    """What ipykernel's IO thread would send, in order, once it runs what is queued."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], None]] = []
        self.sent: list[str] = []
        self.superseded = Superseded(self.queued.append)

    def send(self, frames: list[Any], label: str) -> None:
        self.superseded.schedule(frames, lambda: self.sent.append(label))

    def run(self) -> list[str]:
        for send in self.queued:
            send()
        self.queued.clear()
        return self.sent


def test_only_the_last_of_a_widgets_queued_updates_is_sent() -> None:
    io = IOThread()
    for i in range(400):
        io.send(update("bar", value=i), f"bar={i}")
    assert io.run() == ["bar=399"]
    assert io.superseded.dropped == 399


def test_updates_of_several_widgets_keep_each_ones_last_in_order() -> None:
    io = IOThread()
    for i in range(3):
        io.send(update("bar", value=i), f"bar={i}")
        io.send(update("text", value=f"{i}/3"), f"text={i}")
    assert io.run() == ["bar=2", "text=2"]


def test_an_update_setting_fewer_keys_does_not_replace_one_setting_more() -> None:
    io = IOThread()
    io.send(update("bar", value=1, description="a"), "value and description")
    io.send(update("bar", value=2), "value")
    io.send(update("bar", description="b"), "description")
    io.send(update("bar", value=3), "value again")
    assert io.run() == ["value and description", "description", "value again"]


def test_any_other_message_in_between_keeps_both_updates() -> None:
    """As rich's live display: ``msg_id`` set, what it prints, ``msg_id`` cleared."""
    io = IOThread()
    io.send(update("out", msg_id="cell"), "capture on")
    io.send(stream("frame 1\n"), "stream")
    io.send(update("out", msg_id=""), "capture off")
    custom = comm_msg("bar", {"method": "custom", "content": {}})
    io.send(update("bar", value=1), "bar=1")
    io.send(custom, "custom")
    io.send(update("bar", value=2), "bar=2")
    assert io.run() == ["capture on", "stream", "capture off", "bar=1", "custom", "bar=2"]
    assert io.superseded.dropped == 0


def test_updates_with_binary_buffers_are_all_sent() -> None:
    io = IOThread()
    io.send(update("image", [b"png 1"], picture=None), "image 1")
    io.send(update("image", [b"png 2"], picture=None), "image 2")
    assert io.run() == ["image 1", "image 2"]


def test_an_update_the_io_thread_already_sent_stays_sent() -> None:
    io = IOThread()
    io.send(update("bar", value=1), "bar=1")
    assert io.run() == ["bar=1"]  # the IO thread kept up
    io.send(update("bar", value=2), "bar=2")
    assert io.run() == ["bar=1", "bar=2"]
    assert io.superseded.dropped == 0
