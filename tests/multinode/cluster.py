"""Throwaway multi-node SSH clusters on one Linux machine, for the multi-node tests.

Each node is a network namespace holding one OpenSSH ``sshd``; a veth pair joins it to a
Linux bridge in the host namespace, so traffic between nodes, and between the test process
and a node, crosses a real (virtual) network. Every ``sshd`` also has its own UTS namespace,
so ``hostname`` says ``node0``, ``node1``, ..., and its own ``/etc/hosts`` naming every node.
The PID namespace and the filesystem stay shared: pids a node reports are the host's, and the
test process's own Python environment is there on every node.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2, util-linux, ``hostname`` and OpenSSH.
``.ci/setup-system`` installs the packages.

    with ssh_cluster(2, workdir=tmp_path) as cluster:
        subprocess.run(["ssh", "-F", str(cluster.config_path), "node1", "hostname"])
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path

__all__ = [
    "BASE_PREFIX",
    "Cluster",
    "cleanup_stale",
    "missing_requirements",
    "ssh_cluster",
]

#: Every cluster's names start with this plus a number: ``jdt417-br``, ``jdt417-n0``, ...
BASE_PREFIX = "jdt"
SSHD = Path("/usr/sbin/sshd")
SSHD_PRIVSEP_DIR = Path("/run/sshd")
NETNS_DIR = Path("/run/netns")
#: ``ip netns exec NS`` bind-mounts the files in ``/etc/netns/NS/`` over those in ``/etc/``.
ETC_NETNS = Path("/etc/netns")
#: Serialises allocation (names, subnet) and stale cleanup between concurrent runs.
LOCK_PATH = Path("/run/jupyter_dist-test-cluster.lock")
SUBNET_PREFIX = "10.213"
BRIDGE_HOST = 254
#: In the bridge's alias (with the owner's pid) and in iptables rule comments.
TAG = "jupyter_dist-test-cluster"

_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_NAME_RE = re.compile(rf"^({re.escape(BASE_PREFIX)}\d+)-(?:br|h\d+|n\d+)$")
_NODE_RE = re.compile(r"-n(\d+)$")
_OWNER_RE = re.compile(r"owner=(\d+):(\d+)")
_COMMENT_RE = re.compile(rf"--comment \"?{re.escape(TAG)}:({re.escape(BASE_PREFIX)}\d+)\"?")
_TOOLS = {
    "ip": "iproute2",
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
        return _netns_pids(self.namespaces[i])

    def kill_sshd(self, i: int) -> None:
        """SIGKILL node ``i``'s sshd and every process in its namespace (a node crash)."""
        _kill_netns(self.namespaces[i], first=self.sshd_pids[i])

    def sshd_alive(self, i: int) -> bool:
        return self.sshd_pids[i] in _netns_pids(self.namespaces[i])

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
    problems: list[str] = []
    if sys.platform != "linux":
        return [f"needs Linux network namespaces (this is {sys.platform})"]
    if os.geteuid() != 0:
        problems.append("must run as root (it creates network namespaces and a bridge)")
    else:
        caps = _effective_caps()
        for cap, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
            if not caps >> cap & 1:
                problems.append(f"root lacks {name} (an unprivileged container?)")
    for tool, package in _TOOLS.items():
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found on PATH (Debian package {package})")
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

    state = _State()
    try:
        with _host_lock():
            try:
                _cleanup_stale_locked(BASE_PREFIX)
            except RuntimeError as exc:  # it does not stop a new cluster with a new name
                warnings.warn(f"stale test cluster not fully removed: {exc}", stacklevel=3)
            subnet = _allocate(state)
        yield _start(state, n, subnet, workdir)
    finally:
        if state.prefix is not None:
            _teardown(state.prefix, state.sshd_pids)


def cleanup_stale(prefix: str = BASE_PREFIX) -> list[str]:
    """Remove what crashed runs left: namespaces, links, iptables rules, /etc/netns files.

    ``prefix`` is ``BASE_PREFIX`` (every cluster) or one cluster's prefix (``jdt417``). A
    cluster whose owner process still runs is left alone. Returns the prefixes removed.
    """
    with _host_lock():
        return _cleanup_stale_locked(prefix)


# --- setup ---------------------------------------------------------------------------------


@dataclass
class _State:
    prefix: str | None = None
    sshd_pids: dict[str, int] = field(default_factory=dict)


def _allocate(state: _State) -> str:
    """Pick an unused prefix and /24, create the bridge; call with the host lock held."""
    used = _present_groups()
    start = os.getpid() % 1000
    for j in range(1000):
        prefix = f"{BASE_PREFIX}{(start + j) % 1000}"
        if prefix not in used:
            break
    else:
        raise RuntimeError(f"every {BASE_PREFIX}<number> prefix is in use")
    taken = _used_networks()
    for j in range(256):
        x = (start + j) % 256
        net = ipaddress.ip_network(f"{SUBNET_PREFIX}.{x}.0/24")
        if not any(net.overlaps(other) for other in taken):
            break
    else:
        raise RuntimeError(f"no free {SUBNET_PREFIX}.<x>.0/24 subnet on this host")
    subnet = f"{SUBNET_PREFIX}.{x}"
    bridge = f"{prefix}-br"

    _ip("link", "add", "name", bridge, "type", "bridge")
    state.prefix = prefix  # only now: a name that existed is somebody else's
    owner = f"{TAG} owner={os.getpid()}:{_start_time(os.getpid())}"
    _ip("link", "set", "dev", bridge, "alias", owner)
    _no_ipv6(bridge)
    _ip("addr", "add", f"{subnet}.{BRIDGE_HOST}/24", "dev", bridge)
    _ip("link", "set", "dev", bridge, "up")
    _allow_bridged_forwarding(prefix, bridge)
    return subnet


def _start(state: _State, n: int, subnet: str, workdir: Path) -> Cluster:
    assert state.prefix is not None
    prefix = state.prefix
    bridge = f"{prefix}-br"
    hosts = tuple(f"node{i}" for i in range(n))
    addresses = tuple(f"{subnet}.{i + 1}" for i in range(n))
    namespaces = tuple(f"{prefix}-n{i}" for i in range(n))
    user = _user()

    hosts_file = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    hosts_file += "".join(f"{a}\t{h}\n" for h, a in zip(hosts, addresses, strict=True))
    for i, ns in enumerate(namespaces):
        host_if = f"{prefix}-h{i}"
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _no_ipv6(host_if)
        _ip("link", "set", "dev", host_if, "master", bridge, "up")
        _no_ipv6("eth0", ns)
        _ip("-n", ns, "addr", "add", f"{addresses[i]}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "dev", "eth0", "up")
        _ip("-n", ns, "link", "set", "dev", "lo", "up")
        etc = ETC_NETNS / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)

    client_key = workdir / "id_ed25519"
    _keygen(client_key, f"{prefix} test client")
    authorized_keys = workdir / "authorized_keys"
    authorized_keys.write_text(client_key.with_suffix(".pub").read_text())
    known_hosts = workdir / "known_hosts"
    config = workdir / "config"

    known_lines: list[str] = []
    config_text = f"# ssh -F {_q(config)} node0: the test cluster {prefix} (generated).\n"
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
        state.sshd_pids[namespaces[i]] = pid
    known_hosts.write_text("".join(known_lines))
    config.write_text(config_text)

    for i in range(n):
        pid = state.sshd_pids[namespaces[i]]
        _wait_for_sshd(addresses[i], pid, workdir / hosts[i] / "sshd.log")
    _check_node_to_node(namespaces[0], addresses[1:])
    return Cluster(
        prefix=prefix,
        hosts=hosts,
        addresses=addresses,
        namespaces=namespaces,
        bridge=bridge,
        bridge_address=f"{subnet}.{BRIDGE_HOST}",
        user=user,
        workdir=workdir,
        config_path=config,
        known_hosts_path=known_hosts,
        client_key_path=client_key,
        sshd_pids=tuple(state.sshd_pids[ns] for ns in namespaces),
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
        if _proc_state(pid) in ("", "Z"):
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


def _allow_bridged_forwarding(prefix: str, bridge: str) -> None:
    """With br_netfilter active, bridged frames traverse iptables FORWARD: accept ours."""
    if _read(_BRIDGE_NF) != "1" or shutil.which("iptables") is None:
        return
    rule = _forward_rule(prefix, bridge)
    subprocess.run(["iptables", "-w", "-I", *rule], capture_output=True, check=False)


def _forward_rule(prefix: str, bridge: str) -> list[str]:
    comment = ["-m", "comment", "--comment", f"{TAG}:{prefix}"]
    return ["FORWARD", "-i", bridge, "-o", bridge, *comment, "-j", "ACCEPT"]


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


def _no_ipv6(ifname: str, ns: str | None = None) -> None:
    """No IPv6 link-local addresses, so nothing but the test subnet's IPv4 is sent."""
    if Path("/proc/sys/net/ipv6").is_dir():
        _ip(*(["-n", ns] if ns else []), "link", "set", "dev", ifname, "addrgenmode", "none")


# --- teardown ------------------------------------------------------------------------------


def _teardown(prefix: str, sshd_pids: Mapping[str, int] | None = None) -> None:
    """Remove everything named ``prefix-*``; keeps going through errors and Ctrl-C."""
    sshd_pids = sshd_pids or {}
    names = {*_group_netns(prefix), *(p.name for p in _group_etc_netns(prefix)), *sshd_pids}
    by_ns = sorted((ns for ns in names if _NODE_RE.search(ns)), key=_node_key)
    steps: list[tuple[str, Callable[[], None]]] = []
    for ns in by_ns:
        steps.append((f"kill processes in {ns}", partial(_kill_netns, ns, sshd_pids.get(ns))))
    # Deleting a veth end deletes its peer at once; a namespace's own links go later.
    for link in _group_links(prefix):
        if not link.endswith("-br"):
            steps.append((f"delete {link}", partial(_ip_quiet, "link", "del", link)))
    for ns in by_ns:
        steps.append((f"delete netns {ns}", partial(_ip_quiet, "netns", "del", ns)))
    for etc in _group_etc_netns(prefix):
        steps.append((f"remove {etc}", partial(shutil.rmtree, etc, ignore_errors=True)))
    steps.append((f"remove empty {ETC_NETNS}", _rmdir_etc_netns))
    steps.append((f"remove iptables rules of {prefix}", partial(_delete_iptables_rules, prefix)))
    steps.append((f"delete {prefix}-br", partial(_ip_quiet, "link", "del", f"{prefix}-br")))

    problems: list[str] = []
    interrupt: BaseException | None = None
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            problems.append(f"{name}: {exc}")
        except BaseException as exc:  # KeyboardInterrupt: finish cleaning up first
            interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt
    left = _group_leftovers(prefix)
    if problems or left:
        raise RuntimeError(f"cleanup of test cluster {prefix} failed: {problems}; left: {left}")


def _kill_netns(ns: str, first: int | None = None, timeout: float = 15) -> None:
    """SIGKILL every process in network namespace ``ns``, ``first`` (the sshd) first.

    Like ``ip netns pids NS | xargs kill -9``, repeated until none is left (a dying parent
    may just have forked).
    """
    deadline = time.monotonic() + timeout
    if first is not None:
        _kill_in(first, ns)  # the listener: no new connection forks after this
    while pids := _netns_pids(ns):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {ns} survive SIGKILL")
        for pid in pids:
            _kill_in(pid, ns)
        time.sleep(0.005)


def _kill_in(pid: int, ns: str) -> None:
    """SIGKILL ``pid`` if it is (still) in ``ns``; a pidfd makes pid reuse harmless."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # kernel without pidfds
        if _ns_id(pid) == _netns_id(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        if _ns_id(pid) == _netns_id(ns):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def _delete_iptables_rules(prefix: str) -> None:
    for rule in _iptables_rules():
        match = _COMMENT_RE.search(rule)
        if match and match.group(1) == prefix:
            argv = shlex.split(rule)
            if argv[:1] == ["-A"]:
                delete = ["iptables", "-w", "-D", *argv[1:]]
                subprocess.run(delete, capture_output=True, check=False)


def _iptables_rules() -> list[str]:
    if shutil.which("iptables") is None:
        return []
    argv = ["iptables", "-w", "-S", "FORWARD"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    return [line for line in result.stdout.splitlines() if TAG in line]


def _rmdir_etc_netns() -> None:
    with contextlib.suppress(OSError):
        ETC_NETNS.rmdir()  # only when empty, i.e. nobody else uses it


def _cleanup_stale_locked(prefix: str) -> list[str]:
    removed = []
    for group in sorted(_present_groups()):
        if not _matches(group, prefix) or _owner_alive(group):
            continue
        _teardown(group)
        removed.append(group)
    return removed


def _matches(group: str, prefix: str) -> bool:
    if prefix[-1:].isdigit():
        return group == prefix
    return re.fullmatch(re.escape(prefix) + r"\d+", group) is not None


def _owner_alive(prefix: str) -> bool:
    """Whether the process that created ``prefix``'s bridge still runs."""
    match = _OWNER_RE.search(_links().get(f"{prefix}-br", ""))
    if match is None:
        return False
    pid, start = int(match.group(1)), match.group(2)
    return _start_time(pid) == start


# --- inspection ----------------------------------------------------------------------------


def _present_groups() -> set[str]:
    names = [*_links(), *_all_netns()]
    if ETC_NETNS.is_dir():
        names += [p.name for p in ETC_NETNS.iterdir()]
    groups = {m.group(1) for name in names if (m := _NAME_RE.match(name))}
    groups |= {m.group(1) for rule in _iptables_rules() if (m := _COMMENT_RE.search(rule))}
    return groups


def _group_leftovers(prefix: str) -> list[str]:
    left = _group_netns(prefix) + _group_links(prefix)
    left += [str(p) for p in _group_etc_netns(prefix)]
    left += [rule for rule in _iptables_rules() if f"{TAG}:{prefix}" in rule]
    return left


def _in_group(name: str, prefix: str) -> bool:
    match = _NAME_RE.match(name)
    return match is not None and match.group(1) == prefix


def _group_netns(prefix: str) -> list[str]:
    return [ns for ns in _all_netns() if _in_group(ns, prefix)]


def _group_links(prefix: str) -> list[str]:
    return [name for name in _links() if _in_group(name, prefix)]


def _group_etc_netns(prefix: str) -> list[Path]:
    if not ETC_NETNS.is_dir():
        return []
    return [p for p in ETC_NETNS.iterdir() if _in_group(p.name, prefix)]


def _node_key(ns: str) -> int:
    match = _NODE_RE.search(ns)
    return int(match.group(1)) if match else -1


def _all_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _links() -> dict[str, str]:
    """Host network interfaces: name -> alias."""
    out = _run(["ip", "-j", "link", "show"]).stdout
    return {link["ifname"]: link.get("ifalias", "") for link in json.loads(out or "[]")}


def _used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for link in json.loads(_run(["ip", "-4", "-j", "addr", "show"]).stdout or "[]"):
        for info in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_run(["ip", "-4", "-j", "route", "show"]).stdout or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            net = ipaddress.ip_network(dst, strict=False)
            if net.prefixlen >= 16:  # a broad route (10.0.0.0/8) may be shadowed, not a /24
                nets.append(net)
    return nets


def _netns_id(ns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(NETNS_DIR / ns)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _ns_id(pid: int) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _netns_pids(ns: str) -> list[int]:
    """Like ``ip netns pids NS``: live processes whose network namespace is ``ns``."""
    target = _netns_id(ns)
    if target is None:
        return []
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit() and int(name) != os.getpid() and _ns_id(int(name)) == target
    ]


def _proc_state(pid: int) -> str:
    """``R``, ``S``, ``Z``, ... from /proc/PID/stat; '' if there is no such process."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return stat[stat.rfind(")") + 2 :][:1]


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (with the pid, unique); '' if gone."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def _effective_caps() -> int:
    for line in _read(Path("/proc/self/status")).splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _password_field(user: str) -> str:
    for line in _read(Path("/etc/shadow")).splitlines():
        name, _, rest = line.partition(":")
        if name == user:
            return rest.split(":", 1)[0]
    return ""


# --- small helpers -------------------------------------------------------------------------


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    with LOCK_PATH.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"`{shlex.join(argv)}` failed ({result.returncode}): {result.stderr}")
    return result


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _ip_quiet(*args: str) -> None:
    """``ip`` for teardown: a thing that is already gone is fine."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=False)
    gone = ("Cannot find device", "No such file", "does not exist")
    if result.returncode != 0 and not any(g in result.stderr for g in gone):
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(_read(log).splitlines()[-lines:])


def _q(path: Path) -> str:
    """A path quoted for ssh_config / sshd_config (OpenSSH and asyncssh both unquote)."""
    return f'"{path}"'
