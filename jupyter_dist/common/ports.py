"""Ports: the range MASTER_PORT may take, and a port free right now.

Shared by the control plane (which picks a single machine's store port) and the node
agent (which finds one free on its own node for a multi-node store).
"""

from __future__ import annotations

import random
import socket

from jupyter_dist.errors import SpecError
from jupyter_dist.settings import MASTER_PORTS_VAR as PORTS_VAR

PortRange = tuple[int, int]


def parse_port_range(text: str, where: str = PORTS_VAR) -> PortRange:
    """``"29500-29599"`` -> (29500, 29599); ``"29500"`` -> (29500, 29500)."""
    lo, _, hi = text.strip().partition("-")
    try:
        first, last = int(lo), int(hi or lo)
    except ValueError:
        raise SpecError(f"{where} {text!r}: expected a port range like 29500-29599") from None
    if not 0 < first <= last < 65536:
        raise SpecError(f"{where} {text!r}: expected 1 <= first port <= last port <= 65535")
    return first, last


def free_port(host: str = "localhost", ports: PortRange | None = None) -> int:
    """A TCP port nobody listens on right now: any (bind to 0), or one of ``ports``
    tried in random order; 0 if every port of the range is taken.

    ``host`` is where it will be listened on: ``localhost``, an address, or ``""`` for
    every interface.
    """
    address = "127.0.0.1" if host == "localhost" else host
    candidates = [0]
    if ports is not None:
        candidates = list(range(ports[0], ports[1] + 1))
        random.shuffle(candidates)
    for candidate in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, candidate))
            except OSError:
                continue
            port: int = s.getsockname()[1]
            return port
    return 0


__all__ = ["PORTS_VAR", "PortRange", "free_port", "parse_port_range"]
