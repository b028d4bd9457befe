"""The asyncio loop that runs the control plane inside a notebook kernel.

The notebook kernel's main thread runs user code (and our magics) synchronously, while
sessions, agents and kernel clients are coroutines. One daemon thread owns an event
loop for all of them; the magic submits coroutines to it and waits, so a KeyboardInterrupt
in the main thread never tears the loop down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one asyncio event loop forever."""

    def __init__(self, name: str = "jupyter-dist-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the caller may wait on the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result.

        If the wait is interrupted (KeyboardInterrupt), the coroutine is cancelled.
        """
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise


_shared: LoopThread | None = None
_lock = threading.Lock()


def shared_loop() -> LoopThread:
    """The process-wide loop thread, started on first use."""
    global _shared
    with _lock:
        if _shared is None or not _shared.thread.is_alive():
            _shared = LoopThread()
        return _shared
