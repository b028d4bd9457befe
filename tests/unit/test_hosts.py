"""Where nodes come from: --hosts lists, hostfiles, and the shapes they make."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dist.common.hosts import HostSpec, parse_hosts, read_hostfile
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.launchers.ssh import agent_command
from jupyter_dist.errors import SpecError


def test_host_forms() -> None:
    hosts = parse_hosts("gpu1,alice@gpu2,gpu3:2222,bob@10.0.0.4:22,[fe80::1]")
    assert hosts == (
        HostSpec("gpu1"),
        HostSpec("gpu2", "alice"),
        HostSpec("gpu3", None, 2222),
        HostSpec("10.0.0.4", "bob", 22),
        HostSpec("fe80::1"),
    )
    assert str(hosts[3]) == "bob@10.0.0.4:22"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a b", "'a b' is not a host"),
        ("a:70000", "port 70000 of 'a:70000' is outside 1-65535"),
        ("a,a", "'a' is listed twice"),
        (",", "expected one or more hosts"),
    ],
)
def test_bad_hosts(text: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_hosts(text)


def test_hostfile(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode0 slots=4\n\nalice@node1:2200   slots=4  # second\n")
    assert read_hostfile(f) == (HostSpec("node0", slots=4), HostSpec("node1", "alice", 2200, 4))
    f.write_text("node0 python=/opt/py/bin/python slots=2\nnode1\n")
    assert read_hostfile(f) == (
        HostSpec("node0", slots=2, python="/opt/py/bin/python"),
        HostSpec("node1"),
    )


def test_bad_hostfile(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("node0 slot=4\n")
    with pytest.raises(SpecError, match=r"line 1: 'slot=4': expected slots=N"):
        read_hostfile(f)
    with pytest.raises(SpecError, match="cannot read it"):
        read_hostfile(tmp_path / "missing")


def test_nodes_must_match_hosts() -> None:
    req = ShapeRequest(nodes=3, procs=2, hosts=parse_hosts("a,b"))
    with pytest.raises(SpecError, match=r"--nodes 3 but 2 hosts are given \(a,b\)"):
        resolve_shape("s", req, 0, "here")


def test_several_nodes_need_hosts() -> None:
    with pytest.raises(SpecError, match="give --hosts a,b or --hostfile FILE"):
        resolve_shape("s", ShapeRequest(nodes=2, procs=1), 0, "here")


def test_remote_shapes_basic() -> None:
    spec = resolve_shape("s", ShapeRequest(procs=2, hosts=parse_hosts("a,b")), 0, "here")
    assert (spec.nodes, spec.world_size, spec.backend) == (2, 4, "gloo")
    slots = (HostSpec("a", slots=4), HostSpec("b", slots=4))
    spec = resolve_shape("s", ShapeRequest(hosts=slots), 0, "here")
    assert (spec.device, spec.procs_per_node, spec.world_size) == ("cuda", 4, 8)
    with pytest.raises(SpecError, match="say how many ranks each node runs"):
        resolve_shape("s", ShapeRequest(hosts=parse_hosts("a,b")), 0, "here")
    assert spec.counts == (4, 4)


def test_agent_command_falls_back_to_python3() -> None:
    line = agent_command("s", {"OMP_NUM_THREADS": "1"}, None)
    assert '[ -x "$p" ] || p=python3' in line
    assert "exec env OMP_NUM_THREADS=1" in line
    assert "-m jupyter_dist.node --session s" in line
    assert "python3" not in agent_command("s", {}, "/opt/py/bin/python")


def test_counts_per_node() -> None:
    from jupyter_dist.common.spec import parse_counts

    assert parse_counts("--gpus", "4") == (4,)
    assert parse_counts("--gpus", "4,2") == (4, 2)
    with pytest.raises(SpecError, match="expected a whole number, or one per node"):
        parse_counts("--gpus", "4,x")
    with pytest.raises(SpecError, match="--gpus 0: expected a whole number of at least 1"):
        parse_counts("--gpus", "4,0")


def test_uneven_nodes_place_ranks_node_by_node() -> None:
    from jupyter_dist.control.rank_env import places, rank_env
    from jupyter_dist.control.rendezvous import Rendezvous

    spec = resolve_shape("s", ShapeRequest(procs=(2, 1), hosts=parse_hosts("a,b")), 0, "here")
    assert (spec.world_size, spec.counts, spec.describe()) == (
        3, (2, 1), "2 nodes x 2,1 CPU ranks (gloo)"
    )  # fmt: skip
    assert [(p.rank, p.local_rank, p.node_rank) for p in places(spec)] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 1)
    ]  # fmt: skip
    last = rank_env(spec, places(spec)[2], Rendezvous("a", 1, "r"), {})
    assert (last["LOCAL_WORLD_SIZE"], last["WORLD_SIZE"], last["OMP_NUM_THREADS"]) == (
        "1", "3", str(__import__("os").cpu_count())
    )  # fmt: skip


def test_counts_must_match_the_nodes() -> None:
    with pytest.raises(SpecError, match=r"--gpus 4,2,2: 3 counts for 2 node\(s\)"):
        resolve_shape("s", ShapeRequest(gpus=(4, 2, 2), hosts=parse_hosts("a,b")), 0, "here")


def test_hostfile_slots_may_differ() -> None:
    hosts = (HostSpec("a", slots=4), HostSpec("b", slots=2))
    spec = resolve_shape("s", ShapeRequest(hosts=hosts), 0, "here")
    assert (spec.device, spec.counts, spec.flags()) == (
        "cuda",
        (4, 2),
        "--nodes 2 --gpus 4,2 --backend nccl",
    )
    with pytest.raises(SpecError, match="b give no slots=N while others do"):
        resolve_shape("s", ShapeRequest(hosts=(HostSpec("a", slots=4), HostSpec("b"))), 0, "h")


def test_same_shape_with_counts() -> None:
    from jupyter_dist.common.spec import check_same_shape
    from jupyter_dist.errors import ShapeMismatchError

    spec = resolve_shape("s", ShapeRequest(procs=(2, 1), hosts=parse_hosts("a,b")), 0, "here")
    check_same_shape(spec, ShapeRequest(procs=(2, 1)))
    with pytest.raises(ShapeMismatchError, match="--procs 2"):
        check_same_shape(spec, ShapeRequest(procs=2))


def test_counts_per_node_need_nodes() -> None:
    with pytest.raises(SpecError, match="one count per node needs the nodes"):
        resolve_shape("s", ShapeRequest(procs=(2, 1)), 0, "here")


def test_a_hosts_own_python_wins_over_the_flag() -> None:
    from jupyter_dist.control.launchers.ssh import SSHLauncher

    assert SSHLauncher(HostSpec("a", python="/opt/py"), python="/usr/bin/python3").python == (
        "/opt/py"
    )
    assert SSHLauncher(HostSpec("a"), python="/usr/bin/python3").python == "/usr/bin/python3"
