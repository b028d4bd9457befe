"""Reading a small file a user names (a hostfile, a pod template, the profiles) without
ever blocking on it or reading more than a bound: a device, a FIFO or a folder is refused
unread, and so is a file over the bound, by its size before reading and by what was read
(it may grow meanwhile)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from jupyter_dist.errors import SpecError


def read_bounded(path: str | Path, limit: int, label: str, expected: str) -> bytes | None:
    """The bytes of the regular file ``path`` (``~`` expanded), at most ``limit`` of them;
    None where there is no such file. Everything refused is a `SpecError` that begins with
    ``label`` and says ``expected``, what the file should hold ("a pod template")."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(
            Path(path).expanduser(), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        )
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SpecError(f"{label}: cannot read it: {err.strerror or err}") from None
    too_big = f"expected at most {limit} bytes ({limit // 1024} KiB) of {expected}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(f"{label}: not a regular file; expected {expected}")
        if info.st_size > limit:
            raise SpecError(f"{label}: {info.st_size} bytes; {too_big}")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(limit + 1)
    except OSError as err:
        raise SpecError(f"{label}: cannot read it: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew since fstat
        raise SpecError(f"{label}: more than {limit} bytes; {too_big}")
    return data


__all__ = ["read_bounded"]
