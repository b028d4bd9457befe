"""``GET /notebook``: the session named after the asking notebook, found by the path the
notebook has now, and what became of it when it is gone.

A notebook kernel asks once, when it starts: one started after its notebook was renamed
finds the session the notebook used under its old name, and one whose session was shut
down meanwhile learns who did it instead of silently starting a new one.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_dist.common.payloads import NotebookSession
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.server.handlers import DistHandler, maps_errors


class NotebookHandler(DistHandler):
    """``/notebook?path=PATH``: ``{path, session, lost}`` for the notebook at ``path``
    (the ``path`` query argument a notebook kernel sends with every request)."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self) -> None:
        path = self.sender().path
        session, lost = self.manager.notebook_session(path)
        reply: NotebookSession = {
            "path": path,
            "session": session.name if session is not None else None,
            "lost": lost,
        }
        self.reply(reply)


NOTEBOOK_HANDLERS = [(rf"{API_PREFIX}/notebook", NotebookHandler)]

__all__ = ["NOTEBOOK_HANDLERS", "NotebookHandler"]
