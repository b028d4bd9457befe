"""``GET /notebook``: the asking notebook as the server knows it (its path now, its file
id), the session it goes on with, and the name its new session gets.

A notebook kernel asks once, when it starts: one started after its notebook was renamed
finds the session the notebook last used under its old name; one whose notebook is a new
file that got an old name (JupyterLab reuses ``Untitled.ipynb``) gets a session name of
its own, not the renamed notebook's; one whose session was shut down meanwhile learns who
did it instead of silently starting a new one.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_dist.common.notebook_names import session_name_for
from jupyter_dist.common.payloads import NotebookSession
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.server.handlers import DistHandler, maps_errors


class NotebookHandler(DistHandler):
    """``/notebook?path=PATH&kernel_id=ID``: ``{path, file_id, session, name, lost}`` for
    the notebook of kernel ``ID`` (the query arguments a notebook kernel sends with every
    request; the path is only what it was started with)."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self) -> None:
        notebook = await self.sender()
        session, lost = self.manager.notebook_session(notebook)
        base = session_name_for(notebook.path)
        reply: NotebookSession = {
            "path": notebook.path,
            "file_id": notebook.file_id,
            "session": session.name if session is not None else None,
            "name": self.manager.name_for(notebook, base) if base else "",
            "lost": lost,
        }
        self.reply(reply)


NOTEBOOK_HANDLERS = [(rf"{API_PREFIX}/notebook", NotebookHandler)]

__all__ = ["NOTEBOOK_HANDLERS", "NotebookHandler"]
