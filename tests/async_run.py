"""Coroutine tests run as plain pytest tests, each in a fresh event loop (``asyncio.run``):
pytest-asyncio's plugin is not used, as it hangs pytest-jupyter's server fixtures."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """``test`` (a coroutine function taking pytest's fixtures) run to its end."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run
