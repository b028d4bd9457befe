"""What the SSH launcher trusts, whatever the user's ssh config says: host keys are always
checked (jump hosts too), and the SSH agent is never forwarded to a node."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.errors import AgentError
from tests.conftest import CellOutput

from .test_ssh_sessions import agents_on, flags, netns_pids

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]


def config_with(cluster: Any, path: Path, first: str) -> Path:
    """The cluster's ssh config with ``first`` before it: its values win (first one wins)."""
    path.write_text(first + Path(cluster.config_path).read_text())
    return path


def refused(run: Run, cluster: Any, session: str, config: Path, hosts: str = "") -> str:
    """Start ``session`` with ``config``; it must fail, leaving no agent on any node."""
    where = f"--hosts {hosts} --ssh-config {config}" if hosts else flags(cluster, config)
    out = run(f"%%distributed --session {session} {where} --procs 1\nx = 1")
    try:
        assert isinstance(out.error, AgentError), (out.stdout, out.stderr, out.error)
    finally:
        run(f"%dist shutdown --session {session}")  # a session that did start (the bug)
    assert agents_on(cluster, 0) == [] and agents_on(cluster, 1) == []
    return str(out.error)


@pytest.mark.parametrize(
    "setting",
    ["UserKnownHostsFile none", "UserKnownHostsFile /dev/null", "UserKnownHostsFile {missing}"],
)
def test_no_known_hosts_file_means_no_connection(
    run: Run, cluster: Any, tmp_path: Path, setting: str
) -> None:
    """``none`` made asyncssh skip the check; a missing file failed with a bare OSError."""
    line = setting.format(missing=tmp_path / "no-such-file")
    config = config_with(cluster, tmp_path / "config", f"Host *\n    {line}\n")
    message = refused(run, cluster, "nokeys", config)
    assert "SSH host key cannot be checked" in message, message
    assert "ssh-keyscan" in message
    assert "2 of 2 nodes failed to start" in message


def test_strict_host_key_checking_no_does_not_accept_an_unknown_key(
    run: Run, cluster: Any, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = config_with(
        cluster,
        tmp_path / "config",
        f"Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile {empty}\n",
    )
    message = refused(run, cluster, "nostrict", config)
    assert "host key is unknown or has changed" in message
    assert empty.read_text() == ""  # nothing was learnt either


def test_a_jump_hosts_key_is_checked_too(run: Run, cluster: Any, tmp_path: Path) -> None:
    """node1 through node0: node0's config says not to check its key; that is refused."""
    config = config_with(
        cluster,
        tmp_path / "config",
        f"Host {cluster.hosts[1]}\n    ProxyJump {cluster.hosts[0]}\n"
        f"Host {cluster.hosts[0]}\n    UserKnownHostsFile none\n",
    )
    message = refused(run, cluster, "jump", config, hosts=cluster.hosts[1])
    assert f"jump host {cluster.hosts[0]!r}" in message, message
    assert "SSH host key cannot be checked" in message


def test_a_jump_host_with_a_known_key_works(run: Run, cluster: Any, tmp_path: Path) -> None:
    """And its connection ends with the session's (nothing is left on the jump host)."""
    config = config_with(
        cluster, tmp_path / "config", f"Host {cluster.hosts[1]}\n    ProxyJump {cluster.hosts[0]}\n"
    )
    before = netns_pids(cluster, 0)
    out = run(
        f"%%distributed --session jumped --hosts {cluster.hosts[1]} --ssh-config {config} "
        "--procs 1\nimport socket\nprint(socket.gethostname())"
    )
    try:
        assert out.ok, (out.stdout, out.stderr, out.error)
        assert f"[rank 0] {cluster.hosts[1]}" in out.stdout
        assert netns_pids(cluster, 0) - before, "no SSH connection to the jump host"
    finally:
        run("%dist shutdown --session jumped")
    deadline = time.monotonic() + 10
    while netns_pids(cluster, 0) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not netns_pids(cluster, 0) - before, "the jump host's connection was left open"


@pytest.fixture
def ssh_agent(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An ssh-agent holding the cluster's client key; SSH_AUTH_SOCK points at it."""
    folder = tempfile.mkdtemp(prefix="jd-agent-")  # short: a Unix socket path
    sock = os.path.join(folder, "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL)
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": sock}
        for _ in range(100):
            added = subprocess.run(
                ["ssh-add", str(cluster.client_key_path)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if added.returncode == 0:
                break
            time.sleep(0.05)
        assert added.returncode == 0, added.stderr
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        yield sock
    finally:
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(timeout=10)
        subprocess.run(["rm", "-rf", folder], check=False)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def test_forward_agent_in_the_config_is_not_obeyed(
    run: Run, cluster: Any, tmp_path: Path, ssh_agent: str
) -> None:
    config = config_with(cluster, tmp_path / "config", "Host *\n    ForwardAgent yes\n")
    out = run(
        f"%%distributed --session noagent {flags(cluster, config)} --procs 1\n"
        "import os\nprint('agent socket:', os.environ.get('SSH_AUTH_SOCK'))"
    )
    try:
        assert out.ok, (out.stdout, out.stderr, out.error)
        assert "[ranks 0-1] agent socket: None" in out.stdout, out.stdout
        for node in (0, 1):
            agents = agents_on(cluster, node)
            assert agents
            for pid in agents:
                assert "SSH_AUTH_SOCK" not in environ_of(pid), (
                    pid,
                    Path(f"/proc/{pid}/cmdline").read_bytes(),
                    environ_of(pid).get("JUPYTER_DIST_SESSION"),
                )
    finally:
        run("%dist shutdown --session noagent")
