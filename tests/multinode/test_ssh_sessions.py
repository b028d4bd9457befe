"""Sessions over SSH on two real sshd nodes (network namespaces): the magic end to end."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist._version import __version__
from jupyter_dist.common.proc_titles import is_ours
from jupyter_dist.errors import AgentError, RanksFailed
from tests.conftest import CellOutput, session_status

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]


def flags(cluster: Any, config: Path | None = None) -> str:
    return f"--hosts {','.join(cluster.hosts)} --ssh-config {config or cluster.config_path}"


@pytest.fixture
def two_nodes(run: Run, cluster: Any) -> Iterator[str]:
    out = run(f"%%distributed --session mn {flags(cluster)} --procs 2\nimport os, socket, time")
    assert out.ok, out.stdout + out.stderr
    yield "mn"
    run("%dist shutdown --session mn")


def test_all_reduce_across_two_nodes(run: Run, two_nodes: str) -> None:
    out = run(
        f"%%distributed --session {two_nodes}\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print(socket.gethostname(), os.environ['NODE_RANK'], os.environ['LOCAL_RANK'], t.item())"
    )
    assert out.ok, out.stdout
    assert "[rank 0] node0 0 0 10.0" in out.stdout
    assert "[rank 1] node0 0 1 10.0" in out.stdout
    assert "[rank 2] node1 1 0 10.0" in out.stdout
    assert "[rank 3] node1 1 1 10.0" in out.stdout


def test_rendezvous_env_points_across_the_network(run: Run, two_nodes: str, cluster: Any) -> None:
    out = run(
        f"%%distributed --session {two_nodes}\n"
        "print(os.environ['MASTER_ADDR'], os.environ['GLOO_SOCKET_IFNAME'], "
        "os.environ['WORLD_SIZE'], os.environ['LOCAL_WORLD_SIZE'], os.environ['GROUP_WORLD_SIZE'])"
    )
    master = cluster.addresses[0]
    lines = re.findall(r"\] (\S+) (\S+) 4 2 2", out.stdout)
    assert lines, out.stdout
    assert {m for m, _ in lines} == {master}
    assert "lo" not in {ifname for _, ifname in lines}


def test_state_lives_across_cells_on_every_node(run: Run, two_nodes: str) -> None:
    assert run(f"%%distributed --session {two_nodes}\nwhere = socket.gethostname()").ok
    out = run(f"%%distributed --session {two_nodes}\nprint(where)")
    assert "[ranks 0-1] node0" in out.stdout
    assert "[ranks 2-3] node1" in out.stdout


def test_each_node_is_reached_through_its_relay_over_two_forwarded_sockets(
    run: Run, two_nodes: str
) -> None:
    from jupyter_dist.notebook.owners import embedded_owner

    session = embedded_owner().manager.get(two_nodes)
    fan_in, shells = session._iopub, list(session._shells.values())
    assert fan_in is not None
    endpoints = fan_in.endpoints
    assert len(endpoints) == 2 and len(shells) == 2, endpoints  # one a node, not one a rank
    for url in [*endpoints, *(s.url for s in shells)]:
        assert re.search(r"/jd-ssh-[^/]+/relay-[01]$", url), url
    batched, sent = fan_in.batched, [s.sent for s in shells]
    out = run(f"%%distributed --session {two_nodes}\nprint('from', socket.gethostname())")
    assert out.ok, out.stdout
    assert "[ranks 0-1] from node0" in out.stdout and "[ranks 2-3] from node1" in out.stdout
    assert fan_in.batched >= batched + 4 * 2  # output and reply of each rank
    assert [s.sent for s in shells] == [n + 1 for n in sent]  # the cell, once a node


def test_push_and_pull_through_the_tunnels(shell: Any, two_nodes: str) -> None:
    shell.user_ns["offset"] = 100
    shell.run_line_magic("dist", f"push offset --session {two_nodes}")
    shell.run_cell(
        f"%%distributed --session {two_nodes}\nimport os\nv = offset + int(os.environ['RANK'])"
    )
    assert shell.run_line_magic("dist", f"pull v --session {two_nodes}") == [100, 101, 102, 103]


def netns_pids(cluster: Any, node: int) -> set[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", cluster.namespaces[node]],
        check=True,
        capture_output=True,
        text=True,
    )
    return {int(p) for p in out.stdout.split()}


def test_dropped_ssh_connection_fails_the_cell_and_leaves_no_orphans(
    run: Run, two_nodes: str, cluster: Any
) -> None:
    status = session_status(two_nodes)
    node1_ranks = {r["pid"] for r in status["ranks"] if r["node_rank"] == 1}
    assert node1_ranks <= netns_pids(cluster, 1)
    # kill the per-connection sshd processes on node1: the SSH connection drops, the agent
    # there sees its stdin close
    killer = (
        "import os, signal\n"
        f"for pid in {sorted(netns_pids(cluster, 1))}:\n"
        "    try:\n"
        "        cmd = open(f'/proc/{pid}/cmdline').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if cmd.startswith('sshd') and '@' in cmd:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
    )
    began = time.monotonic()
    out = run(
        f"%%distributed --session {two_nodes}\n"
        f"if os.environ['RANK'] == '0':\n    exec({killer!r})\n"
        "time.sleep(60 if os.environ['NODE_RANK'] == '1' else 1)"
    )
    assert time.monotonic() - began < 25
    assert isinstance(out.error, RanksFailed)
    assert {2, 3} <= set(out.error.failed_ranks)
    assert "node1" in out.stdout
    deadline = time.monotonic() + 10
    while node1_ranks & netns_pids(cluster, 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not node1_ranks & netns_pids(cluster, 1), "ranks left running on node1"


def test_unknown_host_key_is_refused(run: Run, cluster: Any, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = tmp_path / "config"
    config.write_text(
        re.sub(
            r"UserKnownHostsFile \S+",
            f"UserKnownHostsFile {empty}",
            Path(cluster.config_path).read_text(),
        )
    )
    out = run(f"%%distributed --session badkey {flags(cluster, config)} --procs 1\nx = 1")
    assert isinstance(out.error, AgentError)
    message = str(out.error)
    assert "host key is unknown or has changed" in message
    assert "ssh-keyscan" in message


def test_skypilot_cluster_is_detected(
    run: Run, cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = Path(cluster.config_path).read_text()
    for host, address in zip(cluster.hosts, cluster.addresses, strict=True):
        config = config.replace(f"Host {host}\n", f"Host {host} {address}\n")
    path = tmp_path / "config"
    path.write_text(config)
    monkeypatch.setenv("SKYPILOT_NODE_IPS", "\n".join(cluster.addresses))
    monkeypatch.setenv("SKYPILOT_NUM_GPUS_PER_NODE", "0")
    out = run(
        f"%%distributed --session sky --procs 1 --ssh-config {path}\n"
        "import socket\nprint(socket.gethostname())"
    )
    try:
        assert out.ok, out.stdout + out.stderr
        assert "using the SkyPilot cluster: 2 nodes" in out.stdout
        assert "[rank 0] node0" in out.stdout
        assert "[rank 1] node1" in out.stdout
    finally:
        run("%dist shutdown --session sky")


def test_node_without_jupyter_dist_is_named(run: Run, cluster: Any, tmp_path: Path) -> None:
    bare = tmp_path / "bin" / "python"
    bare.parent.mkdir()
    bare.write_text('#!/bin/sh\nexec env -u PYTHONPATH python3 -I "$@"\n')
    bare.chmod(0o755)
    out = run(f"%%distributed --session bare {flags(cluster)} --procs 1 --python {bare}\nx = 1")
    assert isinstance(out.error, AgentError)
    assert "No module named 'jupyter_dist'" in str(out.error)
    assert f"install jupyter_dist=={__version__} in that node's Python, or pass --python" in str(
        out.error
    )


def test_node_with_an_older_jupyter_dist_is_told_the_version(
    run: Run, cluster: Any, tmp_path: Path
) -> None:
    """A node whose jupyter_dist predates ``python -m jupyter_dist.node`` (it had
    ``jupyter_dist.agent``) is told which version to install, not just "No module named"."""
    old = tmp_path / "old" / "jupyter_dist"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (old / "agent.py").write_text("raise SystemExit('the old agent must not run')\n")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    # no site-packages, no PYTHONPATH: the only jupyter_dist is the old one in the cwd
    python.write_text(f'#!/bin/sh\ncd {old.parent} && exec python3 -S -E "$@"\n')
    python.chmod(0o755)
    out = run(f"%%distributed --session old {flags(cluster)} --procs 1 --python {python}\nx = 1")
    assert isinstance(out.error, AgentError), out.stdout + out.stderr
    message = str(out.error)
    assert "No module named jupyter_dist.node" in message
    assert f"older than this notebook's {__version__}" in message
    assert f"install jupyter_dist=={__version__} there" in message
    assert "the old agent must not run" not in message


def test_progress_is_shown_per_node(run: Run, cluster: Any) -> None:
    out = run(f"%%distributed --session progress {flags(cluster)} --procs 1\nx = 1")
    try:
        assert out.ok, out.stdout
        for host in cluster.hosts:
            assert f"[jupyter_dist] node {host}: connecting" in out.stdout
            assert re.search(rf"\[jupyter_dist\] node {host}: agent ready in \d+\.\d s", out.stdout)
    finally:
        run("%dist shutdown --session progress")


def test_every_failing_node_is_named_and_the_good_one_is_stopped(run: Run, cluster: Any) -> None:
    out = run(
        f"%%distributed --session partial --hosts {cluster.hosts[0]},nosuch-a,nosuch-b "
        f"--ssh-config {cluster.config_path} --procs 1\nx = 1"
    )
    assert isinstance(out.error, AgentError)
    message = str(out.error)
    assert "2 of 3 nodes failed to start" in message
    assert "node 'nosuch-a': cannot connect over SSH" in message
    assert "node 'nosuch-b': cannot connect over SSH" in message
    deadline = time.monotonic() + 10
    while agents_on(cluster, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert agents_on(cluster, 0) == []


def agents_on(cluster: Any, node: int) -> list[int]:
    """The agents on ``node`` and their ranks (titled ``jupyter_dist agent ...`` and
    ``jupyter_dist rank ...``)."""
    found = []
    for pid in netns_pids(cluster, node):
        try:
            if is_ours(Path(f"/proc/{pid}/cmdline").read_text().split("\0")):
                found.append(pid)
        except OSError:
            continue
    return found


def test_uneven_nodes(run: Run, cluster: Any) -> None:
    out = run(
        f"%%distributed --session uneven {flags(cluster)} --procs 2,1\n"
        "import os, socket, torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "print(socket.gethostname(), os.environ['LOCAL_RANK'], os.environ['LOCAL_WORLD_SIZE'], "
        "os.environ['WORLD_SIZE'], t.item())"
    )
    try:
        assert out.ok, out.stdout
        assert "[rank 0] node0 0 2 3 3.0" in out.stdout
        assert "[rank 1] node0 1 2 3 3.0" in out.stdout
        assert "[rank 2] node1 0 1 3 3.0" in out.stdout
    finally:
        run("%dist shutdown --session uneven")


def test_nodes_with_one_hostname_go_by_their_aliases(
    run: Run, cluster: Any, tmp_path: Path
) -> None:
    """Two aliases of one machine (as containers or cloned VMs that all say ``vm``): both
    agents report the hostname node1, and each node is shown by the name it was given."""
    text = Path(cluster.config_path).read_text()
    block = re.search(r"(?ms)^Host node1\n.*?(?=^Host |\Z)", text)
    assert block is not None
    config = tmp_path / "config"
    config.write_text(text + block.group(0).replace("Host node1", "Host twin1", 1))
    out = run(
        f"%%distributed --session twins --hosts node1,twin1 --ssh-config {config} --procs 1\n"
        "import socket\nprint(socket.gethostname())"
    )
    try:
        assert out.ok, out.stdout + out.stderr
        assert "[ranks 0-1] node1" in out.stdout, out.stdout  # one machine indeed
        assert "[jupyter_dist] node twin1: agent ready" in out.stdout, out.stdout
        status = session_status("twins")
        assert [n["host"] for n in status["nodes"]] == ["node1", "twin1"]
        assert [r["host"] for r in status["ranks"]] == ["node1", "twin1"]
        table = run("%dist status --session twins").stdout
        assert "1 · twin1" in table, table
    finally:
        run("%dist shutdown --session twins")


def test_jax_across_two_nodes_without_arguments(run: Run, cluster: Any) -> None:
    pytest.importorskip("jax")
    out = run(
        f"%%distributed --session jaxmn {flags(cluster)} --procs 1 --framework jax\n"
        "import os, jax, numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "jax.distributed.initialize()\n"
        "mesh = jax.make_mesh((jax.device_count(),), ('i',))\n"
        "local = np.array([float(jax.process_index() + 1)])\n"
        "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('i')), local)\n"
        "total = jax.shard_map(lambda v: jax.lax.psum(v, 'i'), mesh=mesh, in_specs=P('i'),\n"
        "                      out_specs=P())(x)\n"
        "print('psum', jax.process_count(), float(total.addressable_data(0)[0]))\n"
        "print('coordinator', os.environ['JAX_COORDINATOR_ADDRESS'].rsplit(':', 1)[0] == "
        "os.environ['MASTER_ADDR'])"
    )
    try:
        assert out.ok, out.stdout + out.stderr
        assert "[ranks 0-1] psum 2 3.0" in out.stdout, out.stdout
        assert "[ranks 0-1] coordinator True" in out.stdout, out.stdout  # node 0's address
    finally:
        run("%dist shutdown --session jaxmn")


def test_live_samples_and_logs_come_from_every_node(two_nodes: str) -> None:
    """What the sidebar shows of a 2-node session: each node's agent samples its own
    machine and ranks, and reads its own ranks' logs."""
    from jupyter_dist.notebook.owners import embedded_owner

    plane = embedded_owner()
    session = plane.manager.get(two_nodes)
    plane.run(session.sample())  # the first sample starts psutil's CPU counts
    sample = plane.run(session.sample())
    assert [n["node_rank"] for n in sample["nodes"]] == [0, 1]
    assert all(n["error"] == "" and n["mem_total_mib"] for n in sample["nodes"])
    assert [r["rank"] for r in sample["ranks"]] == [0, 1, 2, 3]
    pids = {r["rank"]: r["pid"] for r in session_status(two_nodes)["ranks"]}
    assert {r["rank"]: r["pid"] for r in sample["ranks"]} == pids
    assert all(r["rss_mib"] for r in sample["ranks"])
    piece = plane.run(session.read_log(3))  # a rank of the second node
    assert piece["rank"] == 3 and piece["end"] >= piece["offset"] == 0
