"""Modules imported off the agent's main thread, so that it answers its owner's pings
while they load: importing torch's compiler stack takes seconds of CPU, and longer than
a node's heartbeat deadline on a loaded machine, where an agent that stopped answering
for it was taken for a lost node.

A fork while another thread imports would hand the child a held import lock, so the
agent forks no rank while `busy`: it holds its spawns until the imports are done.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Sequence


class WarmImports:
    """Imports ``names`` once in a daemon thread (`start`); writes a byte to ``wake_fd``
    when done, so that a loop polling it runs what waited."""

    def __init__(self, names: Sequence[str], wake_fd: int) -> None:
        self.names = tuple(names)
        self.wake_fd = wake_fd
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="jupyter-dist-warm-imports", daemon=True
            )
            self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether the imports run now (no fork may happen)."""
        return self._thread is not None and not self._done.is_set()

    def _run(self) -> None:
        try:
            for name in self.names:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
        finally:
            self._done.set()  # before the wake: the loop it wakes sees it done
            with contextlib.suppress(OSError):
                os.write(self.wake_fd, b"w")


__all__ = ["WarmImports"]
