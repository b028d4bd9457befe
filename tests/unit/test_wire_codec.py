"""The lean Jupyter message codec speaks the protocol jupyter_client and ipykernel speak:
each reads what the other signs, and what is unsigned, badly signed or replayed is refused."""

from __future__ import annotations

import pytest
from jupyter_client.session import Session

from jupyter_dist.common.wire_codec import DELIMITER, WireCodec, WireError

KEY = "5f3c0e1d-secret"


def test_jupyter_client_reads_what_the_codec_signs() -> None:
    codec = WireCodec(KEY)
    msg_id, frames = codec.encode(
        "execute_request", {"code": "x = 1"}, metadata={"n": 4}, buffers=[b"\x00raw"]
    )
    session = Session(key=KEY.encode())
    _ids, parts = session.feed_identities(frames)
    msg = session.deserialize(parts)
    assert msg["msg_id"] == msg_id and msg["msg_type"] == "execute_request"
    assert msg["content"] == {"code": "x = 1"} and msg["metadata"] == {"n": 4}
    assert [bytes(b) for b in msg["buffers"]] == [b"\x00raw"]
    assert msg["header"]["version"] == "5.3"


def test_the_codec_reads_what_jupyter_client_signs_dates_left_as_strings() -> None:
    session = Session(key=KEY.encode())
    parent = session.msg("execute_request", {"code": "1"})
    sent = session.serialize(session.msg("status", {"execution_state": "idle"}, parent=parent))
    msg = WireCodec(KEY).decode([b"routing-id", *sent])
    assert msg["msg_type"] == "status" and msg["content"] == {"execution_state": "idle"}
    assert msg["parent_header"]["msg_id"] == parent["header"]["msg_id"]
    assert isinstance(msg["header"]["date"], str)


def test_bad_messages_are_refused() -> None:
    codec, other = WireCodec(KEY), WireCodec("another key")
    _id, frames = other.encode("status", {})
    with pytest.raises(WireError, match="invalid signature"):
        codec.decode(frames)
    _id, frames = codec.encode("status", {})
    codec.decode(frames)
    with pytest.raises(WireError, match="replayed"):
        codec.decode(frames)
    with pytest.raises(WireError, match="unsigned"):
        codec.decode([DELIMITER, b"", *frames[2:]])
    with pytest.raises(WireError, match="delimiter"):
        codec.decode(frames[1:])
    with pytest.raises(WireError, match="signature scheme"):
        WireCodec(KEY, "hmac-crc32")


def test_a_connection_without_a_key_signs_nothing() -> None:
    codec = WireCodec("")
    _id, frames = codec.encode("status", {"execution_state": "busy"})
    assert frames[1] == b""
    assert codec.decode(frames)["content"] == {"execution_state": "busy"}


def test_parts_are_read_as_utf8_json_and_bad_ones_refused() -> None:
    """Parts are decoded as UTF-8 JSON (the protocol's), non-ASCII text intact; an empty
    dict part is read without parsing; a part that is not UTF-8 or not JSON is refused."""
    codec = WireCodec(KEY)
    _id, frames = codec.encode("stream", {"name": "stdout", "text": "Grüße ✓\n"})
    msg = WireCodec(KEY).decode(frames)
    assert msg["content"]["text"] == "Grüße ✓\n" and msg["metadata"] == {}
    for bad in (b"\xff\xfe{}", b"{not json"):
        parts = [frames[2], frames[3], frames[4], bad]
        with pytest.raises(WireError, match="not JSON"):
            codec.decode([DELIMITER, codec.sign(parts), *parts])


def test_one_signed_request_is_read_by_every_kernel_of_the_key() -> None:
    """A cell is encoded once and the same bytes go to every rank: each kernel (its own
    session, its own replay check) accepts them; a codec of another key is not the same
    signer and is given its own copy."""
    sender = WireCodec(KEY)
    _id, frames = sender.encode("execute_request", {"code": "x = 1"})
    for _ in range(3):
        kernel = Session(key=KEY.encode())
        assert kernel.deserialize(kernel.feed_identities(frames)[1])["content"]["code"] == "x = 1"
    assert sender.same_signer(WireCodec(KEY))
    assert not sender.same_signer(WireCodec("another key"))
    assert not sender.same_signer(WireCodec(KEY, "hmac-sha512"))
