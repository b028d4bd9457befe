"""Every frame on the network interfaces of some nodes, captured while a block runs.

A process in each node's namespace reads a raw ``AF_PACKET`` socket (root; no tcpdump
needed) and writes what it saw to a file; ``captured`` yields a function that returns the
bytes of every node's capture once the block has ended.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .cluster import RayCluster

#: reads every frame of its namespace's interfaces until stdin ends, then exits
CAPTURE = r"""
import socket, sys, threading
out = open(sys.argv[1], "wb")
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
raw.settimeout(0.2)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("capturing", flush=True)
while not done.is_set():
    try:
        frame, where = raw.recvfrom(65536)
    except socket.timeout:
        continue
    if where[0] != "lo":
        out.write(frame)
out.close()
"""


@contextlib.contextmanager
def captured(
    cluster: RayCluster, nodes: Sequence[int], folder: Path
) -> Iterator[Callable[[], bytes]]:
    files = [folder / f"capture-{node}.bin" for node in nodes]
    procs = [
        subprocess.Popen(
            cluster.driver_argv([sys.executable, "-c", CAPTURE, str(path)], node),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for node, path in zip(nodes, files, strict=True)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "capturing"
        yield lambda: b"".join(p.read_bytes() for p in files)
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        deadline = time.monotonic() + 10
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
