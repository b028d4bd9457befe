"""A large push to the ranks of this machine goes through a shared-memory file: real rank
kernels map it copy-on-write; a rank that cannot read it gets the buffers by socket."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jupyter_dist.common import pickling, shared_push
from jupyter_dist.common.events import StreamOut
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.settings import SHARED_PUSH_VAR

pytestmark = pytest.mark.skipif(
    shared_push.folder() is None, reason="this machine has no writable /dev/shm"
)

SHOW = (
    "import numpy as np\n"
    "print('sum', float(big.sum()), 'writable', big.flags.writeable, 'small', small.tolist())"
)

ZERO_ON_RANK_0 = "import os\nif os.environ['RANK'] == '0':\n    big[:] = 0\n"


@pytest.fixture
def session() -> Iterator[Session]:
    spec = resolve_shape("shm", ShapeRequest(procs=2, init=False), 0, "localhost")
    yield Session(spec, SessionTimeouts(start=120))


def _printed(sink: EventQueue) -> dict[int, str]:
    out: dict[int, str] = {}
    while not sink.empty():
        event = sink.get_nowait()
        if isinstance(event, StreamOut):
            out[event.rank] = out.get(event.rank, "") + event.text
    return out


async def _show(session: Session, code: str = SHOW) -> dict[int, str]:
    sink = EventQueue()
    result = await session.execute(code, sink=sink)
    assert not result.failures, result.failures
    return _printed(sink)


async def _push_and_show(
    session: Session, big: np.ndarray, small: np.ndarray
) -> tuple[int, dict[int, str]]:
    """Start the session, push ``big`` and ``small``, and say how many pushes went
    through shared memory and what each rank then holds."""
    await session.start()
    try:
        await session.push(pickling.dump({"big": big, "small": small}))
        return session.shared_pushes, await _show(session)
    finally:
        await session.shutdown()


def _push_files() -> list[str]:
    where = shared_push.folder()
    assert where is not None
    return os.listdir(where)


def test_a_large_push_is_mapped_by_every_rank_and_its_file_removed(session: Session) -> None:
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    small = np.array([1, 2, 3])

    async def scenario() -> tuple[int, dict[int, str], dict[int, str], list[Any]]:
        await session.start()
        try:
            await session.push(pickling.dump({"big": big, "small": small}))
            pushes = session.shared_pushes
            first = await _show(session)
            # rank 0 writes to its array: its pages become its own, rank 1 sees nothing
            after = await _show(session, ZERO_ON_RANK_0 + SHOW)
            pulled = await session.pull("big")
            return pushes, first, after, pulled
        finally:
            await session.shutdown()

    pushes, first, after, pulled = asyncio.run(scenario())
    assert pushes == 1
    total = float(big.sum())
    for rank in (0, 1):
        assert first[rank] == f"sum {total} writable True small [1, 2, 3]\n", first
    assert after[0] == "sum 0.0 writable True small [1, 2, 3]\n", after
    assert after[1] == f"sum {total} writable True small [1, 2, 3]\n", after
    assert float(pulled[1].sum()) == total and float(pulled[0].sum()) == 0.0
    assert _push_files() == []


def test_a_rank_that_cannot_read_the_file_gets_the_push_by_socket(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[Path] = []
    write = shared_push.write

    def short_file(frames: Any, name: str, root: Path = shared_push.SHM_ROOT) -> Path | None:
        path = write(frames, name, root)
        if path is not None:  # not what was signed: every rank refuses it
            os.truncate(path, os.path.getsize(path) - 1)
            written.append(path)
        return path

    monkeypatch.setattr(shared_push, "write", short_file)
    big = np.full(1 << 19, 2.0)
    small = np.array([4])

    pushes, shown = asyncio.run(_push_and_show(session, big, small))
    assert pushes == 1 and len(written) == 1
    for rank in (0, 1):
        assert shown[rank] == f"sum {float(big.sum())} writable True small [4]\n", shown
    assert not written[0].exists()


@pytest.mark.parametrize("why", ["switched off", "too small"])
def test_small_pushes_and_the_off_switch_use_the_sockets(
    session: Session, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    if why == "switched off":
        monkeypatch.setenv(SHARED_PUSH_VAR, "off")
        big = np.ones(1 << 20)
    else:
        big = np.ones(shared_push.MIN_BYTES // 8 - 100)
    small = np.array([5])

    pushes, shown = asyncio.run(_push_and_show(session, big, small))
    assert pushes == 0
    for rank in (0, 1):
        assert shown[rank] == f"sum {float(big.sum())} writable True small [5]\n", shown
