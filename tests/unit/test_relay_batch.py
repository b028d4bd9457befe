"""A relay's batch: many messages, one signature and one JSON document, buffers in order;
the ranks a request is for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jupyter_dist.common import relay_batch
from jupyter_dist.common.relay_batch import (
    BatchWriter,
    folded_replies,
    is_batch,
    parse_targets,
    plain_reply_content,
    read_batch,
    split_message,
    targets_frame,
)
from jupyter_dist.common.wire_codec import WireCodec, WireError
from jupyter_dist.common.wire_names import (
    EXECUTE_REPLY_MSG_TYPE,
    FOLDED_REPLIES_MSG_TYPE,
    GROUP_KEY,
)

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


# -- folded replies --------------------------------------------------------------------
CELL = {"msg_id": "cell-1", "msg_type": "execute_request", "session": "notebook"}


def _reply(
    kernel: WireCodec,
    count: int,
    content: dict[str, Any] | None = None,
    parent: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    buffers: tuple[bytes, ...] = (),
) -> tuple[list[bytes], list[Any]]:
    """The checked parts and buffers of a rank's reply on IOPub, as the relay has them."""
    if content is None:
        content = {"status": "ok", "execution_count": count, "user_expressions": {}}
        content.update({"payload": [], GROUP_KEY: "gloo"})
    _id, frames = kernel.encode(
        EXECUTE_REPLY_MSG_TYPE, content, parent=parent or CELL, metadata=metadata, buffers=buffers
    )
    _topic, signature, parts, bufs = split_message([b"kernel.reply", *frames])
    assert kernel.check(signature, parts)
    return parts, bufs


def _folding_writer() -> BatchWriter:
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    writer.fold_replies_to("cell-1")
    return writer


def test_the_plain_replies_of_many_ranks_fold_into_one_entry_naming_every_rank() -> None:
    kernels = [WireCodec(KEY) for _ in range(32)]
    writer = _folding_writer()
    for count, kernel in enumerate(kernels):
        writer.add_iopub(*_reply(kernel, count))
    frames = writer.take()
    assert len(json.loads(frames[2])) == 2  # the stamp and one entry
    (msg,) = read_batch(WireCodec(KEY), frames)
    assert msg["msg_type"] == FOLDED_REPLIES_MSG_TYPE
    assert msg["parent_header"] == CELL
    replies = folded_replies(msg)
    assert [s for s, _c, _g in replies] == [k.session for k in kernels]
    assert [c for _s, c, _g in replies] == list(range(32))
    content = plain_reply_content(*replies[3][1:])
    assert content == {
        "status": "ok",
        "execution_count": 3,
        "user_expressions": {},
        "payload": [],
        GROUP_KEY: "gloo",
    }


def test_a_reply_without_a_group_folds_and_reads_back_without_one() -> None:
    writer = _folding_writer()
    content = {"status": "ok", "execution_count": 4, "user_expressions": {}, "payload": []}
    writer.add_iopub(*_reply(WireCodec(KEY), 0, content))
    (msg,) = read_batch(WireCodec(KEY), writer.take())
    ((_session, count, group),) = folded_replies(msg)
    assert plain_reply_content(count, group) == content


@pytest.mark.parametrize(
    "change",
    [
        {"status": "error", "ename": "ValueError", "evalue": "x", "traceback": []},
        {"payload": [{"source": "page", "data": {}}]},
        {"user_expressions": {"a": {"status": "ok"}}},
        {"execution_count": None},
        {"extra": 1},
        {GROUP_KEY: 3},
    ],
)
def test_a_reply_that_says_more_than_ok_travels_whole(change: dict[str, Any]) -> None:
    content = {"status": "ok", "execution_count": 1, "user_expressions": {}, "payload": []}
    content.update(change)
    writer = _folding_writer()
    writer.add_iopub(*_reply(WireCodec(KEY), 1, content))
    (msg,) = read_batch(WireCodec(KEY), writer.take())
    assert msg["msg_type"] == EXECUTE_REPLY_MSG_TYPE
    assert msg["content"] == content


def test_replies_with_buffers_metadata_or_to_a_cell_that_did_not_ask_travel_whole() -> None:
    kernel = WireCodec(KEY)
    writer = _folding_writer()
    writer.add_iopub(*_reply(kernel, 1, buffers=(b"x",)))
    writer.add_iopub(*_reply(kernel, 2, metadata={"m": 1}))
    writer.add_iopub(*_reply(kernel, 3, parent={**CELL, "msg_id": "another cell"}))
    messages = read_batch(WireCodec(KEY), writer.take())
    assert [m["msg_type"] for m in messages] == [EXECUTE_REPLY_MSG_TYPE] * 3
    assert [m["content"]["execution_count"] for m in messages] == [1, 2, 3]
    # a writer never told to fold folds nothing
    plain = BatchWriter(WireCodec(KEY), "relay-1")
    plain.add_iopub(*_reply(kernel, 4))
    (msg,) = read_batch(WireCodec(KEY), plain.take())
    assert msg["msg_type"] == EXECUTE_REPLY_MSG_TYPE


def test_any_other_message_ends_a_run_of_folded_replies_so_each_rank_keeps_its_order() -> None:
    a, b = WireCodec(KEY), WireCodec(KEY)
    writer = _folding_writer()
    writer.add_iopub(*_reply(a, 1))
    _topic, _sig, parts, bufs = split_message(_message(b, "b's last line"))
    writer.add_iopub(parts, bufs)
    writer.add_iopub(*_reply(b, 2))
    messages = read_batch(WireCodec(KEY), writer.take())
    assert [m["msg_type"] for m in messages] == [
        FOLDED_REPLIES_MSG_TYPE,
        "stream",
        FOLDED_REPLIES_MSG_TYPE,
    ]
    assert [s for m in messages[::2] for s, _c, _g in folded_replies(m)] == [a.session, b.session]
    assert messages[0]["msg_id"] != messages[2]["msg_id"]


def test_a_batch_with_changed_folded_replies_is_refused() -> None:
    writer = _folding_writer()
    for count in range(3):
        writer.add_iopub(*_reply(WireCodec(KEY), count))
    frames = [bytes(f) for f in writer.take()]
    entry = json.loads(frames[2])[1]
    dropped = [entry[0], entry[1], entry[2], {"replies": entry[3]["replies"][:2]}, 0]
    forged = json.dumps([["relay-1", 9], dropped]).encode()
    for document in (forged, frames[2].replace(b",2,", b",7,")):
        with pytest.raises(WireError, match="invalid signature"):
            read_batch(WireCodec(KEY), [frames[0], frames[1], document])
    with pytest.raises(WireError, match="unsigned"):
        read_batch(WireCodec(KEY), [frames[0], b"", forged])


@pytest.mark.parametrize(
    "content",
    [
        {},
        {"replies": 3},
        {"replies": [["s", 1]]},
        {"replies": [[1, 1, None]]},
        {"replies": [["s", "1", None]]},
        {"replies": [["s", 1, 2]]},
    ],
)
def test_folded_replies_of_the_wrong_shape_are_refused_even_signed(content: Any) -> None:
    header = {"msg_type": FOLDED_REPLIES_MSG_TYPE, "msg_id": "x"}
    document = json.dumps([["r", 1], [header, CELL, {}, content, 0]]).encode()
    codec = WireCodec(KEY)
    frames = [relay_batch.MAGIC, codec.sign([relay_batch.MAGIC, document]), document]
    with pytest.raises(WireError, match="folded replies"):
        read_batch(WireCodec(KEY), frames)


def test_a_folded_entry_is_an_ordinary_entry_to_a_reader_that_does_not_know_it() -> None:
    """What a notebook side of an earlier version checks of each entry."""
    writer = _folding_writer()
    writer.add_iopub(*_reply(WireCodec(KEY), 1))
    (entry,) = json.loads(writer.take()[2])[1:]
    assert len(entry) == 5 and isinstance(entry[0], dict) and "msg_type" in entry[0]
    assert entry[4] == 0 and "session" not in entry[0]


def test_replies_await_their_cells_other_ranks_until_the_last_or_another_message() -> None:
    """A batch of nothing but folded replies to a cell that some of its ranks (of the
    node) have not answered may wait for them (the relay holds it a moment); the last
    reply, or any other message, ends the wait."""
    kernels = [WireCodec(KEY) for _ in range(3)]
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    writer.fold_replies_to("cell-1", expected=3)
    assert not writer.awaits_replies()  # nothing to hold
    writer.add_iopub(*_reply(kernels[0], 1))
    writer.add_iopub(*_reply(kernels[1], 1))
    assert writer.awaits_replies()
    writer.add_iopub(*_reply(kernels[2], 1))
    assert not writer.awaits_replies()  # every rank replied
    (msg,) = read_batch(WireCodec(KEY), writer.take())
    assert [s for s, _c, _g in folded_replies(msg)] == [k.session for k in kernels]

    # any other message goes at once, with the replies before it
    writer.fold_replies_to("cell-2", expected=3)
    writer.add_iopub(*_reply(kernels[0], 2, parent={**CELL, "msg_id": "cell-2"}))
    assert writer.awaits_replies()
    _topic, _signature, parts, buffers = split_message(_message(kernels[1], "printed"))
    writer.add_iopub(parts, buffers)
    assert not writer.awaits_replies()
    assert [m["msg_type"] for m in read_batch(WireCodec(KEY), writer.take())] == [
        FOLDED_REPLIES_MSG_TYPE,
        "stream",
    ]


def test_a_reply_that_travels_whole_counts_among_its_cells_replies() -> None:
    """A rank's error reply goes at once and whole; the other ranks' plain replies then do
    not wait for it."""
    kernels = [WireCodec(KEY) for _ in range(2)]
    writer = BatchWriter(WireCodec(KEY), "relay-1")
    writer.fold_replies_to("cell-1", expected=2)
    error = {"status": "error", "ename": "ValueError", "evalue": "x", "traceback": []}
    writer.add_iopub(*_reply(kernels[0], 1, error))
    assert not writer.awaits_replies()  # an error is never held
    (msg,) = read_batch(WireCodec(KEY), writer.take())
    assert msg["msg_type"] == EXECUTE_REPLY_MSG_TYPE
    writer.add_iopub(*_reply(kernels[1], 1))
    assert len(writer) == 1 and not writer.awaits_replies()  # the last of the two


def test_a_cell_not_told_its_ranks_never_holds_its_replies() -> None:
    writer = _folding_writer()
    writer.add_iopub(*_reply(WireCodec(KEY), 1))
    assert len(writer) == 1 and not writer.awaits_replies()
