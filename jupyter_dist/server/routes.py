"""Every REST route of the server extension under ``/jupyter-dist/api/v1``, in one list
(the app registers it; the tests check that each is documented and guarded)."""

from __future__ import annotations

from typing import Any

from jupyter_dist.server.handlers import HANDLERS
from jupyter_dist.server.notebook_handlers import NOTEBOOK_HANDLERS
from jupyter_dist.server.profile_handlers import PROFILE_HANDLERS
from jupyter_dist.server.sidebar_handlers import SIDEBAR_HANDLERS
from jupyter_dist.server.turn_handlers import TURN_HANDLERS

API_HANDLERS: list[tuple[str, Any]] = [
    *HANDLERS,
    *TURN_HANDLERS,
    *SIDEBAR_HANDLERS,
    *NOTEBOOK_HANDLERS,
    *PROFILE_HANDLERS,
]
