"""The embedded control plane: a `SessionManager` on a loop thread in this process.

This is what the magic uses when no Jupyter server owns the sessions (plain IPython,
nbclient, tests). Every session it started is shut down when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from jupyter_dist.loop_thread import LoopThread, shared_loop
from jupyter_dist.manager import SessionManager

T = TypeVar("T")
log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_S = 20.0


class InProcessControl:
    """Sessions owned by this process."""

    def __init__(self, loop: LoopThread | None = None) -> None:
        self.loop = loop or shared_loop()
        self.manager = SessionManager()
        atexit.register(self.close)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.loop.run(coro, timeout)

    def close(self) -> None:
        """Shut every session down (at exit, or when the extension is unloaded)."""
        if not self.manager.sessions:
            return
        with contextlib.suppress(Exception):
            self.loop.run(self.manager.shutdown_all(), SHUTDOWN_TIMEOUT_S)


_control: InProcessControl | None = None
_lock = threading.Lock()


def control() -> InProcessControl:
    """This process's embedded control plane, created on first use."""
    global _control
    with _lock:
        if _control is None:
            _control = InProcessControl()
        return _control
