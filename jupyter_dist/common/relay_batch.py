"""Many ranks' messages as one zmq message: the wire format of a node's relay.

A node's relay (`node.relay`) reads the IOPub and the shell replies of every rank of its
node, checks each message's signature, and hands the notebook side whatever arrived
together as one batch::

    [MAGIC, signature, document, buffers...]

``document`` is one JSON array: a stamp, then an entry per message, ``[header,
parent_header, metadata, content, n_buffers]`` (shell replies add the rank they come
from: a notebook's requests all reach the relay on one socket), built from the messages'
own JSON parts without parsing them; the buffers of all its messages follow in order.
``signature`` is the session key's HMAC over ``MAGIC`` and ``document`` (the stamp is the
relay's id and a count, so no two batches are signed alike and jupyter_client's replay
check applies). Jupyter's own signature leaves buffers out; so does this one.

A request the other way names the ranks it is for in its first frame (`targets_frame`).

The notebook side then pays one receive, one HMAC and one JSON parse a batch instead of
each of them for every message of every rank.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jupyter_dist.common.wire_codec import DELIMITER, Frame, WireCodec, WireError, message

MAGIC = b"jd-relay-batch/1"
#: a batch is sent once it holds this many messages...
MAX_MESSAGES = 512
#: ... or this many bytes of JSON parts (a message bigger than that travels alone)
MAX_BYTES = 1 << 20

_decode_json = json.JSONDecoder().decode

#: the most ranks one request may name (a node runs at most a few hundred)
MAX_TARGETS = 4096


def targets_frame(ranks: list[int]) -> bytes:
    """The first frame of a request for ``ranks`` (`parse_targets` reads it)."""
    return ",".join(str(r) for r in ranks).encode()


def parse_targets(frame: bytes) -> list[int]:
    """The ranks a request names: ``b"0,1,5"``; `ValueError` for anything else."""
    if not frame or len(frame) > 11 * MAX_TARGETS:
        raise ValueError(f"a request names its ranks in {len(frame)} bytes")
    ranks = [int(r) for r in frame.decode("ascii").split(",")]
    if len(ranks) > MAX_TARGETS or min(ranks) < 0:
        raise ValueError(f"a request names {len(ranks)} ranks, from {min(ranks)}")
    return ranks


def split_message(frames: Sequence[Any]) -> tuple[list[Any], bytes, list[bytes], list[Any]]:
    """``(identities, signature, [header, parent, metadata, content], buffers)`` of a
    Jupyter message as zmq hands it over (identities or an IOPub topic, the delimiter, the
    signature, the parts, the buffers)."""
    for i, frame in enumerate(frames):
        if bytes(frame) == DELIMITER:
            start = i + 1
            break
    else:
        raise WireError("no <IDS|MSG> delimiter: not a Jupyter message")
    if len(frames) < start + 5:
        raise WireError(f"{len(frames) - start} frames after the delimiter: expected 5+")
    parts = [bytes(f) for f in frames[start + 1 : start + 5]]
    return list(frames[: start - 1]), bytes(frames[start]), parts, list(frames[start + 5 :])


class BatchWriter:
    """Collects checked messages and makes batches of them (the relay's side)."""

    def __init__(self, codec: WireCodec, relay_id: str) -> None:
        self.codec = codec
        self.relay_id = relay_id
        self.count = 0
        self._entries: list[bytes] = []
        self._buffers: list[Any] = []
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def full(self) -> bool:
        return len(self._entries) >= MAX_MESSAGES or self._bytes >= MAX_BYTES

    def add(self, parts: Sequence[bytes], buffers: Sequence[Any], rank: int | None = None) -> None:
        """A message's JSON parts (header, parent, metadata, content), its buffers (bytes
        or `zmq.Frame`, sent on without a copy) and the rank it comes from, if it says."""
        tail = f",{len(buffers)}" if rank is None else f",{len(buffers)},{int(rank)}"
        entry = b"[" + b",".join(parts) + tail.encode() + b"]"
        self._entries.append(entry)
        self._buffers.extend(buffers)
        self._bytes += len(entry)

    def take(self) -> list[Any]:
        """The frames of a batch of what was added since the last `take`."""
        self.count += 1
        stamp = json.dumps([self.relay_id, self.count]).encode()
        document = b"[" + stamp + b"," + b",".join(self._entries) + b"]"
        frames: list[Any] = [MAGIC, self.codec.sign([MAGIC, document]), document]
        frames.extend(self._buffers)
        self._entries, self._buffers, self._bytes = [], [], 0
        return frames


def is_batch(frames: Sequence[Frame]) -> bool:
    return len(frames) >= 3 and bytes(frames[0]) == MAGIC


def read_batch(codec: WireCodec, frames: Sequence[Frame]) -> list[dict[str, Any]]:
    """The messages of a batch, shaped as `WireCodec.decode` shapes one (and ``rank``,
    where the entry names it); `WireError` for a batch that is unsigned, badly signed,
    replayed or malformed."""
    signature, document = bytes(frames[1]), bytes(frames[2])
    if codec.key:
        if not signature:
            raise WireError("unsigned relay batch")
        if not codec.check(signature, [MAGIC, document]):
            raise WireError("invalid signature on a relay batch")
    try:
        data = _decode_json(document.decode())
    except ValueError as err:
        raise WireError(f"a relay batch is not JSON: {err}") from None
    if not isinstance(data, list) or not data:
        raise WireError("a relay batch is not a list")
    buffers, used = frames[3:], 0
    messages = []
    for entry in data[1:]:
        if not (isinstance(entry, list) and len(entry) in (5, 6) and isinstance(entry[0], dict)):
            raise WireError("a relay batch entry is not [header, parent, metadata, content, n]")
        header, parent, metadata, content, count = entry[:5]
        if "msg_type" not in header or not isinstance(count, int) or count < 0:
            raise WireError("a relay batch entry without msg_type or buffer count")
        msg = message(header, parent, metadata, content, list(buffers[used : used + count]))
        if len(entry) == 6:
            if not isinstance(entry[5], int):
                raise WireError(f"a relay batch entry's rank is {entry[5]!r}, not a number")
            msg["rank"] = entry[5]
        messages.append(msg)
        used += count
    if used != len(buffers):
        raise WireError(f"a relay batch names {used} buffers and carries {len(buffers)}")
    return messages
