"""A credited cell's IOPub messages go at most a window ahead of its sender's acks."""

from __future__ import annotations

import json
import threading
import time

import zmq
from jupyter_client.session import Session

from jupyter_dist.common.wire_names import ACK_MSG_TYPE
from jupyter_dist.rank.iopub_credit import DELIMITER, CreditGate, _parent_id, take_ack


def frames(parent: str) -> list[bytes]:
    header = json.dumps({"msg_id": "m"}).encode()
    return [b"stream", DELIMITER, b"sig", header, json.dumps({"msg_id": parent}).encode(), b"{}"]


def test_the_parent_id_is_read_from_the_serialized_message() -> None:
    assert _parent_id(frames("cell-1")) == "cell-1"
    assert _parent_id([b"no delimiter"]) is None
    assert _parent_id([DELIMITER, b"sig", b"{}", b"not json"]) is None


def test_sends_wait_for_the_senders_acks_beyond_the_window() -> None:
    gate = CreditGate(window=4, give_up_s=30)
    gate.credit("cell")
    for _ in range(4):
        gate.before_send(frames("cell"))  # within the window: no wait
    assert gate.waits == 0
    sent = threading.Event()

    def fifth() -> None:
        gate.before_send(frames("cell"))
        sent.set()

    thread = threading.Thread(target=fifth)
    thread.start()
    assert not sent.wait(0.3)  # held: the sender acknowledged nothing
    gate.ack("cell", 2)
    assert sent.wait(5)
    thread.join()
    assert gate.waits == 1


def test_other_cells_and_uncredited_ones_never_wait() -> None:
    gate = CreditGate(window=1, give_up_s=30)
    gate.credit("paced")
    for _ in range(10):
        gate.before_send(frames("someone-else"))
        gate.before_send([b"not a message"])
    assert gate.waits == 0


def test_a_sender_that_stops_acknowledging_is_given_up() -> None:
    gate = CreditGate(window=1, give_up_s=0.3)
    gate.credit("cell")
    gate.before_send(frames("cell"))
    began = time.monotonic()
    gate.before_send(frames("cell"))  # waits give_up_s, then no longer
    assert time.monotonic() - began >= 0.3
    gate.before_send(frames("cell"))  # forgotten: no wait
    assert gate.waits == 1


def test_a_signed_ack_is_taken_and_anything_else_left_to_ipykernel() -> None:
    session = Session(key=b"secret")
    gate = CreditGate(window=1, give_up_s=30)
    gate.credit("cell")

    def control(session: Session, msg_type: str, content: dict[str, object]) -> list[zmq.Frame]:
        """As the control socket hands a request over (``copy=False``)."""
        msg = session.msg(msg_type, content)
        return [zmq.Frame(f) for f in [b"client-id", *session.serialize(msg)]]

    ack = control(session, ACK_MSG_TYPE, {"cell": "cell", "count": 1})
    assert take_ack(gate, session, ack)
    gate.before_send(frames("cell"))
    gate.before_send(frames("cell"))  # the first was acknowledged: within the window
    assert gate.waits == 0
    forged = control(Session(key=b"other"), ACK_MSG_TYPE, {"cell": "cell", "count": 9})
    assert not take_ack(gate, session, forged)
    assert not take_ack(gate, session, control(session, "interrupt_request", {}))
    assert not take_ack(gate, session, [zmq.Frame(b"no delimiter")])
