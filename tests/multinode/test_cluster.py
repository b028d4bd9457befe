"""The ssh cluster fixture is real: separate hosts, a real network, real host-key checks."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests import netns

from .cluster import Cluster, ssh_cluster
from .conftest import require_cluster_support


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    argv = ["ip", "link", "show", "dev", name]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def test_each_node_has_its_own_hostname(cluster: Cluster) -> None:
    for i, host in enumerate(cluster.hosts):
        result = cluster.ssh(i, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host == f"node{i}"


def test_sshd_is_no_descendant_of_the_test_process(cluster: Cluster) -> None:
    # Leak checks that walk this process's children must not see the nodes' processes.
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    assert all(cluster.sshd_alive(i) for i in range(len(cluster.hosts)))
    assert not ours & set(cluster.sshd_pids)


def test_traffic_crosses_namespaces(cluster: Cluster) -> None:
    # From inside node0's namespace, connect to node1 by address and by name; the local end
    # of the connection is node0's own address, so the packets crossed the bridge.
    code = textwrap.dedent(
        """
        import socket, sys
        for target in sys.argv[1:]:
            with socket.create_connection((target, 22), timeout=5) as s:
                s.settimeout(5)
                print(s.getsockname()[0], s.getpeername()[0], s.recv(8).decode())
        """
    )
    result = cluster.run(0, [sys.executable, "-c", code, cluster.addresses[1], "node1"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [f"{cluster.addresses[0]} {cluster.addresses[1]} SSH-2.0-"] * 2
    # node0 has no route anywhere but the test subnet.
    routes = cluster.run(0, ["ip", "-4", "route", "show"]).stdout
    assert "default" not in routes


def test_shared_python_environment_on_remote_node(cluster: Cluster) -> None:
    command = f"{sys.executable} -c 'import socket, torch; print(socket.gethostname())'"
    result = cluster.ssh(1, command, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "node1"


def test_unknown_host_key_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    only_node1 = tmp_path / "known_hosts"
    lines = cluster.known_hosts_path.read_text().splitlines(keepends=True)
    only_node1.write_text("".join(line for line in lines if not line.startswith("node0,")))
    argv = ["ssh", "-F", str(cluster.config_path), "-o", f"UserKnownHostsFile={only_node1}"]
    argv += ["-o", "StrictHostKeyChecking=yes"]
    refused = subprocess.run([*argv, "node0", "true"], capture_output=True, text=True, check=False)
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr
    accepted = subprocess.run([*argv, "node1", "true"], capture_output=True, text=True, check=False)
    assert accepted.returncode == 0, accepted.stderr


def test_kill_sshd_takes_the_node_down(cluster: Cluster, tmp_path: Path) -> None:
    # A cluster of its own, so the session one stays whole; it runs beside it.
    with ssh_cluster(2, workdir=tmp_path) as own:
        assert own.prefix != cluster.prefix
        assert not set(own.addresses) & set(cluster.addresses)
        session = subprocess.Popen(
            own.ssh_argv(1, "exec sleep 600"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not any(_comm(pid) == "sleep" for pid in own.pids(1)):
                assert session.poll() is None, "ssh session ended early"
                assert time.monotonic() < deadline, "sleep never started on node1"
                time.sleep(0.05)

            own.kill_sshd(1)

            assert own.pids(1) == []
            assert not own.sshd_alive(1)
            assert session.wait(timeout=30) == 255
            with pytest.raises(OSError):
                socket.create_connection((own.addresses[1], 22), timeout=5).close()
            assert own.ssh(0, "hostname").stdout.strip() == "node0"
        finally:
            session.kill()
            session.wait()
    assert not netns_names() & set(own.namespaces)
    assert not link_exists(own.bridge)
    assert cluster.ssh(1, "hostname").stdout.strip() == "node1"


def test_cleanup_stale_removes_a_crashed_run(tmp_path: Path) -> None:
    require_cluster_support()
    # A child process starts a cluster and dies by SIGKILL: no cleanup of its own runs. It
    # is killed while this test holds the networks' lock, and the lock is kept until the
    # cleanup is done: otherwise a network started meanwhile (by a test running beside this
    # one) would clean up the crashed run first.
    code = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        sys.path.insert(0, sys.argv[1])
        from tests.multinode.cluster import ssh_cluster
        with ssh_cluster(1, workdir=Path(sys.argv[2])) as c:
            print(c.prefix, c.namespaces[0], c.bridge, flush=True)
            sys.stdin.read()  # until killed
        """
    )
    root = str(Path(__file__).parents[2])
    child = subprocess.Popen(
        [sys.executable, "-c", code, root, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        started = child.stdout.readline()
        assert started, child.communicate(timeout=30)[1]
        prefix, ns, bridge = started.split()
        with netns._host_lock():
            child.kill()
            assert child.wait(timeout=30) == -9
            assert ns in netns_names()
            assert link_exists(bridge)

            assert prefix in netns._cleanup_stale_locked(prefix)

            assert ns not in netns_names()
            assert not link_exists(bridge)
    finally:
        child.kill()
        child.communicate(timeout=30)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
