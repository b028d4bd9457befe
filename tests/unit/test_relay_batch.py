"""A relay's batch: many messages, one signature and one JSON document, buffers in order;
the ranks a request is for."""

from __future__ import annotations

import json

import pytest

from jupyter_dist.common import relay_batch
from jupyter_dist.common.relay_batch import (
    BatchWriter,
    is_batch,
    parse_targets,
    read_batch,
    split_message,
    targets_frame,
)
from jupyter_dist.common.wire_codec import WireCodec, WireError

KEY = "batch-key"


def _message(codec: WireCodec, text: str, buffers: list[bytes] | None = None) -> list[bytes]:
    _id, frames = codec.encode(
        "stream", {"name": "stdout", "text": text}, parent={"msg_id": "cell"}, buffers=buffers or ()
    )
    return [b"kernel.stream", *(bytes(f) for f in frames)]


def _batch(texts: list[str], buffers: dict[int, list[bytes]] | None = None) -> list[bytes]:
    rank = WireCodec(KEY)
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    for i, text in enumerate(texts):
        _topic, signature, parts, bufs = split_message(_message(rank, text, (buffers or {}).get(i)))
        assert rank.check(signature, parts)
        writer.add(parts, bufs)
    return [bytes(f) for f in writer.take()]


def test_a_batch_reads_back_as_its_messages_in_order_with_their_own_buffers() -> None:
    frames = _batch(["a", "b", "c"], buffers={1: [b"x" * 10, b"y"], 2: [b"z"]})
    assert is_batch(frames)
    messages = read_batch(WireCodec(KEY), frames)
    assert [m["content"]["text"] for m in messages] == ["a", "b", "c"]
    assert [m["buffers"] for m in messages] == [[], [b"x" * 10, b"y"], [b"z"]]
    assert all(m["msg_type"] == "stream" for m in messages)
    assert all(m["parent_header"]["msg_id"] == "cell" for m in messages)
    assert all(m["msg_id"] == m["header"]["msg_id"] for m in messages)


def test_a_plain_message_is_not_a_batch() -> None:
    assert not is_batch(_message(WireCodec(KEY), "a"))


def test_a_changed_batch_is_refused() -> None:
    frames = _batch(["a"])
    frames[2] = frames[2].replace(b'"a"', b'"b"')
    with pytest.raises(WireError, match="invalid signature"):
        read_batch(WireCodec(KEY), frames)


def test_a_batch_signed_with_another_key_or_unsigned_is_refused() -> None:
    frames = _batch(["a"])
    with pytest.raises(WireError, match="invalid signature"):
        read_batch(WireCodec("another key"), frames)
    with pytest.raises(WireError, match="unsigned"):
        read_batch(WireCodec(KEY), [frames[0], b"", *frames[2:]])


def test_a_batch_received_twice_is_refused_the_second_time() -> None:
    frames = _batch(["a"])
    reader = WireCodec(KEY)
    read_batch(reader, frames)
    with pytest.raises(WireError, match="replayed"):
        read_batch(reader, frames)


def test_two_batches_of_the_same_messages_are_signed_apart() -> None:
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    parts = split_message(_message(WireCodec(KEY), "a"))[2]
    writer.add(parts, [])
    first = writer.take()
    writer.add(parts, [])
    assert writer.take()[1] != first[1]


def test_a_batch_whose_buffers_do_not_add_up_is_refused() -> None:
    frames = _batch(["a"], buffers={0: [b"x"]})
    with pytest.raises(WireError, match="names 1 buffers and carries 2"):
        read_batch(WireCodec(KEY), [*frames, b"extra"])


@pytest.mark.parametrize(
    "document",
    [b"not json", b"{}", b"[]", b'[["r",1],[{}, {}, {}, {}, 0]]', b'[["r",1],[{"msg_type":"x"}]]'],
)
def test_a_malformed_batch_says_what_is_wrong(document: bytes) -> None:
    codec = WireCodec(KEY)
    frames = [relay_batch.MAGIC, codec.sign([relay_batch.MAGIC, document]), document]
    with pytest.raises(WireError, match="relay batch"):
        read_batch(WireCodec(KEY), frames)


def test_a_writer_is_full_at_its_bounds() -> None:
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    parts = split_message(_message(WireCodec(KEY), "a"))[2]
    for _ in range(relay_batch.MAX_MESSAGES - 1):
        writer.add(parts, [])
    assert not writer.full()
    writer.add(parts, [])
    assert writer.full()
    assert len(json.loads(writer.take()[2])) == relay_batch.MAX_MESSAGES + 1
    assert len(writer) == 0
    big = [parts[0], parts[1], parts[2], json.dumps({"t": "x" * relay_batch.MAX_BYTES}).encode()]
    writer.add(big, [])
    assert writer.full()


def test_a_message_without_its_parts_is_refused() -> None:
    with pytest.raises(WireError, match="delimiter"):
        split_message([b"topic", b"header"])
    with pytest.raises(WireError, match="expected 5"):
        split_message([b"topic", b"<IDS|MSG>", b"sig", b"{}"])


def test_shell_replies_say_which_rank_they_come_from() -> None:
    kernel = WireCodec(KEY)
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    for rank in (3, 7):
        _, frames = kernel.encode("execute_reply", {"status": "ok"}, parent={"msg_id": "cell"})
        idents, _signature, parts, bufs = split_message([b"notebook-id", *frames])
        assert [bytes(i) for i in idents] == [b"notebook-id"]
        writer.add(parts, bufs, rank=rank)
    messages = read_batch(WireCodec(KEY), writer.take())
    assert [m["rank"] for m in messages] == [3, 7]
    assert all(m["msg_type"] == "execute_reply" for m in messages)


@pytest.mark.parametrize("ranks", [[0], [0, 1, 5], list(range(relay_batch.MAX_TARGETS))])
def test_the_ranks_a_request_is_for_read_back(ranks: list[int]) -> None:
    assert parse_targets(targets_frame(ranks)) == ranks


@pytest.mark.parametrize(
    "frame",
    [b"", b"a,b", b"1,,2", b"-1", b"1;2", ",".join(["1"] * 5000).encode(), b"9" * 50000],
)
def test_a_request_naming_its_ranks_badly_is_refused(frame: bytes) -> None:
    with pytest.raises(ValueError):
        parse_targets(frame)
