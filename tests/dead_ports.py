"""Addresses where nothing useful answers, for tests of starts that must fail fast."""

from __future__ import annotations

import contextlib
import socket
import threading
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


@contextlib.contextmanager
def silent_peer(
    host: str = "", greeting: bytes = b"", taken_count: int = 1
) -> Iterator[tuple[int, threading.Event]]:
    """A port that takes connections and never says a word (but ``greeting``, sent on
    each as it is taken), and an event set once ``taken_count`` were taken: a client
    connecting there is inside its connect, for as long as it waits."""
    taken = threading.Event()
    held: list[socket.socket] = []
    with socket.socket() as sock:
        sock.bind((host, 0))
        sock.listen(16)

        def accept() -> None:
            with contextlib.suppress(OSError):  # closed: the block ended
                while True:
                    conn = sock.accept()[0]
                    held.append(conn)
                    if greeting:
                        conn.sendall(greeting)
                    if len(held) >= taken_count:
                        taken.set()

        threading.Thread(target=accept, name="silent-peer", daemon=True).start()
        try:
            yield sock.getsockname()[1], taken
        finally:
            for conn in held:
                conn.close()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
