"""A push's large buffers handed to ranks of this machine through shared memory.

Through sockets, a push of a 100 MB array to two ranks of the notebook's own machine is
copied eight times over: into the relay's socket, out of it, into each rank's socket, out
of them, and into memory each rank owns (a received zmq frame is read-only; the arrays a
user gets back must be writable). On two busy cores those copies were most of a push.

Here the notebook writes the pickle's out-of-band buffers once into a file of its own
folder in ``/dev/shm`` (memory, not disk), each buffer at a page boundary, and sends the
ranks only the pickle stream and the file's path. Each rank maps the buffers copy-on-write
(``MAP_PRIVATE``): the arrays it unpickles are writable, and share the file's memory with
every other rank of the machine until a rank writes to a page, which then becomes its
own. One copy in all, whatever the number of ranks, and nothing large through the relay.
The file is removed as soon as the ranks have answered; its memory is freed when the last
rank lets go of what it mapped.

The folder is private (0700) and named after the notebook process, so a folder left by a
process that died is removed by the next one. A rank reads only a regular file of this
user, in such a folder, of exactly the signed sizes; anything else (a rank that cannot
see this machine's ``/dev/shm``) raises `SharedPushUnreadable`, and the notebook sends
that rank the buffers through the sockets instead. Where ``/dev/shm`` is missing or has
no room for the buffers (a container's 64 MB), pushes go through the sockets as before.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jupyter_dist.common import process_folders
from jupyter_dist.common.pickling import Frame
from jupyter_dist.common.private_files import open_private_file

#: where the files go: memory on Linux
SHM_ROOT = Path("/dev/shm")
#: each process's folder is named ``<PREFIX><pid>-<random>``
PREFIX = "jd-push-"
#: out-of-band buffers smaller than this go through the sockets (a file costs a few calls)
MIN_BYTES = 1 << 18
#: room left free in /dev/shm beside a file (others use it too)
SPARE_BYTES = 64 << 20
#: each buffer starts at a multiple of this in the file (a mapping starts at one)
ALIGN = mmap.ALLOCATIONGRANULARITY
#: buffers smaller than this are read into memory instead of mapped
MAP_MIN_BYTES = 1 << 16

_folder: Path | None = None


class SharedPushUnreadable(OSError):
    """A rank could not take a push's buffers from the file named (another machine, or a
    file that is not what was signed): the notebook sends them through the sockets."""


def folder(root: Path = SHM_ROOT) -> Path | None:
    """This process's private folder for push files (made on first use, removing those of
    processes that are gone); None where ``root`` is missing or not writable."""
    global _folder
    if _folder is not None and _folder.parent == root and _folder.is_dir():
        return _folder
    if not root.is_dir() or not os.access(root, os.W_OK | os.X_OK):
        return None
    try:
        _folder = process_folders.make(root, PREFIX)
    except OSError:
        return None
    atexit.register(shutil.rmtree, _folder, True)
    return _folder


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Where each buffer of ``sizes`` starts in a push file, and the file's length."""
    offsets, end = [], 0
    for size in sizes:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + size
    return offsets, end


def write(frames: Sequence[Frame], name: str, root: Path = SHM_ROOT) -> Path | None:
    """Write ``frames`` into a new file ``name`` of this process's folder, each at the
    offset `layout` gives it, and return its path; None (and no file) when they are
    smaller than `MIN_BYTES` together, or there is no folder or no room for them."""
    sizes = [memoryview(f).nbytes for f in frames]
    if sum(sizes) < MIN_BYTES:
        return None
    where = folder(root)
    if where is None:
        return None
    offsets, end = layout(sizes)
    try:
        if shutil.disk_usage(where).free < end + SPARE_BYTES:
            return None
        path = where / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            for frame, offset in zip(frames, offsets, strict=True):
                f.seek(offset)  # the gap before it is a hole: no memory
                f.write(frame)
            f.truncate(end)
    except OSError:  # the folder filled up meanwhile
        remove(path)
        return None
    return path


def remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def read(path: str, sizes: Sequence[int]) -> list[Any]:
    """The buffers of ``sizes`` bytes in the push file at ``path``, each writable and
    this process's own (mapped copy-on-write, or read when small);
    `SharedPushUnreadable` unless ``path`` is a regular file of this user, in a push
    folder, of exactly the length `layout` gives ``sizes``."""
    where = Path(path)
    if not where.is_absolute() or not where.parent.name.startswith(PREFIX):
        raise SharedPushUnreadable(f"{path!r} is not a push file")
    if any(not isinstance(s, int) or s < 0 for s in sizes):
        raise SharedPushUnreadable(f"bad buffer sizes {list(sizes)[:8]!r}")
    offsets, end = layout(sizes)
    try:
        fd = open_private_file(where, end)
    except (OSError, ValueError) as err:
        raise SharedPushUnreadable(f"cannot open {path}: {err}") from None
    try:
        if os.fstat(fd).st_size != end:
            raise SharedPushUnreadable(f"{path} holds fewer bytes than the {end} signed")
        buffers: list[Any] = []
        for size, offset in zip(sizes, offsets, strict=True):
            if size >= MAP_MIN_BYTES:
                buffers.append(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, offset=offset))
            else:
                buffers.append(bytearray(os.pread(fd, size, offset)))
                if len(buffers[-1]) != size:
                    raise SharedPushUnreadable(f"{path} ended before its {end} bytes")
        return buffers
    except SharedPushUnreadable:
        raise
    except (OSError, ValueError) as err:
        raise SharedPushUnreadable(f"cannot read {path}: {err}") from None
    finally:
        os.close(fd)  # a mapping outlives the descriptor


__all__ = ["MIN_BYTES", "SharedPushUnreadable", "folder", "layout", "read", "remove", "write"]
