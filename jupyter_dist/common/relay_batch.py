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

**Folded replies.** Most of a quick cell's answer, at many ranks, is one message a rank
that says only that the cell ran fine (`EXECUTE_REPLY_MSG_TYPE` with status ok, its
execution count and nothing else). For a cell whose sender says it reads them
(`FOLD_REPLIES_KEY` in the request's metadata, seen by the relay as it passes the request
on: `BatchWriter.fold_replies_to`), the relay folds the run of such replies of its ranks
to that cell that arrived together into one entry (`FOLDED_REPLIES_MSG_TYPE`), whose
content names each kernel (its header's session), its execution count and its process
group (`GROUP_KEY`). Each reply was checked against its own signature first, and the
batch signs the entry as it signs any other. Any other message ends the run, so every
rank's messages keep their order; a reply with output, an error, user expressions,
buffers or metadata travels whole. An entry of this kind is an ordinary entry to a reader
that does not know it (a message no client of it waits for), and a sender that does not
ask never gets one. Told how many of the node's ranks a cell went to
(`BatchWriter.fold_replies_to`), the writer says whether a batch that holds nothing but
such a run still awaits some of them (`BatchWriter.awaits_replies`: the relay may hold it
back a moment for the rest).

The notebook side then pays one receive, one HMAC and one JSON parse a batch instead of
each of them for every message of every rank.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any

from jupyter_dist.common.wire_codec import DELIMITER, Frame, WireCodec, WireError, message
from jupyter_dist.common.wire_names import (
    EXECUTE_REPLY_MSG_TYPE,
    FOLDED_REPLIES_MSG_TYPE,
    GROUP_KEY,
)

MAGIC = b"jd-relay-batch/1"
#: a batch is sent once it holds this many messages...
MAX_MESSAGES = 512
#: ... or this many bytes of JSON parts (a message bigger than that travels alone)
MAX_BYTES = 1 << 20

_decode_json = json.JSONDecoder().decode

#: the most ranks one request may name (a node runs at most a few hundred)
MAX_TARGETS = 4096
#: the newest requests whose replies a relay folds, remembered (an older one's travel whole)
FOLDING = 1024
#: the keys of a plain reply's content (`GROUP_KEY` besides, or not)
_PLAIN_KEYS = frozenset({"status", "execution_count", "user_expressions", "payload"})
_REPLY_TYPE = f'"{EXECUTE_REPLY_MSG_TYPE}"'.encode()
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def plain_reply(parts: Sequence[bytes]) -> tuple[str, str, int, str | None] | None:
    """``(cell msg_id, kernel session, execution count, group)`` of a rank's reply on
    IOPub that says only that the cell ran fine (its content is ipykernel's reply to a
    cell with no user expressions and no payload, and the process group; no metadata);
    None for any other message (``parts``: header, parent, metadata, content)."""
    header, parent, metadata, content = parts
    if metadata != b"{}" or _REPLY_TYPE not in header:
        return None
    try:
        head, cell, reply = (_decode_json(p.decode()) for p in (header, parent, content))
    except ValueError:
        return None
    if not (
        isinstance(head, dict)
        and head.get("msg_type") == EXECUTE_REPLY_MSG_TYPE
        and isinstance(head.get("session"), str)
        and isinstance(cell, dict)
        and isinstance(cell.get("msg_id"), str)
        and isinstance(reply, dict)
        and reply.get("status") == "ok"
        and reply.keys() - {GROUP_KEY} == _PLAIN_KEYS
        and reply["user_expressions"] == {}
        and reply["payload"] == []
        and type(reply["execution_count"]) is int
    ):
        return None
    group = reply.get(GROUP_KEY)
    if GROUP_KEY in reply and not isinstance(group, str):
        return None
    return cell["msg_id"], head["session"], reply["execution_count"], group


def plain_reply_content(count: int, group: str | None) -> dict[str, Any]:
    """The content of the plain reply that a folded entry names (`plain_reply`)."""
    content: dict[str, Any] = {
        "status": "ok",
        "execution_count": count,
        "user_expressions": {},
        "payload": [],
    }
    if group is not None:
        content[GROUP_KEY] = group
    return content


def folded_replies(msg: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    """``(kernel session, execution count, group)`` of each reply a folded entry stands
    for (`read_batch` checked their shape)."""
    return [(s, c, g) for s, c, g in msg["content"]["replies"]]


def _check_folded(content: Any) -> None:
    replies = content.get("replies") if isinstance(content, dict) else None
    if not isinstance(replies, list) or not all(
        isinstance(r, list)
        and len(r) == 3
        and isinstance(r[0], str)
        and type(r[1]) is int
        and (r[2] is None or isinstance(r[2], str))
        for r in replies
    ):
        raise WireError("a relay batch's folded replies are not [[session, count, group], ...]")


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
        #: the cells whose plain replies may be folded (`fold_replies_to`), newest last
        #: with how many of its ranks' replies are still to come (0: not told)
        self.folding: collections.OrderedDict[str, int] = collections.OrderedDict()
        #: the run of plain replies being folded: their cell, its header as it came, and
        #: ``[session, count, group]`` of each
        self._fold_cell: str | None = None
        self._fold_parent = b""
        self._folded: list[list[Any]] = []

    def __len__(self) -> int:
        return len(self._entries) + bool(self._folded)

    def full(self) -> bool:
        return len(self._entries) + len(self._folded) >= MAX_MESSAGES or self._bytes >= MAX_BYTES

    def fold_replies_to(self, cell: str, expected: int = 0) -> None:
        """The sender of request ``cell`` reads folded replies: fold its plain ones.
        ``expected``: how many ranks here it went to (`awaits_replies`)."""
        folding = self.folding
        folding[cell] = expected
        if len(folding) > FOLDING:
            folding.popitem(last=False)

    def awaits_replies(self) -> bool:
        """Whether the batch holds nothing but a run of folded replies to a cell that
        some of its ranks here have not answered yet: the rest may come to go with them."""
        if self._entries or not self._folded:
            return False
        return self.folding.get(self._fold_cell or "", 0) > 0

    def add_iopub(self, parts: Sequence[bytes], buffers: Sequence[Any]) -> None:
        """`add` an IOPub message, folding a plain reply to a cell whose sender asked
        for it into the run of replies before it (`plain_reply`)."""
        if self.folding and _REPLY_TYPE in parts[0]:
            reply = None if buffers else plain_reply(parts)
            if reply is not None and reply[0] in self.folding:
                cell, session, count, group = reply
                self.folding[cell] -= 1
                if cell != self._fold_cell:
                    self._end_fold()
                    self._fold_cell, self._fold_parent = cell, parts[1]
                self._folded.append([session, count, group])
                self._bytes += len(session) + 32
                return
            self._reply_passed(parts)
        self.add(parts, buffers)

    def _reply_passed(self, parts: Sequence[bytes]) -> None:
        """A reply to a folding cell that travels whole (an error, more than ok) is one
        of the cell's replies all the same: the others need not wait for it."""
        try:
            cell = _decode_json(parts[1].decode()).get("msg_id")
        except (ValueError, AttributeError):
            return
        if isinstance(cell, str) and cell in self.folding:
            self.folding[cell] -= 1

    def _end_fold(self) -> None:
        """The run of folded replies, as one entry in its place."""
        if self._folded:
            header = {
                "msg_type": FOLDED_REPLIES_MSG_TYPE,
                "msg_id": f"{self.relay_id}_{self.count}_{len(self._entries)}",
            }
            content = _dumps({"replies": self._folded})
            parts = [_dumps(header).encode(), self._fold_parent, b"{}", content.encode()]
            self._entries.append(b"[" + b",".join(parts) + b",0]")
        self._fold_cell, self._fold_parent, self._folded = None, b"", []

    def add(self, parts: Sequence[bytes], buffers: Sequence[Any], rank: int | None = None) -> None:
        """A message's JSON parts (header, parent, metadata, content), its buffers (bytes
        or `zmq.Frame`, sent on without a copy) and the rank it comes from, if it says."""
        if self._folded:
            self._end_fold()  # it came after them
        tail = f",{len(buffers)}" if rank is None else f",{len(buffers)},{int(rank)}"
        entry = b"[" + b",".join(parts) + tail.encode() + b"]"
        self._entries.append(entry)
        self._buffers.extend(buffers)
        self._bytes += len(entry)

    def take(self) -> list[Any]:
        """The frames of a batch of what was added since the last `take`."""
        self._end_fold()
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
        if header["msg_type"] == FOLDED_REPLIES_MSG_TYPE:
            _check_folded(content)
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
