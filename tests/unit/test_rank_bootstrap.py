"""Rank 0's rendezvous store listens on MASTER_ADDR only, or fails saying why: it never
falls back to every interface."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_dist.rank import bootstrap
from jupyter_dist.settings import MASTER_PORTS_VAR

#: TEST-NET-1 (RFC 5737): an address no machine here holds
ELSEWHERE = "192.0.2.1"


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """torch.distributed.TCPStore replaced by a recorder of how it was made (no torch)."""
    made: list[dict[str, Any]] = []

    class TCPStore:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append({"args": args, **kwargs})

        def set_timeout(self, timeout: Any) -> None:
            pass

    torch = types.ModuleType("torch")
    distributed = types.ModuleType("torch.distributed")
    distributed.TCPStore = TCPStore  # type: ignore[attr-defined]
    torch.distributed = distributed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", distributed)
    monkeypatch.setattr(bootstrap, "_store", None)
    yield made
    for store in made:
        with contextlib.suppress(OSError, TypeError):
            os.close(store["master_listen_fd"])


def test_the_store_listens_on_the_address_given_and_only_there(
    stores: list[dict[str, Any]], port: int
) -> None:
    bootstrap.host_store("127.0.0.1", port, 2, 5.0)
    [store] = stores
    fd = store["master_listen_fd"]
    assert isinstance(fd, int)
    with socket.socket(fileno=os.dup(fd)) as listening:
        assert listening.getsockname() == ("127.0.0.1", port)


def test_an_address_not_of_this_machine_fails_instead_of_every_interface(
    stores: list[dict[str, Any]], port: int
) -> None:
    with pytest.raises(RuntimeError) as caught:
        bootstrap.host_store(ELSEWHERE, port, 2, 5.0)
    assert stores == []  # no TCPStore was made, so nothing listens on 0.0.0.0
    message = str(caught.value)
    assert f"cannot listen on {ELSEWHERE}:{port} on {socket.gethostname()}" in message
    assert "must be an address of this machine (node 0) that the other nodes reach" in message
    assert "never opened on every interface" in message


def test_a_taken_port_fails_naming_it(stores: list[dict[str, Any]]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(RuntimeError) as caught:
            bootstrap.host_store("127.0.0.1", taken, 2, 5.0)
    assert stores == []
    assert f"another process holds port {taken}" in str(caught.value)
    assert MASTER_PORTS_VAR in str(caught.value)


def test_a_name_that_does_not_resolve_fails(
    stores: list[dict[str, Any]], port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_such_name(*_args: Any, **_kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with pytest.raises(RuntimeError, match="'nosuch' does not resolve here"):
        bootstrap.host_store("nosuch", port, 2, 5.0)
    assert stores == []
