"""Private folders named after the process that made them, and the clean-up of those left
by processes that are gone.

A process that keeps files for as long as it lives (a notebook's cell logs, its push
files) makes one folder ``<prefix><pid>-<random>`` (0700, `tempfile.mkdtemp`). A crash
leaves it behind; the next process to make one removes this user's folders of the same
prefix whose pid no longer runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (another user's counts: it may have been given the
    pid again)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process holds that pid now
        return True
    return True


def prune(base: Path, prefix: str) -> list[Path]:
    """Remove this user's folders ``<prefix><pid>-*`` in ``base`` whose pid no longer
    runs (never following a link); returns what went."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name.removeprefix(prefix).split("-", 1)[0]
        if not entry.name.startswith(prefix) or not pid.isdigit():
            continue
        if int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(entry.path, ignore_errors=True)  # does not follow links inside
            removed.append(Path(entry.path))
    return removed


def make(base: Path, prefix: str) -> Path:
    """A new private folder of this process in ``base``, after removing those of
    processes that are gone; OSError when it cannot be made."""
    prune(base, prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))


__all__ = ["make", "pid_alive", "prune"]
