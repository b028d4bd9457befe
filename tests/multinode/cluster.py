"""Throwaway multi-node SSH clusters on one Linux machine, for the multi-node tests.

Each node is a network namespace holding one OpenSSH ``sshd``; a veth pair joins it to a
Linux bridge in the host namespace, so traffic between nodes, and between the test process
and a node, crosses a real (virtual) network. Every ``sshd`` also has its own UTS namespace,
so ``hostname`` says ``node0``, ``node1``, ..., and its own ``/etc/hosts`` naming every node.
The PID namespace and the filesystem stay shared: pids a node reports are the host's, and the
test process's own Python environment is there on every node.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2, util-linux, ``hostname`` and OpenSSH.
``.ci/setup-system`` installs the packages. The namespaces, bridge and their teardown are
``tests/netns.py``'s.

    with ssh_cluster(2, workdir=tmp_path) as cluster:
        subprocess.run(["ssh", "-F", str(cluster.config_path), "node1", "hostname"])
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests import netns
from tests.netns import BASE_PREFIX, cleanup_stale, kill_netns, netns_pids, proc_state
from tests.netns import read_text as _read
from tests.netns import run_checked as _run
from tests.netns import tail as _tail

__all__ = [
    "BASE_PREFIX",
    "Cluster",
    "cleanup_stale",
    "missing_requirements",
    "ssh_cluster",
]

SSHD = Path("/usr/sbin/sshd")
SSHD_PRIVSEP_DIR = Path("/run/sshd")
_TOOLS = {
    "unshare": "util-linux",
    "hostname": "hostname",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
}
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


@dataclass(frozen=True)
class Cluster:
    """A running cluster: node ``i`` is ``hosts[i]`` at ``addresses[i]`` in ``namespaces[i]``.

    ``ssh -F config_path node0 ...`` (or asyncssh with ``config=[config_path]``) reaches a
    node as ``user`` with ``client_key_path``, checking host keys against
    ``known_hosts_path``. ``bridge_address`` is the host's own address on the test network.
    """

    prefix: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    namespaces: tuple[str, ...]
    bridge: str
    bridge_address: str
    user: str
    workdir: Path
    config_path: Path
    known_hosts_path: Path
    client_key_path: Path
    sshd_pids: tuple[int, ...]

    def pids(self, i: int) -> list[int]:
        """Host-side pids of every live process in node ``i``'s network namespace."""
        return netns_pids(self.namespaces[i])

    def kill_sshd(self, i: int) -> None:
        """SIGKILL node ``i``'s sshd and every process in its namespace (a node crash)."""
        kill_netns(self.namespaces[i], first=self.sshd_pids[i])

    def sshd_alive(self, i: int) -> bool:
        return self.sshd_pids[i] in netns_pids(self.namespaces[i])

    def run(
        self,
        i: int,
        cmd: Sequence[str],
        *,
        timeout: float = 60,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in node ``i``'s network namespace (``ip netns exec``), capturing output.

        Only the network (and ``/etc/hosts``) is the node's: the command keeps the host's
        hostname and PID namespace, and it works after ``kill_sshd(i)``.
        """
        return subprocess.run(
            ["ip", "netns", "exec", self.namespaces[i], *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def ssh_argv(self, i: int, command: str) -> list[str]:
        """The OpenSSH client command line that runs ``command`` (a shell string) on node i."""
        return ["ssh", "-F", str(self.config_path), self.hosts[i], command]

    def ssh(
        self, i: int, command: str, *, timeout: float = 60, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (a shell string) on node ``i`` over ssh, capturing output."""
        return subprocess.run(
            self.ssh_argv(i, command),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            stdin=subprocess.DEVNULL,
        )


def missing_requirements() -> list[str]:
    """What this machine lacks to run a cluster; empty when it can."""
    problems = netns.missing_requirements(_TOOLS)
    if sys.platform != "linux":
        return problems
    if not os.access(SSHD, os.X_OK):
        problems.append(f"{SSHD} not found (Debian package openssh-server)")
    if os.geteuid() == 0 and _password_field(_user()).startswith("!"):
        problems.append(
            f"account {_user()!r} is locked ('!' password), which sshd with UsePAM no refuses;"
            f" unlock it for key logins with: usermod -p '*' {_user()}"
        )
    return problems


@contextlib.contextmanager
def ssh_cluster(n: int = 2, *, workdir: Path) -> Iterator[Cluster]:
    """Start ``n`` sshd nodes on a private bridge; remove every trace of them on exit.

    Keys, configs, pid files and ``node<i>/sshd.log`` live in ``workdir``. Leftovers of
    earlier runs that crashed (their owner process is gone) are removed first.
    """
    problems = missing_requirements()
    if problems:
        raise RuntimeError("cannot start an ssh test cluster: " + "; ".join(problems))
    if not 1 <= n <= 200:
        raise ValueError(f"n must be between 1 and 200, not {n}")
    workdir = Path(workdir).absolute()
    if any(c in str(workdir) for c in '"%\n'):
        raise ValueError(f"workdir must not contain '\"', '%' or newlines: {workdir}")
    workdir.mkdir(parents=True, exist_ok=True)
    SSHD_PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    with netns.namespace_network([f"node{i}" for i in range(n)]) as net:
        yield _start(net, workdir)


# --- setup ---------------------------------------------------------------------------------


def _start(net: netns.Network, workdir: Path) -> Cluster:
    hosts, addresses, namespaces = net.hosts, net.addresses, net.namespaces
    user = _user()
    client_key = workdir / "id_ed25519"
    _keygen(client_key, f"{net.prefix} test client")
    authorized_keys = workdir / "authorized_keys"
    authorized_keys.write_text(client_key.with_suffix(".pub").read_text())
    known_hosts = workdir / "known_hosts"
    config = workdir / "config"

    known_lines: list[str] = []
    config_text = f"# ssh -F {_q(config)} node0: the test cluster {net.prefix} (generated).\n"
    penalties = _supports_per_source_penalties()
    for i, (host, address) in enumerate(zip(hosts, addresses, strict=True)):
        node_dir = workdir / host
        node_dir.mkdir(exist_ok=True)
        host_key = node_dir / "ssh_host_ed25519_key"
        _keygen(host_key, f"{host} host key")
        key_type, key_data = host_key.with_suffix(".pub").read_text().split()[:2]
        known_lines.append(f"{host},{address} {key_type} {key_data}\n")
        sshd_config = node_dir / "sshd_config"
        sshd_config.write_text(
            _sshd_config(
                host,
                ns=namespaces[i],
                address=address,
                node_dir=node_dir,
                authorized_keys=authorized_keys,
                penalties=penalties,
            )
        )
        config_text += _client_config(host, address, user, client_key, known_hosts)
        pid = _spawn_sshd(namespaces[i], host, sshd_config, node_dir / "sshd.log")
        net.first_kill[namespaces[i]] = pid
    known_hosts.write_text("".join(known_lines))
    config.write_text(config_text)

    for i in range(len(hosts)):
        pid = net.first_kill[namespaces[i]]
        _wait_for_sshd(addresses[i], pid, workdir / hosts[i] / "sshd.log")
    _check_node_to_node(namespaces[0], addresses[1:])
    return Cluster(
        prefix=net.prefix,
        hosts=hosts,
        addresses=addresses,
        namespaces=namespaces,
        bridge=net.bridge,
        bridge_address=net.bridge_address,
        user=user,
        workdir=workdir,
        config_path=config,
        known_hosts_path=known_hosts,
        client_key_path=client_key,
        sshd_pids=tuple(net.first_kill[ns] for ns in namespaces),
    )


def _sshd_config(
    host: str, *, ns: str, address: str, node_dir: Path, authorized_keys: Path, penalties: bool
) -> str:
    lines = [
        f"# {host} of the jupyter_dist test cluster, in network namespace {ns} (generated).",
        f"ListenAddress {address}",
        "Port 22",
        "AddressFamily inet",
        f"HostKey {_q(node_dir / 'ssh_host_ed25519_key')}",
        f"PidFile {_q(node_dir / 'sshd.pid')}",
        f"AuthorizedKeysFile {_q(authorized_keys)}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "AllowTcpForwarding yes",
        "AllowStreamLocalForwarding yes",
        "StreamLocalBindUnlink yes",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        # Tests open many connections and channels at once; the defaults (10) drop some.
        "MaxStartups 200",
        "MaxSessions 200",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
    ]
    if penalties:
        # OpenSSH >= 9.8 would otherwise lock the host out after refused host keys.
        lines.append("PerSourcePenalties no")
    return "\n".join(lines) + "\n"


def _client_config(host: str, address: str, user: str, key: Path, known_hosts: Path) -> str:
    return (
        f"Host {host}\n"
        f"    HostName {address}\n"
        "    Port 22\n"
        f"    User {user}\n"
        f"    IdentityFile {_q(key)}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {_q(known_hosts)}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    CheckHostIP no\n"
        "    UpdateHostKeys no\n"
        "    BatchMode yes\n"
        "    ConnectTimeout 10\n"
        "    LogLevel ERROR\n"
    )


def _spawn_sshd(ns: str, host: str, config: Path, log: Path) -> int:
    """Start a node's sshd, detached: its parent, a shell, exits at once.

    So sshd and all it starts are no descendants of this process (leak checks that walk
    this process's children see none of them), and a terminal's Ctrl-C does not reach it.
    ip and unshare exec, and the inner shell execs sshd: the pid printed is sshd's.
    """
    inner = 'hostname "$1" && exec "$2" -D -e -f "$3"'
    outer = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    argv = ["sh", "-c", outer, "sh", str(log), "ip", "netns", "exec", ns, "unshare", "--uts"]
    argv += ["sh", "-c", inner, "sh", host, str(SSHD), str(config)]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=True, start_new_session=True
    )
    return int(result.stdout)


def _wait_for_sshd(address: str, pid: int, log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc_state(pid) in ("", "Z"):
            raise RuntimeError(f"sshd on {address} exited:\n{_tail(log)}")
        try:
            with socket.create_connection((address, 22), timeout=2) as sock:
                sock.settimeout(5)
                if sock.recv(4) == b"SSH-":
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd on {address} not accepting after {timeout}s:\n{_tail(log)}")
        time.sleep(0.02)


def _check_node_to_node(ns: str, addresses: Sequence[str]) -> None:
    """Fail clearly when the host firewall drops traffic between bridge ports."""
    if not addresses:
        return
    code = (
        "import socket, sys\n"
        "for a in sys.argv[1:]:\n"
        "    with socket.create_connection((a, 22), timeout=5) as s:\n"
        "        s.settimeout(5)\n"
        "        assert s.recv(4) == b'SSH-', a\n"
    )
    argv = ["ip", "netns", "exec", ns, sys.executable, "-I", "-S", "-c", code, *addresses]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"node0 cannot reach the other nodes over bridge {ns.rsplit('-', 1)[0]}-br. With"
            f" net.bridge.bridge-nf-call-iptables={_read(_BRIDGE_NF) or '?'} bridged traffic"
            " passes the host firewall's FORWARD chain; allow it (iptables was"
            f" {'found' if shutil.which('iptables') else 'not found'}):\n{result.stderr}"
        )


@cache
def _supports_per_source_penalties() -> bool:
    """Whether this sshd knows PerSourcePenalties (OpenSSH >= 9.8): ask ``sshd -t``."""
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "key"
        _keygen(key, "probe")
        conf = Path(tmp) / "sshd_config"
        conf.write_text(f"HostKey {_q(key)}\nUsePAM no\nPerSourcePenalties no\n")
        argv = [str(SSHD), "-t", "-f", str(conf)]
        result = subprocess.run(argv, capture_output=True, check=False)
    return result.returncode == 0


def _keygen(path: Path, comment: str) -> None:
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
    _run(argv)


def _user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _password_field(user: str) -> str:
    for line in _read(Path("/etc/shadow")).splitlines():
        name, _, rest = line.partition(":")
        if name == user:
            return rest.split(":", 1)[0]
    return ""


# --- small helpers -------------------------------------------------------------------------


def _q(path: Path) -> str:
    """A path quoted for ssh_config / sshd_config (OpenSSH and asyncssh both unquote)."""
    return f'"{path}"'
