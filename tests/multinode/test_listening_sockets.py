"""What a two-node session listens on, node by node (real sshd nodes in network namespaces).

Only torch.distributed may be reachable from other machines: the rendezvous store (rank 0,
MASTER_PORT, node 0) and gloo's listeners in the rank processes, bound to the node's address
on the interface GLOO_SOCKET_IFNAME names. The agents listen on nothing; the rank kernels
listen on Unix sockets in their agent's private folder, which the notebook reaches through
SSH-forwarded Unix sockets in a private local folder.

psutil reads the socket tables of the network namespace it runs in, so for the nodes'
processes this module reads ``/proc/PID/net/*``, which are the tables of PID's namespace.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import CellOutput
from tests.integration.test_security import (
    PIPE_PORT_CELL,
    Listener,
    check_private_folder,
    exposed,
    inet_listeners,
    kernel_sockets,
    master_port,
    ours_and_below,
)

from .test_ssh_sessions import flags

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]

_TCP_LISTEN = "0A"
_UNIX_ACCEPTCON = 0x10000  # a listening Unix socket


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[8:-1])
    except OSError:
        pass
    return found


def _address(hex_addr: str) -> tuple[str, int]:
    """``0100007F:0016`` -> ("127.0.0.1", 22); IPv6 likewise (/proc/net/tcp6's order)."""
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def _table(pid: int, name: str) -> list[list[str]]:
    try:
        with open(f"/proc/{pid}/net/{name}") as f:
            return [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return []


def proc_listeners(pid: int) -> list[Listener]:
    """The listening inet sockets of ``pid``, read in ``pid``'s network namespace."""
    inodes = _socket_inodes(pid)
    found = []
    for name in ("tcp", "tcp6", "udp", "udp6"):
        for fields in _table(pid, name):
            if len(fields) < 10 or fields[9] not in inodes:
                continue
            ip, port = _address(fields[1])
            _, remote_port = _address(fields[2])
            tcp = name.startswith("tcp") and fields[3] == _TCP_LISTEN
            udp = name.startswith("udp") and remote_port == 0
            if tcp or udp:
                found.append(Listener(pid, name[:3], ip, port))
    return found


def proc_unix_listening(pid: int) -> set[str]:
    """The paths of the Unix sockets ``pid`` listens on (abstract ones start with @)."""
    inodes = _socket_inodes(pid)
    return {
        fields[7]
        for fields in _table(pid, "unix")
        if len(fields) >= 8 and fields[6] in inodes and int(fields[3], 16) & _UNIX_ACCEPTCON
    }


def interface_addresses(cluster: Any, node: int, ifname: str) -> set[str]:
    out = cluster.run(node, ["ip", "-o", "addr", "show", "dev", ifname], check=True).stdout
    return {m.split("/")[0] for m in re.findall(r"\binet6? (\S+)", out)}


def test_a_two_node_session_listens_only_where_torch_distributed_must(
    run: Run, shell: Any, cluster: Any
) -> None:
    from jupyter_dist.notebook.owners import embedded_owner

    out = run(
        f"%%distributed --session sockets {flags(cluster)} --procs 2\n"
        "import os, torch, torch.distributed as dist\n"
        f"{PIPE_PORT_CELL}"
        "_jd_if = os.environ['GLOO_SOCKET_IFNAME']\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item())"
    )
    try:
        assert out.ok, out.stdout + out.stderr
        assert "[ranks 0-3] sum 4.0" in out.stdout, out.stdout
        session: Any = embedded_owner().manager.get("sockets")
        status = session.status()
        store = master_port(status)
        master = str(status["master"]).rsplit(":", 1)[0]
        assert master == cluster.addresses[0], master
        pipes = shell.run_line_magic("dist", "pull _jd_pipe --session sockets")
        ifnames = shell.run_line_magic("dist", "pull _jd_if --session sockets")
        by_node: dict[int, dict[int, int]] = {}
        for r in status["ranks"]:
            by_node.setdefault(r["node_rank"], {})[r["rank"]] = r["pid"]
        problems: list[str] = []

        for node, address in enumerate(cluster.addresses):
            pids = set(cluster.pids(node))
            ranks = by_node[node]
            agent = status["nodes"][node]["agent_pid"]
            assert agent in pids and set(ranks.values()) <= pids, (node, agent, ranks, pids)
            listeners = [sock for pid in sorted(pids) for sock in proc_listeners(pid)]
            # the reading works: the node's sshd is seen where it listens
            sshd = Listener(cluster.sshd_pids[node], "tcp", address, 22)
            assert sshd in listeners, listeners

            ifname = {ifnames[r] for r in ranks}
            assert len(ifname) == 1, ifname
            gloo_addresses = interface_addresses(cluster, node, ifname.pop())
            assert address in gloo_addresses, gloo_addresses
            pid_rank = {pid: rank for rank, pid in ranks.items()}
            gloo_seen = set()
            for sock in listeners:
                rank = pid_rank.get(sock.pid)
                if sock == sshd:
                    continue
                if rank == 0 and sock.proto == "tcp" and sock.port == store and sock.ip == master:
                    continue  # the rendezvous store, on MASTER_ADDR only (not on ::)
                if rank is not None and sock.proto == "tcp":
                    if sock.port == pipes[rank] and sock.ip == "127.0.0.1":
                        continue  # ipykernel's IOPub pipe, loopback only
                    if sock.ip in gloo_addresses:
                        gloo_seen.add(rank)
                        continue  # gloo, on the node's address on GLOO_SOCKET_IFNAME
                problems.append(f"node {node}: {sock}")
            assert gloo_seen == set(ranks), (node, gloo_seen, listeners)

            # the kernels' Unix sockets: in the agent's private folder on that node
            folders = {Path(session.ranks[r].log).parent for r in ranks}
            assert len(folders) == 1, folders
            folder = folders.pop()
            sockets: set[str] = set()
            for pid in [agent, *ranks.values()]:
                mine = {p for p in proc_unix_listening(pid) if not p.startswith("@")}
                outside = {p for p in mine if Path(p).parent != folder}
                assert not outside, f"node {node} pid {pid}: Unix sockets outside {folder}"
                sockets |= mine
            assert len(sockets) == 5 * len(ranks), sockets  # shell, iopub, stdin, control, hb
            check_private_folder(folder, sockets)

        assert problems == [], "listening where they should not:\n" + "\n".join(problems)
        # the notebook's side: nothing on the network, the forwarded sockets private
        here = inet_listeners(ours_and_below(psutil.Process()))
        assert exposed(here, set()) == []
        forwarded: set[str] = set()
        for rec in session.ranks.values():
            forwarded |= kernel_sockets(rec.connection)
        tunnels = {Path(p).parent for p in forwarded}
        assert len(tunnels) == 2, tunnels  # one folder per node's SSH connection
        for tunnel in tunnels:
            check_private_folder(tunnel, {p for p in forwarded if Path(p).parent == tunnel})
    finally:
        run("%dist shutdown --session sockets")
