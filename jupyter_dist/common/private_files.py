"""Reading a small file of this user's from a folder others may reach (the Jupyter runtime
folder, often on a shared home) without being led astray or made to wait.

A file is read only when it is a regular file (a FIFO named like a record would block the
reader until someone writes to it; a device could be anything), owned by this user, not a
symbolic link, and small; the checks are made before opening and again on what was opened.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def _check(info: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file")
    if info.st_uid != os.getuid():
        raise ValueError(f"owned by uid {info.st_uid}, not by this user")
    if info.st_size > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")


def open_private_file(path: Path | str, max_bytes: int) -> int:
    """A descriptor of ``path``, open for reading, when it is a regular file owned by this
    user, of at most ``max_bytes``; ValueError when it is not, OSError when it cannot be
    opened. Neither follows a symbolic link nor blocks."""
    _check(os.lstat(path), max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise ValueError("a symbolic link") from err
        raise
    try:
        _check(os.fstat(fd), max_bytes)  # the file opened is the one checked
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private_file(path: Path, max_bytes: int) -> bytes:
    """The content of ``path`` when it is a regular file owned by this user, of at most
    ``max_bytes``; ValueError when it is not, OSError when it cannot be read. Neither
    follows a symbolic link nor blocks."""
    with os.fdopen(open_private_file(path, max_bytes), "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew since
        raise ValueError(f"larger than {max_bytes} bytes")
    return data


__all__ = ["open_private_file", "read_private_file"]
