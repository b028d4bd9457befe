"""An authorizer for tests' servers (``--ServerApp.authorizer_class``): the token's user may
do everything, except that a request marked ``X-Test-Role: reader`` may only read, as a
user given read permission only (no ``write``, no ``execute``)."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.authorizer import Authorizer

#: the header that makes a request a read-only user's
READER = {"X-Test-Role": "reader"}


class ReaderByHeader(Authorizer):
    """Only ``read`` for a request with the `READER` header; everything else allowed."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        reader = handler.request.headers.get("X-Test-Role") == "reader"
        return not reader or action == "read"


AUTHORIZER = f"{__name__}.{ReaderByHeader.__name__}"
