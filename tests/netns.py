"""Private networks of network namespaces on one Linux machine, for the multi-node tests.

Each node is a network namespace; a veth pair joins it to a Linux bridge in the host
namespace, so traffic between nodes, and between the test process and a node, crosses a
real (virtual) network. ``ip netns exec NS`` also gives a node its own ``/etc/hosts``
naming every node. The PID namespace and the filesystem stay shared: pids are the host's,
and the test process's own Python environment is there on every node. What runs in the
nodes (sshd in ``tests/multinode``, Ray in ``tests/ray``) is the caller's; teardown kills
every process in each namespace, then removes namespaces, links and firewall rules.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2.

    with namespace_network(["node0", "node1"]) as net:
        subprocess.run(["ip", "netns", "exec", net.namespaces[0], "ping", net.addresses[1]])
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

__all__ = [
    "BASE_PREFIX",
    "Network",
    "add_node",
    "cleanup_stale",
    "kill_netns",
    "missing_requirements",
    "namespace_network",
    "netns_pids",
    "proc_state",
    "read_text",
    "remove_node",
    "run_checked",
    "tail",
]

#: Every network's names start with this plus a number: ``jdt417-br``, ``jdt417-n0``, ...
BASE_PREFIX = "jdt"
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
_TOOLS = {"ip": "iproute2"}
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


@dataclass(frozen=True)
class Network:
    """Node ``i`` is ``hosts[i]`` at ``addresses[i]`` in network namespace ``namespaces[i]``.

    ``bridge_address`` is the host's own address on the network. ``first_kill`` maps a
    namespace to the pid teardown kills before the rest of it (a listener, so that no new
    connection forks while the namespace is emptied); callers add to it as they start them.
    """

    prefix: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    namespaces: tuple[str, ...]
    bridge: str
    bridge_address: str
    first_kill: dict[str, int] = field(default_factory=dict, compare=False)

    def pids(self, i: int) -> list[int]:
        """Host-side pids of every live process in node ``i``'s network namespace."""
        return netns_pids(self.namespaces[i])

    def exec_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run in node ``i``'s network namespace (and with its ``/etc/hosts``)."""
        return ["ip", "netns", "exec", self.namespaces[i], *argv]


def missing_requirements(tools: Mapping[str, str] | None = None) -> list[str]:
    """What this machine lacks to make a network (and have ``tools``: command -> package)."""
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
    for tool, package in {**_TOOLS, **(tools or {})}.items():
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found on PATH (Debian package {package})")
    if shutil.which("ip") is not None and os.geteuid() == 0:
        probe = subprocess.run(["ip", "netns", "list"], capture_output=True, check=False)
        if probe.returncode != 0:
            problems.append("`ip netns` does not work here: " + probe.stderr.decode().strip())
    return problems


@contextlib.contextmanager
def namespace_network(hosts: Sequence[str]) -> Iterator[Network]:
    """One namespace per host on a fresh bridge and /24; remove every trace of it on exit.

    Leftovers of earlier runs that crashed (their owner process is gone) are removed first.
    """
    problems = missing_requirements()
    if problems:
        raise RuntimeError("cannot make a test network: " + "; ".join(problems))
    if not 1 <= len(hosts) <= 200:
        raise ValueError(f"between 1 and 200 hosts, not {len(hosts)}: {list(hosts)}")
    state = _State()
    try:
        with _host_lock():
            try:
                _cleanup_stale_locked(BASE_PREFIX)
            except RuntimeError as exc:  # it does not stop a new network with a new name
                warnings.warn(f"stale test network not fully removed: {exc}", stacklevel=3)
            subnet = _allocate(state)
        assert state.prefix is not None
        yield _add_nodes(state.prefix, subnet, tuple(hosts), state.first_kill)
    finally:
        if state.prefix is not None:
            _teardown(state.prefix, state.first_kill)


def cleanup_stale(prefix: str = BASE_PREFIX) -> list[str]:
    """Remove what crashed runs left: namespaces, links, iptables rules, /etc/netns files.

    ``prefix`` is ``BASE_PREFIX`` (every network) or one network's prefix (``jdt417``). A
    network whose owner process still runs is left alone. Returns the prefixes removed.
    """
    with _host_lock():
        return _cleanup_stale_locked(prefix)


# --- setup ---------------------------------------------------------------------------------


@dataclass
class _State:
    prefix: str | None = None
    first_kill: dict[str, int] = field(default_factory=dict)


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


def _add_nodes(
    prefix: str, subnet: str, hosts: tuple[str, ...], first_kill: dict[str, int]
) -> Network:
    bridge = f"{prefix}-br"
    addresses = tuple(f"{subnet}.{i + 1}" for i in range(len(hosts)))
    namespaces = tuple(f"{prefix}-n{i}" for i in range(len(hosts)))
    hosts_file = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    hosts_file += "".join(f"{a}\t{h}\n" for h, a in zip(hosts, addresses, strict=True))
    for i in range(len(hosts)):
        _add_namespace(prefix, i, addresses[i], hosts_file)
    return Network(
        prefix=prefix,
        hosts=hosts,
        addresses=addresses,
        namespaces=namespaces,
        bridge=bridge,
        bridge_address=f"{subnet}.{BRIDGE_HOST}",
        first_kill=first_kill,
    )


def _add_namespace(prefix: str, i: int, address: str, hosts_file: str) -> str:
    """Node ``i``'s namespace ``PREFIX-nI`` at ``address``, joined to the bridge."""
    ns, host_if = f"{prefix}-n{i}", f"{prefix}-h{i}"
    _ip("netns", "add", ns)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _no_ipv6(host_if)
    _ip("link", "set", "dev", host_if, "master", f"{prefix}-br", "up")
    _no_ipv6("eth0", ns)
    _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    _ip("-n", ns, "link", "set", "dev", "eth0", "up")
    _ip("-n", ns, "link", "set", "dev", "lo", "up")
    etc = ETC_NETNS / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(hosts_file)
    return ns


def add_node(prefix: str, bridge_address: str, i: int, host: str) -> tuple[str, str]:
    """Node ``i`` (past the network's first nodes) added to network ``prefix`` while it
    runs, as a machine a cloud starts: its namespace and address (``.i+1`` of the
    network's /24). The network's teardown removes it with the rest; `remove_node` before.
    Other nodes' ``/etc/hosts`` do not name it."""
    address = f"{bridge_address.rsplit('.', 1)[0]}.{i + 1}"
    hosts_file = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    hosts_file += f"{address}\t{host}\n"
    with _host_lock():
        return _add_namespace(prefix, i, address, hosts_file), address


def remove_node(prefix: str, i: int) -> None:
    """Node ``i`` of network ``prefix`` gone: its processes killed, its link, namespace and
    ``/etc/netns`` folder removed (what is gone already is fine)."""
    ns = f"{prefix}-n{i}"
    kill_netns(ns)
    _ip_quiet("link", "del", f"{prefix}-h{i}")
    _ip_quiet("netns", "del", ns)
    shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)


def _allow_bridged_forwarding(prefix: str, bridge: str) -> None:
    """With br_netfilter active, bridged frames traverse iptables FORWARD: accept ours."""
    if read_text(_BRIDGE_NF) != "1" or shutil.which("iptables") is None:
        return
    rule = _forward_rule(prefix, bridge)
    subprocess.run(["iptables", "-w", "-I", *rule], capture_output=True, check=False)


def _forward_rule(prefix: str, bridge: str) -> list[str]:
    comment = ["-m", "comment", "--comment", f"{TAG}:{prefix}"]
    return ["FORWARD", "-i", bridge, "-o", bridge, *comment, "-j", "ACCEPT"]


def _no_ipv6(ifname: str, ns: str | None = None) -> None:
    """No IPv6 link-local addresses, so nothing but the test subnet's IPv4 is sent."""
    if Path("/proc/sys/net/ipv6").is_dir():
        _ip(*(["-n", ns] if ns else []), "link", "set", "dev", ifname, "addrgenmode", "none")


# --- teardown ------------------------------------------------------------------------------


def _teardown(prefix: str, first_kill: Mapping[str, int] | None = None) -> None:
    """Remove everything named ``prefix-*``; keeps going through errors and Ctrl-C."""
    first_kill = first_kill or {}
    names = {*_group_netns(prefix), *(p.name for p in _group_etc_netns(prefix)), *first_kill}
    by_ns = sorted((ns for ns in names if _NODE_RE.search(ns)), key=_node_key)
    steps: list[tuple[str, Callable[[], None]]] = []
    for ns in by_ns:
        steps.append((f"kill processes in {ns}", partial(kill_netns, ns, first_kill.get(ns))))
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
        raise RuntimeError(f"cleanup of test network {prefix} failed: {problems}; left: {left}")


def kill_netns(ns: str, first: int | None = None, timeout: float = 15) -> None:
    """SIGKILL every process in network namespace ``ns``, ``first`` (a listener) first.

    Like ``ip netns pids NS | xargs kill -9``, repeated until none is left (a dying parent
    may just have forked).
    """
    deadline = time.monotonic() + timeout
    if first is not None:
        _kill_in(first, ns)  # the listener: no new connection forks after this
    while pids := netns_pids(ns):
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
    out = run_checked(["ip", "-j", "link", "show"]).stdout
    return {link["ifname"]: link.get("ifalias", "") for link in json.loads(out or "[]")}


def _used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for link in json.loads(run_checked(["ip", "-4", "-j", "addr", "show"]).stdout or "[]"):
        for info in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(run_checked(["ip", "-4", "-j", "route", "show"]).stdout or "[]"):
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


def netns_pids(ns: str) -> list[int]:
    """Like ``ip netns pids NS``: live processes whose network namespace is ``ns``."""
    target = _netns_id(ns)
    if target is None:
        return []
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit() and int(name) != os.getpid() and _ns_id(int(name)) == target
    ]


def proc_state(pid: int) -> str:
    """``R``, ``S``, ``Z``, ... from /proc/PID/stat; '' if there is no such process."""
    stat = read_text(Path(f"/proc/{pid}/stat"))
    return stat[stat.rfind(")") + 2 :][:1]


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (with the pid, unique); '' if gone."""
    stat = read_text(Path(f"/proc/{pid}/stat"))
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def _effective_caps() -> int:
    for line in read_text(Path("/proc/self/status")).splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    with LOCK_PATH.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_checked(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
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
    run_checked(["ip", *args])


def _ip_quiet(*args: str) -> None:
    """``ip`` for teardown: a thing that is already gone is fine."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=False)
    gone = ("Cannot find device", "No such file", "does not exist")
    if result.returncode != 0 and not any(g in result.stderr for g in gone):
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


def read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(read_text(log).splitlines()[-lines:])
