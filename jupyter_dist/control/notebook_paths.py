"""What a server remembers of each notebook: the session it last used, and what became of
the sessions it started that are gone.

A notebook is known by its file's id where the server has one (`Sender.notebook`:
jupyter_server_fileid's ids survive renames, and a new file that gets an old name gets a
new id), else by its path; keys that are paths follow renames of the notebook or of a
folder above it (`rename`). The notebook's next kernel asks for both (`GET /notebook`):
it goes on with the session the notebook last used, or says what became of the one before
instead of silently starting anew.
"""

from __future__ import annotations

from collections import OrderedDict

#: notebooks remembered (the oldest are forgotten first)
MAX_NOTEBOOKS = 256


def moved(path: str, old: str, new: str) -> str | None:
    """``path`` after ``old`` (a file or a folder) became ``new``; None if it was not in it."""
    if not old or not path:
        return None
    if path == old:
        return new
    if path.startswith(old.rstrip("/") + "/"):
        return new.rstrip("/") + "/" + path[len(old.rstrip("/")) + 1 :]
    return None


def _remember(memory: OrderedDict[str, str], key: str, value: str) -> None:
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > MAX_NOTEBOOKS:
        memory.popitem(last=False)


class NotebookPaths:
    """Per notebook (its file id, else its path): the session it last used, and what
    became of its sessions that are gone."""

    def __init__(self) -> None:
        #: notebook -> the name of the session it last ran a cell on (or attached to)
        self.last_used: OrderedDict[str, str] = OrderedDict()
        #: notebook -> what became of the last session it started, once gone
        self.lost: OrderedDict[str, str] = OrderedDict()

    def rename(self, old: str, new: str) -> None:
        """``old`` (a notebook or a folder) is ``new`` from now on: what is remembered
        under a path in it moves along (ids need not)."""
        old, new = old.strip("/"), new.strip("/")
        if not old or old == new:
            return
        for memory in (self.last_used, self.lost):
            for key in list(memory):
                now = moved(key, old, new)
                if now is not None:
                    memory[now] = memory.pop(key)

    def note_used(self, notebook: str, name: str) -> None:
        """``notebook`` ran a cell on (or attached to) session ``name``."""
        if notebook:
            _remember(self.last_used, notebook, name)

    def note_lost(self, notebook: str, text: str) -> None:
        """A session ``notebook`` started is gone: ``text`` says how."""
        if notebook:
            _remember(self.lost, notebook, text)


__all__ = ["MAX_NOTEBOOKS", "NotebookPaths", "moved"]
