"""Why a folder in the temporary folder cannot be written, said in words a user can act on.

The temporary folder of a shared login node is small and often full. The notebook's cell
logs and a node agent's private folder live there: a write that fails (no space left, a
quota, a read-only disk) is described by `unwritable` with the folder it was for and
what to do about it, instead of a bare ``OSError: [Errno 28]``.
"""

from __future__ import annotations

import errno
import os

#: errors a user fixes by freeing space (or by writing elsewhere)
_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def unwritable(folder: str | os.PathLike[str], err: OSError) -> str:
    """``no space left on device in /tmp/x; free space there or point TMPDIR at another
    folder``: what went wrong writing in ``folder``, and what to do."""
    if err.errno == errno.ENOENT and err.filename is None and err.strerror:
        # tempfile's "No usable temporary directory found in [...]": each was unwritable
        return f"{err.strerror}; free space in one of them or point TMPDIR at another folder"
    reason = (os.strerror(err.errno) if err.errno else str(err)).lower()
    fix = "free space there or point" if err.errno in _SPACE else "point"
    return f"{reason} in {os.fspath(folder)}; {fix} TMPDIR at another folder"


__all__ = ["unwritable"]
