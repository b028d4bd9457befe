"""Nodes that dial back: ``python -m jupyter_dist.node.dial_back`` in the test cluster's
network namespaces, connecting to a listener on the host's side of the bridge.

    async with listening(cluster, nodes=2) as listener:
        with dial_back_nodes(cluster, listener, tmp_path) as nodes:
            session = Session(spec(2), launchers=listener.launcher)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from jupyter_dist.common.events import StreamOut
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers.dial_back import DialBackListener

#: seconds a node process keeps dialling while nobody answers
RETRY_S = 10


@contextlib.asynccontextmanager
async def listening(cluster: Any, nodes: int) -> AsyncIterator[DialBackListener]:
    """A session's listener on the host's address on the test network."""
    listener = DialBackListener(nodes, host=cluster.bridge_address, connect_timeout=60)
    await listener.start()
    try:
        yield listener
    finally:
        await listener.close()


def spec(name: str, nodes: int) -> SessionSpec:
    return SessionSpec(
        name=name,
        nodes=nodes,
        procs_per_node=1,
        hosts=tuple(HostSpec(f"node{i}") for i in range(nodes)),
        launcher="dial_back",
    )


def start_node(
    cluster: Any, node: int, address: str, credentials: str, folder: Path, retry: float = RETRY_S
) -> subprocess.Popen[bytes]:
    """Node ``node``'s dial-back process, its credentials in a 0600 file of ``folder``."""
    path = folder / f"node{node}-{os.urandom(4).hex()}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(credentials)
    argv = ["-m", "jupyter_dist.node.dial_back", address, "--credentials", str(path)]
    argv += ["--retry", str(retry)]
    return subprocess.Popen(
        ["ip", "netns", "exec", cluster.namespaces[node], sys.executable, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def dial_back_nodes(
    cluster: Any,
    listener: DialBackListener,
    folder: Path,
    addresses: Sequence[str | None] = (),
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every node of ``listener`` dialling its address in ``addresses`` (None or none
    given: the listener's); each process and what it started is killed on exit, whatever
    happened."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(listener.nodes):
            address = (addresses[n] if n < len(addresses) else None) or listener.address
            procs.append(start_node(cluster, n, address, listener.credentials(n), folder))
        yield procs
    finally:
        for proc in procs:
            kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    out = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid="], check=True, capture_output=True, text=True
    )
    parent = {int(a): int(b) for a, b in (line.split() for line in out.stdout.splitlines())}
    found: list[int] = []
    todo = [pid]
    while todo:
        here = todo.pop()
        kids = [p for p, pp in parent.items() if pp == here]
        found.extend(kids)
        todo.extend(kids)
    return found


def kill_tree(pid: int) -> None:
    for each in [pid, *children(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def printed(sink: queue.SimpleQueue[Any]) -> str:
    """The text the ranks wrote, ``[rank N] line`` each."""
    lines: list[str] = []
    while not sink.empty():
        event = sink.get()
        if isinstance(event, StreamOut):
            lines += [f"[rank {event.rank}] {t}" for t in event.text.splitlines()]
    return "\n".join(lines)


async def until(test: Any, timeout: float, step: float = 0.2) -> bool:
    """Whether ``test()`` came true within ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not test():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(step)
    return True


def proc_text(pids: Sequence[int], what: str) -> bytes:
    """``/proc/PID/<what>`` (cmdline, environ) of each process still there."""
    out = b""
    for pid in pids:
        with contextlib.suppress(OSError):
            out += Path(f"/proc/{pid}/{what}").read_bytes()
    return out
