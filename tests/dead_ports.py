"""Addresses where nothing useful answers, for tests of starts that must fail fast."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def closed_port() -> int:
    """A loopback port that was free a moment ago: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def silent_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        sock.listen(16)
        yield sock.getsockname()[1]
