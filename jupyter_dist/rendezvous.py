"""Where the ranks of a session meet, decided in one place.

On one machine the store listens on ``localhost`` at a port free right now. Across nodes,
MASTER_ADDR is node 0's address as the other nodes reach it (the address its SSH
connection landed on), MASTER_PORT a port its agent found free, and each node is told
which interface routes there (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; without it gloo
advertises 127.0.0.1 to its peers), unless the user chose one. Rank 0 then hosts the store,
and every other node must reach it before anyone waits in ``init_process_group``.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_dist.errors import AgentError
from jupyter_dist.spec import SessionSpec

if TYPE_CHECKING:
    from jupyter_dist.node_agent import NodeAgent


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet: torch.distributed's store address and the run id."""

    master_addr: str
    master_port: int
    run_id: str

    @classmethod
    def local(cls) -> Rendezvous:
        """A rendezvous on this machine, on a port free right now."""
        return cls("localhost", free_port("localhost"), str(uuid.uuid4()))


def free_port(host: str = "localhost") -> int:
    """A TCP port nobody listens on right now (the usual bind-to-0 approach).

    ``host`` is where it will be listened on: ``localhost``, an address, or ``""`` for
    every interface.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1" if host == "localhost" else host, 0))
        port: int = s.getsockname()[1]
        return port


async def plan_rendezvous(
    spec: SessionSpec, nodes: Sequence[NodeAgent], user_env: Mapping[str, str]
) -> tuple[Rendezvous, dict[int, dict[str, str]]]:
    """Where ranks meet, and each node's socket interface toward it.

    MASTER_ADDR is node 0's address as the other nodes reach it (the address its SSH
    connection landed on); gloo and NCCL are told which interface routes there
    (without it gloo advertises 127.0.0.1 to its peers), unless the user chose one.
    """
    if not spec.hosts:
        return Rendezvous.local(), {}
    head = nodes[0]
    assert head.info is not None
    addr = head.launcher.peer_address() or head.host
    rdzv = Rendezvous(addr, head.info.free_port, str(uuid.uuid4()))
    routes = await asyncio.gather(*(n.route(addr) for n in nodes))
    node_env: dict[int, dict[str, str]] = {}
    for node, route in zip(nodes, routes, strict=True):
        if not route.get("ifname"):
            raise AgentError(
                f"node {node.host!r} has no route to node 0 ({head.host}, {addr}): "
                f"{route.get('error', 'no interface holds the address it would use')}; "
                "check the network between the nodes, or set GLOO_SOCKET_IFNAME"
            )
        env = {}
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env[name] = user_env.get(name) or route["ifname"]
        node_env[node.node_rank] = env
    return rdzv, node_env


async def check_reachable(spec: SessionSpec, nodes: Sequence[NodeAgent], rdzv: Rendezvous) -> None:
    """Every node must reach the store rank 0 hosts, else init would just time out."""
    if not spec.hosts:
        return
    probes = await asyncio.gather(*(n.probe(rdzv.master_addr, rdzv.master_port) for n in nodes[1:]))
    for node, result in zip(nodes[1:], probes, strict=True):
        if not result.get("ok"):
            raise AgentError(
                f"node {node.host!r} cannot reach the rendezvous at "
                f"{rdzv.master_addr}:{rdzv.master_port} on node 0 ({result.get('error')}); "
                "open that port between the nodes (firewall) or pick the interface with "
                "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"
            )
