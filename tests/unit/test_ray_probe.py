"""The owner asks a Ray address before it starts a driver: a refused port and a port that
takes the connection and says nothing fail at once (real sockets on loopback), anything
that answers goes on to the driver, and the words name the address and its origin."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from jupyter_dist.control.launchers.ray_probe import (
    HTTP2_PREFACE,
    auto_from_file,
    probe,
    ray_address_file,
    split_address,
)
from jupyter_dist.control.launchers.ray_reach import failure_text
from tests import dead_ports


@contextlib.contextmanager
def answering_port() -> Iterator[tuple[int, list[bytes]]]:
    """A port that answers each connection's first bytes, as an HTTP/2 server its
    client's preface (an empty SETTINGS frame); what each client sent is kept."""
    heard: list[bytes] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)

        def serve() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = server.accept()
                    with conn:
                        heard.append(conn.recv(len(HTTP2_PREFACE)))
                        conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")

        threading.Thread(target=serve, daemon=True).start()
        try:
            yield server.getsockname()[1], heard
        finally:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)


def test_a_refused_port_is_said_at_once() -> None:
    port = dead_ports.closed_port()
    how = asyncio.run(probe(f"127.0.0.1:{port}", timeout=5.0))
    assert how == ": the connection was refused (nothing listens on that port)"
    said = failure_text({"unreachable": True, "how": how}, f"127.0.0.1:{port}", "--ray-address")
    assert said is not None and said.startswith(
        f"Ray address 127.0.0.1:{port} (given by --ray-address): no Ray cluster answered "
        "there: the connection was refused (nothing listens on that port). Expected the GCS "
        "address of a running cluster's head"
    )


def test_a_port_that_takes_the_connection_and_says_nothing_fails_at_its_bound() -> None:
    with dead_ports.silent_peer("127.0.0.1") as (port, taken):
        how = asyncio.run(probe(f"127.0.0.1:{port}", timeout=0.5))
        assert taken.is_set()
    assert how == " within 0 s (it took the connection and said nothing on it)"


def test_an_answer_lets_the_driver_go_on_and_the_preface_is_http2s() -> None:
    with answering_port() as (port, heard):
        assert asyncio.run(probe(f"127.0.0.1:{port}", timeout=5.0)) is None
    assert heard and heard[0] == HTTP2_PREFACE


def test_addresses_split_as_ray_options_let_them_through() -> None:
    assert split_address("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert split_address("[::1]:6379") == ("::1", 6379)
    assert split_address("head.example:6380") == ("head.example", 6380)


def test_auto_reads_rays_address_file_where_ray_keeps_it(tmp_path: Path) -> None:
    file = tmp_path / "ray" / "ray_current_cluster"
    assert ray_address_file({"RAY_TMPDIR": str(tmp_path), "TMPDIR": "/x"}) == str(file)
    assert ray_address_file({"TMPDIR": str(tmp_path)}) == str(file)  # on Linux, as Ray
    assert ray_address_file({}) == "/tmp/ray/ray_current_cluster"
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert auto_from_file(env) is None  # no file: the driver looks at what runs here
    file.parent.mkdir()
    file.write_text("10.0.0.7:6379\n")
    assert auto_from_file(env) == (
        "10.0.0.7:6379",
        f"the cluster last started on this machine with `ray start`, as Ray's {file} says",
    )
    for junk in ("-x:1", "not an address", "auto", "\xff", "1" * 2000):
        file.write_bytes(junk.encode("latin-1"))
        assert auto_from_file(env) is None, junk  # left to the driver, which says why


def test_auto_whose_file_names_a_dead_cluster_fails_before_a_driver(tmp_path: Path) -> None:
    port = dead_ports.closed_port()
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    found = auto_from_file({"RAY_TMPDIR": str(tmp_path)})
    assert found is not None
    how = asyncio.run(probe(found[0], timeout=5.0))
    event = {"unreachable": True, "how": how, "address": found[0], "found": found[1]}
    said = failure_text(event, "auto", "auto")
    assert said is not None and said.startswith(
        f"Ray address 127.0.0.1:{port} (found by `auto`: the cluster last started on this "
        "machine with `ray start`"
    )
    assert "no Ray cluster answered there: the connection was refused" in said
