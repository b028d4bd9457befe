"""A rank notes the connections its process group opens and shuts only those to free a
collective: not a listener (gloo aborts the process when its listener fails), not the
store's connection, not a client that the kernel's own ports accepted meanwhile, not a
socket opened before or after, and not a number that a closed connection left to another
file."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from jupyter_dist.rank import group_sockets


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def connect(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname()[:2])
    accepted, _ = server.accept()
    return client, accepted


def is_shut(sock: socket.socket) -> bool:
    """Whether the other end of ``sock`` was shut (reads end of file at once)."""
    sock.settimeout(2)
    return sock.recv(1) == b""


def test_only_the_groups_own_connections_are_noted_and_shut(listener: socket.socket) -> None:
    before, before_peer = connect(listener)  # a connection that was there already
    store = socket.create_server(("127.0.0.1", 0))
    store_port = store.getsockname()[1]
    with group_sockets.recording(store_port):
        gloo_listener = socket.create_server(("127.0.0.1", 0))  # the group's listener
        pair, pair_peer = connect(gloo_listener)  # the group's connection, both its ends
        to_store = socket.create_connection(("127.0.0.1", store_port))  # the store's
        store_side, _ = store.accept()
        client, accepted = connect(listener)  # a client of the kernel's own port meanwhile
    after, after_peer = connect(listener)  # opened by user code later
    try:
        assert group_sockets.held() == 2
        assert group_sockets.free() == 2
        assert is_shut(pair_peer) and is_shut(pair)
        for untouched in (before_peer, after_peer, client):  # open: nothing to read yet
            untouched.settimeout(0.2)
            with pytest.raises(TimeoutError):
                untouched.recv(1)
        late, late_peer = connect(gloo_listener)  # the listener still accepts
        late.close()
        late_peer.close()
        to_store.sendall(b"x")  # the store's connection still works
        assert store_side.recv(1) == b"x"
    finally:
        for s in (before, before_peer, pair, pair_peer, gloo_listener, to_store, store_side):
            s.close()
        for s in (after, after_peer, store, client, accepted):
            s.close()


def test_a_number_reused_by_another_socket_is_left_alone(listener: socket.socket) -> None:
    with group_sockets.recording(None):
        pair, pair_peer = connect(listener)
    number = pair.fileno()
    pair.close()
    pair_peer.close()
    other, other_peer = connect(listener)  # may take the number the group's had
    try:
        assert group_sockets.free() == 0
        if other.fileno() == number:
            other_peer.settimeout(0.2)
            with pytest.raises(TimeoutError):
                other_peer.recv(1)
    finally:
        other.close()
        other_peer.close()
