"""Which path a notebook has now, and what became of the sessions named after notebooks.

A session started under its notebook's default name remembers that notebook
(`Session.notebook`). When the notebook (or a folder above it) is renamed, the server
tells `NotebookPaths.rename`: the sessions, the notebooks listed as attached and the
queued requests then name the new path, and a kernel that still names the old one (it was
started before the rename) is understood (`current`). A kernel started after the rename
finds its session by the notebook's new path, not by the name it was started under.

A session named after a notebook that is shut down leaves a line here (`lost`), so that
the notebook's next kernel can say what became of it instead of silently starting anew.
"""

from __future__ import annotations

from collections import OrderedDict

#: renames remembered (the oldest are forgotten first)
MAX_RENAMES = 256
#: notebooks whose session was shut down, remembered until one starts a new one
MAX_LOST = 256


def moved(path: str, old: str, new: str) -> str | None:
    """``path`` after ``old`` (a file or a folder) became ``new``; None if it was not in it."""
    if not old or not path:
        return None
    if path == old:
        return new
    if path.startswith(old.rstrip("/") + "/"):
        return new.rstrip("/") + "/" + path[len(old.rstrip("/")) + 1 :]
    return None


class NotebookPaths:
    """The renames a server saw, and the sessions of notebooks that were shut down."""

    def __init__(self) -> None:
        #: a path a kernel may still name -> the notebook's path now
        self.renamed: OrderedDict[str, str] = OrderedDict()
        #: a notebook's path -> what became of the session named after it
        self.lost: OrderedDict[str, str] = OrderedDict()

    def rename(self, old: str, new: str) -> None:
        """``old`` (a notebook or a folder) is ``new`` from now on."""
        old, new = old.strip("/"), new.strip("/")
        if not old or old == new:
            return
        for before, after in list(self.renamed.items()):
            now = moved(after, old, new)
            if now is not None:
                self.renamed[before] = now
        for before in [b for b, a in self.renamed.items() if a == b]:
            del self.renamed[before]  # renamed back
        self.renamed[old] = new
        self.renamed.move_to_end(old)
        while len(self.renamed) > MAX_RENAMES:
            self.renamed.popitem(last=False)
        for path in list(self.lost):
            now = moved(path, old, new)
            if now is not None:
                self.lost[now] = self.lost.pop(path)

    def current(self, path: str) -> str:
        """The path the notebook a kernel calls ``path`` has now."""
        if not path:
            return path
        for old in reversed(self.renamed):
            now = moved(path, old, self.renamed[old])
            if now is not None:
                return now
        return path

    def note_lost(self, path: str, text: str) -> None:
        """The session named after notebook ``path`` is gone: ``text`` says how."""
        if not path:
            return
        self.lost[path] = text
        self.lost.move_to_end(path)
        while len(self.lost) > MAX_LOST:
            self.lost.popitem(last=False)


__all__ = ["MAX_LOST", "MAX_RENAMES", "NotebookPaths", "moved"]
