"""Shared-memory push files: layout, copy-on-write mapping, refusals, clean-up."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from jupyter_dist.common import pickling, shared_push
from jupyter_dist.common.shared_push import SharedPushUnreadable


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm (tmpfs or not: the files behave alike)."""
    monkeypatch.setattr(shared_push, "_folder", None)
    return tmp_path


def _payload() -> tuple[pickling.Payload, dict[str, np.ndarray]]:
    values = {
        "a": np.arange(300_000, dtype=np.float64),  # mapped
        "b": np.ones(10),  # read (small)
        "c": np.full(50_000, 7, dtype=np.int32),  # mapped, after a small one
    }
    return pickling.dump(values), values


def test_buffers_start_on_page_boundaries_and_come_back_writable(root: Path) -> None:
    payload, values = _payload()
    path = shared_push.write(payload.frames[1:], "p1", root)
    assert path is not None and path.parent.name.startswith(shared_push.PREFIX)
    offsets, end = shared_push.layout(payload.sizes[1:])
    assert all(o % shared_push.ALIGN == 0 for o in offsets)
    assert path.stat().st_size == end
    buffers = shared_push.read(str(path), payload.sizes[1:])
    got = pickling.load([payload.frames[0], *buffers], payload.digest, payload.sizes)
    for name, value in values.items():
        assert np.array_equal(got[name], value) and got[name].flags.writeable
    got["a"][:] = -1  # copy-on-write: the file, and whoever maps it next, keep the original
    again = shared_push.read(str(path), payload.sizes[1:])
    fresh = pickling.load([payload.frames[0], *again], payload.digest, payload.sizes)
    assert np.array_equal(fresh["a"], values["a"])
    shared_push.remove(path)
    assert not path.exists()


def test_small_payloads_and_a_full_folder_write_no_file(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shared_push.write([b"x" * 1000], "small", root) is None
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shared_push.shutil, "disk_usage", lambda _: usage(1, 1, 1 << 20))
    assert shared_push.write([bytes(shared_push.MIN_BYTES)], "big", root) is None
    folder = shared_push.folder(root)
    assert folder is not None and os.listdir(folder) == []


def test_no_folder_where_the_root_is_missing(root: Path) -> None:
    assert shared_push.write([bytes(shared_push.MIN_BYTES)], "x", root / "nowhere") is None


FAULTS = ["not a push folder", "shorter", "longer", "symlink", "bad sizes"]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_file_that_is_not_what_was_signed_is_refused(root: Path, fault: str) -> None:
    payload, _ = _payload()
    path = shared_push.write(payload.frames[1:], "p2", root)
    assert path is not None
    sizes = list(payload.sizes[1:])
    where = str(path)
    if fault == "not a push folder":
        other = root / "elsewhere"
        other.mkdir()
        where = str(other / "p2")
        os.link(path, where)
    elif fault == "shorter":
        os.truncate(path, path.stat().st_size - 1)
    elif fault == "longer":
        sizes[-1] -= 1  # the file is longer than the signed sizes say
    elif fault == "symlink":
        link = path.parent / "link"
        link.symlink_to(path)
        where = str(link)
    else:
        sizes[1] = -1
    with pytest.raises(SharedPushUnreadable):
        shared_push.read(where, sizes)


def test_folders_of_processes_that_are_gone_are_removed(root: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = root / f"{shared_push.PREFIX}{gone.stdout.strip()}-abc"
    stale.mkdir()
    (stale / "left").write_bytes(b"x")
    alive = root / f"{shared_push.PREFIX}1-abc"  # pid 1 is always there
    alive.mkdir()
    mine = shared_push.folder(root)
    assert mine is not None and mine.exists()
    assert not stale.exists()
    assert alive.exists()


def test_the_switch_is_on_or_off_and_names_a_bad_value() -> None:
    from jupyter_dist.errors import SpecError
    from jupyter_dist.settings import SHARED_PUSH_VAR
    from jupyter_dist.settings import shared_push as switch

    assert switch({}) and switch({SHARED_PUSH_VAR: " ON "})
    assert not switch({SHARED_PUSH_VAR: "off"})
    with pytest.raises(SpecError, match=r"JUPYTER_DIST_SHARED_PUSH='shm': expected on or off"):
        switch({SHARED_PUSH_VAR: "shm"})
