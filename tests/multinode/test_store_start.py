"""Rank 0's rendezvous store starts even when the name server drops queries.

Making a TCPStore includes its own client's connection, whose logging looks up the peer's
name: on a machine whose name server drops the query, that costs glibc's 5 s timeout per
try while the connection waits in C++. Here the ranks' network namespace gets a name
server that never answers; the first try at the store runs out of its time, and the next
one (torch stops looking names up after one lookup failed) starts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import require_cluster_support

SILENT_DNS = "127.0.0.53"
TRY = textwrap.dedent(
    """
    import json, sys, time
    import jupyter_dist.rank.bootstrap as bootstrap
    from jupyter_dist.control.rendezvous import free_port

    bootstrap.STORE_START_S = 2.0
    bootstrap.STORE_TRIES = int(sys.argv[1])
    port = free_port("localhost")
    began = time.monotonic()
    try:
        bootstrap.host_store("localhost", port, 1, 60.0)
        out = {"ok": True, "timeout_s": bootstrap._store.timeout.total_seconds()}
    except RuntimeError as err:
        out = {"ok": False, "error": str(err)}
    out["took"] = time.monotonic() - began
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def deaf_dns_namespace() -> Iterator[str]:
    """A network namespace whose only name server never answers."""
    require_cluster_support()
    name = f"jd-deafdns-{os.getpid()}"
    conf = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "add", name], check=True)
    server = None
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        conf.mkdir(parents=True)
        (conf / "resolv.conf").write_text(f"nameserver {SILENT_DNS}\n")
        swallow = (
            "import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.bind(({SILENT_DNS!r}, 53))\n"
            "print('ready', flush=True)\n"
            "while True:\n    s.recvfrom(4096)\n"
        )
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", swallow],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield name
    finally:
        if server is not None:
            server.kill()
            server.wait()
        (conf / "resolv.conf").unlink(missing_ok=True)
        if conf.exists():
            conf.rmdir()
        subprocess.run(["ip", "netns", "delete", name], check=False)


def try_store(namespace: str, tries: int) -> dict[str, object]:
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", TRY, str(tries)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_store_whose_first_try_stalls_on_dns_starts_on_the_next(deaf_dns_namespace: str) -> None:
    began = time.monotonic()
    result = try_store(deaf_dns_namespace, tries=3)
    assert result["ok"], result
    # the first try waited for the lookup (at least one 5 s resolver timeout)
    assert float(str(result["took"])) >= 5.0, result
    # and the store keeps the session's timeout, not the short one of a try
    assert result["timeout_s"] == 60.0
    assert time.monotonic() - began < 110


def test_without_a_second_try_the_stall_is_named(deaf_dns_namespace: str) -> None:
    """The scenario really stalls the first try (the second is what recovers)."""
    result = try_store(deaf_dns_namespace, tries=1)
    assert not result["ok"], result
    assert "could not start the rendezvous store at localhost:" in str(result["error"])
    assert "try 1: DistNetworkError: The client socket has timed out" in str(result["error"])
