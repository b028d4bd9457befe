"""Jupyter protocol messages to and from zmq frames, signed, without the costs nobody reads.

The notebook side handles several messages per rank and cell (a request, the busy and idle
statuses, the reply, output); at hundreds of ranks their decoding is what a cell costs the
notebook. jupyter_client's `Session` turns every date-like string of every header into a
``datetime`` (a regular expression over each value, then a date parser) and builds each
message through several layers; nothing here reads those dates. `WireCodec` does what the
protocol needs and no more: HMAC signatures made and checked (with jupyter_client's replay
check: a signature seen twice is refused), JSON headers and content, buffers passed through
as they came.

The wire format is the Jupyter messaging protocol's (version 5.3): ``[identities...,
b"<IDS|MSG>", signature, header, parent_header, metadata, content, buffers...]``.
"""

from __future__ import annotations

import collections
import hmac
import json
import os
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

DELIMITER = b"<IDS|MSG>"
PROTOCOL_VERSION = "5.3"
#: signatures remembered for the replay check (jupyter_client keeps 2**16 too)
HISTORY = 1 << 16
#: the schemes a connection file may name, as hashlib calls them
_DIGESTS = {"hmac-sha256": "sha256", "hmac-sha512": "sha512", "hmac-md5": "md5"}

Frame = bytes | bytearray | memoryview
#: ``(msg_id, frames)`` of an encoded message
Encoded = tuple[str, list[Frame]]


class WireError(ValueError):
    """A message that is not one: unsigned, badly signed, replayed, or malformed."""


_decode_json = json.JSONDecoder().decode


def _loads(part: Frame) -> Any:
    """A JSON part (UTF-8, as the protocol says), without `json.loads`'s guessing of the
    encoding of bytes; the empty dict most metadata and parents are, without parsing."""
    raw = bytes(part)
    return {} if raw == b"{}" else _decode_json(raw.decode())


#: one encoder for every message (`json.dumps` makes one a call when given options)
_encode_json = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def _dumps(obj: Any) -> bytes:
    return _encode_json(obj).encode()


def message(
    header: dict[str, Any], parent: Any, metadata: Any, content: Any, buffers: list[Any]
) -> dict[str, Any]:
    """A message as jupyter_client's `Session.deserialize` shapes it, from its decoded
    parts (``header`` has a ``msg_type``; parts that are not objects become empty)."""
    return {
        "header": header,
        "msg_id": header.get("msg_id"),
        "msg_type": header["msg_type"],
        "parent_header": parent if isinstance(parent, dict) else {},
        "metadata": metadata if isinstance(metadata, dict) else {},
        "content": content if isinstance(content, dict) else {},
        "buffers": buffers,
    }


class WireCodec:
    """Signs and checks messages of one connection (one key)."""

    def __init__(self, key: str | bytes, signature_scheme: str = "hmac-sha256") -> None:
        digest = _DIGESTS.get(signature_scheme)
        if digest is None:
            raise WireError(
                f"signature scheme {signature_scheme!r}: expected one of {', '.join(_DIGESTS)}"
            )
        self.key = key.encode() if isinstance(key, str) else bytes(key)
        self.scheme = signature_scheme
        self._auth = hmac.new(self.key, digestmod=digest) if self.key else None
        self.session = uuid.uuid4().hex
        self.username = os.environ.get("USER", "jupyter_dist")
        self._seen: set[bytes] = set()
        self._order: collections.deque[bytes] = collections.deque()
        self._count = 0

    def same_signer(self, other: WireCodec) -> bool:
        """Whether ``other`` signs with the same key and scheme (its messages are ours)."""
        return self.key == other.key and self.scheme == other.scheme

    def sign(self, parts: Sequence[Frame]) -> bytes:
        if self._auth is None:
            return b""
        mac = self._auth.copy()
        for part in parts:
            mac.update(part)
        return mac.hexdigest().encode()

    def encode(
        self,
        msg_type: str,
        content: dict[str, Any],
        parent: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        buffers: Sequence[Frame] = (),
    ) -> Encoded:
        """``(msg_id, frames)`` of a new message, ready for ``send_multipart``."""
        self._count += 1
        msg_id = f"{self.session}_{self._count}"
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": self.username,
            "session": self.session,
            "date": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "version": PROTOCOL_VERSION,
        }
        parts: list[Frame] = [
            _dumps(header),
            _dumps(parent or {}),
            _dumps(metadata or {}),
            _dumps(content),
        ]
        return msg_id, [DELIMITER, self.sign(parts), *parts, *buffers]

    def decode(self, frames: Sequence[Frame]) -> dict[str, Any]:
        """A received message as jupyter_client's `Session.deserialize` shapes it
        (``header``, ``msg_id``, ``msg_type``, ``parent_header``, ``metadata``,
        ``content``, ``buffers``), dates left as the strings they came as."""
        try:
            start = next(i for i, f in enumerate(frames) if bytes(f) == DELIMITER) + 1
        except StopIteration:
            raise WireError("no <IDS|MSG> delimiter: not a Jupyter message") from None
        if len(frames) < start + 5:
            raise WireError(f"{len(frames) - start} frames after the delimiter: expected 5+")
        signature = bytes(frames[start])
        parts = frames[start + 1 : start + 5]
        if self._auth is not None:
            if not signature:
                raise WireError("unsigned message")
            if not self.check(signature, parts):
                raise WireError("invalid signature")
        try:
            header, parent, metadata, content = (_loads(p) for p in parts)
        except ValueError as err:
            raise WireError(f"a message part is not JSON: {err}") from None
        if not isinstance(header, dict) or "msg_type" not in header:
            raise WireError("a header without msg_type")
        return message(header, parent, metadata, content, list(frames[start + 5 :]))

    def check(self, signature: bytes, parts: Sequence[Frame]) -> bool:
        """Whether ``signature`` signs ``parts``; a signature seen before raises
        `WireError` (a replayed message). True without a key."""
        if self._auth is None:
            return True
        if not hmac.compare_digest(signature, self.sign(parts)):
            return False
        self._remember(signature)
        return True

    def _remember(self, signature: bytes) -> None:
        if signature in self._seen:
            raise WireError("duplicate signature: a replayed message")
        self._seen.add(signature)
        self._order.append(signature)
        if len(self._order) > HISTORY:
            self._seen.discard(self._order.popleft())
