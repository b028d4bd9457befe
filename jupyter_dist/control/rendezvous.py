"""Where the ranks of a session meet, decided in one place.

On one machine the store listens on ``localhost`` at a port free right now, and gloo and
NCCL are told to use the loopback interface (else gloo binds whatever the hostname resolves
to, possibly an address other machines reach), unless the user chose one. Across nodes,
MASTER_ADDR is node 0's address as the other nodes reach it (the address its SSH
connection landed on), MASTER_PORT a port its agent found free, and each node is told
which interface routes there (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; without it gloo
advertises 127.0.0.1 to its peers), unless the user chose one. Rank 0 then hosts the store,
listening on MASTER_ADDR only (never on every interface: a node 0 that does not hold that
address is an error), and every other node must reach it before anyone waits in
``init_process_group``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_dist.common.ports import PORTS_VAR, PortRange, free_port, parse_port_range
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.errors import AgentError

if TYPE_CHECKING:
    from jupyter_dist.control.agent_client import AgentClient


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet: torch.distributed's store address and the run id."""

    master_addr: str
    master_port: int
    run_id: str

    @classmethod
    def local(cls, ports: PortRange | None = None) -> Rendezvous:
        """A rendezvous on this machine, on a port free right now."""
        return cls("localhost", free_port("localhost", ports), str(uuid.uuid4()))


IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def is_ip_address(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (not a host name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def loopback_interface() -> str | None:
    """The interface holding 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS), if any."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
            return str(name)
    return None


def loopback_env(user_env: Mapping[str, str]) -> dict[str, str]:
    """A single-host session's socket interfaces: loopback, so that gloo's and NCCL's
    listeners are reachable from this machine only; the user's choice wins."""
    loopback = loopback_interface()
    env: dict[str, str] = {}
    for name in IFNAME_VARS:
        chosen = user_env.get(name) or loopback
        if chosen:
            env[name] = chosen
    return env


async def plan_rendezvous(
    spec: SessionSpec, nodes: Sequence[AgentClient], user_env: Mapping[str, str]
) -> tuple[Rendezvous, dict[int, dict[str, str]]]:
    """Where ranks meet, and each node's socket interface toward it.

    On one machine that is the loopback interface. Across nodes, MASTER_ADDR is node 0's
    address as the other nodes reach it (the address its SSH connection landed on); gloo
    and NCCL are told which interface routes there (without it gloo advertises 127.0.0.1
    to its peers). Either way, unless the user chose one.
    """
    ports = parse_port_range(user_env[PORTS_VAR]) if user_env.get(PORTS_VAR) else None
    if not spec.remote:
        local = Rendezvous.local(ports)
        if not local.master_port:
            raise AgentError(f"{PORTS_VAR}={user_env[PORTS_VAR]}: every port is taken here")
        return local, {node: loopback_env(user_env) for node in range(spec.nodes)}
    head = nodes[0]
    assert head.info is not None
    if not head.info.free_port:
        raise AgentError(
            f"node {head.host!r}: no free port for the rendezvous in "
            f"{PORTS_VAR}={user_env.get(PORTS_VAR)}; widen the range"
        )
    addr = head.launcher.peer_address() or head.host
    rdzv = Rendezvous(addr, head.info.free_port, str(uuid.uuid4()))
    routes = await asyncio.gather(*(n.route(addr) for n in nodes))
    own = routes[0].get("ip")
    if is_ip_address(addr) and own and own != addr:
        raise AgentError(
            f"node 0 ({head.host}) does not hold the address {addr} its SSH connection "
            f"reached (it would leave from {own}): NAT or a proxy lies between, and the "
            "rendezvous store can only listen on an address of node 0 itself; connect to "
            "node 0 by an address it holds and the other nodes reach (HostName in the ssh "
            "config)"
        )
    node_env: dict[int, dict[str, str]] = {}
    for node, route in zip(nodes, routes, strict=True):
        ifname = route.get("ifname")
        if not ifname:
            raise AgentError(
                f"node {node.host!r} has no route to node 0 ({head.host}, {addr}): "
                f"{route.get('error', 'no interface holds the address it would use')}; "
                "check the network between the nodes, or set GLOO_SOCKET_IFNAME"
            )
        env: dict[str, str] = {}
        for name in IFNAME_VARS:
            env[name] = user_env.get(name) or ifname
        node_env[node.node_rank] = env
    return rdzv, node_env


async def check_reachable(
    spec: SessionSpec, nodes: Sequence[AgentClient], rdzv: Rendezvous
) -> None:
    """Every node must reach the store rank 0 hosts, else init would just time out."""
    if not spec.remote:
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
