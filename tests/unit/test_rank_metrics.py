"""``jupyter_dist.log`` inside a rank: points batched onto IOPub, one step axis per cell."""

from __future__ import annotations

from typing import Any

from jupyter_dist.common.wire_names import METRICS_MSG_TYPE
from jupyter_dist.rank.metrics import MetricsChannel


class Session:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, socket: object, msg_type: str, content: dict[str, Any], **_: Any) -> None:
        self.sent.append((msg_type, content))


class Kernel:
    """What the channel uses of an ipykernel: its session, IOPub socket and parent."""

    def __init__(self) -> None:
        self.session = Session()
        self.iopub_socket = object()

    def get_parent(self) -> dict[str, Any]:
        return {"header": {"msg_id": "cell"}}


def steps_sent(kernel: Kernel) -> list[float]:
    return [
        step
        for kind, c in kernel.session.sent
        if kind == METRICS_MSG_TYPE
        for _, step, _ in c["points"]
    ]


def test_default_steps_count_from_zero_in_every_cell() -> None:
    kernel = Kernel()
    channel = MetricsChannel(kernel)
    channel.pre_execute()
    for value in (3.0, 2.0, 1.0):
        channel.log(None, {"loss": value})
    channel.post_execute()
    assert steps_sent(kernel) == [0.0, 1.0, 2.0]
    kernel.session.sent.clear()
    channel.pre_execute()  # the next cell: its chart starts at step 0 again
    channel.log(None, {"loss": 0.5})
    channel.log(7, {"loss": 0.4})  # an explicit step is kept
    channel.post_execute()
    assert steps_sent(kernel) == [0.0, 7.0]
