"""Default session names made from notebook paths.

``runs/train.ipynb`` -> ``runs-train-`` and six hex digits of a hash of the whole path, so
that ``a/runs/train.ipynb`` and ``b/runs/train.ipynb`` get sessions of their own. The same
path always gives the same name; when that name is held by another notebook's session (a
notebook renamed keeps its session's name, and the next new notebook may get its old file
name, as JupyterLab's ``Untitled.ipynb``), `numbered` gives the ones to try next.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path

#: hex digits of the notebook path's hash at the end of its default session name
NAME_HASH_DIGITS = 6
#: the longest session name (`common.spec.check_session_name`)
MAX_NAME_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def relative_path(path: str, root_dir: str = "") -> str:
    """``path`` relative to the server's ``root_dir`` when it is an absolute path in it,
    as the server's users see it; else as given."""
    path = path.strip()
    if path and root_dir and Path(path).is_absolute():
        with contextlib.suppress(ValueError):
            return Path(path).relative_to(Path(root_dir).expanduser()).as_posix()
    return path


def session_name_for(path: str, root_dir: str = "") -> str | None:
    """The default session name of the notebook at ``path`` (None for no path)."""
    path = relative_path(path, root_dir)
    if not path:
        return None
    notebook = Path(path)
    parts = notebook.with_suffix("").parts[-2:]
    readable = _UNSAFE.sub("-", "-".join(p for p in parts if p not in ("/", ""))).strip("-._")
    digest = hashlib.sha256(notebook.as_posix().encode(errors="surrogateescape")).hexdigest()
    tag = digest[:NAME_HASH_DIGITS]
    # check_session_name: at most 64 characters, the first a letter or digit
    readable = readable[: MAX_NAME_CHARS - NAME_HASH_DIGITS - 1].rstrip("-._")
    return f"{readable}-{tag}" if readable else tag


def numbered(name: str, number: int) -> str:
    """The ``number``-th name to try after ``name`` (2, 3, ...): ``name-2``, cut so that
    it stays a valid session name."""
    suffix = f"-{number}"
    return name[: MAX_NAME_CHARS - len(suffix)].rstrip("-._") + suffix


__all__ = ["NAME_HASH_DIGITS", "numbered", "relative_path", "session_name_for"]
