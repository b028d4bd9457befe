"""The environment each rank gets, against torchrun's rules."""

from __future__ import annotations

import pytest

from jupyter_dist.common.ports import free_port
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.rank_env import places, rank_env
from jupyter_dist.control.rendezvous import Rendezvous


def test_places_are_node_major() -> None:
    spec = SessionSpec("s", nodes=2, procs_per_node=3)
    got = [(p.rank, p.local_rank, p.node_rank) for p in places(spec)]
    assert got == [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 1, 1), (5, 2, 1)]


def test_rank_env_of_a_two_node_job() -> None:
    spec = SessionSpec("s", nodes=2, procs_per_node=2)
    rdzv = Rendezvous("10.0.0.1", 29500, "run-1")
    env = rank_env(spec, places(spec)[3], rdzv, {})
    assert env["RANK"] == "3"
    assert env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == "4"
    assert env["LOCAL_WORLD_SIZE"] == "2"
    assert env["GROUP_RANK"] == env["NODE_RANK"] == "1"
    assert env["GROUP_WORLD_SIZE"] == "2"
    assert env["ROLE_RANK"] == "3"
    assert env["ROLE_WORLD_SIZE"] == "4"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert env["TORCHELASTIC_RUN_ID"] == "run-1"


def test_omp_threads_follow_torchrun() -> None:
    rdzv = Rendezvous("localhost", 1, "r")
    several = SessionSpec("s", procs_per_node=2)
    assert rank_env(several, places(several)[0], rdzv, {})["OMP_NUM_THREADS"] == "1"
    user = rank_env(several, places(several)[0], rdzv, {"OMP_NUM_THREADS": "3"})
    assert user["OMP_NUM_THREADS"] == "3"


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_port_ranges_are_parsed_and_bad_ones_named() -> None:
    from jupyter_dist.common.ports import parse_port_range
    from jupyter_dist.errors import SpecError

    assert parse_port_range("29500-29599") == (29500, 29599)
    assert parse_port_range(" 29500 ") == (29500, 29500)
    for bad in ("a-b", "29600-29500", "0-10", "70000"):
        with pytest.raises(SpecError, match=repr(bad)):
            parse_port_range(bad)


def test_free_port_stays_in_its_range_and_says_when_all_are_taken() -> None:
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert free_port("localhost", (port, port)) == 0
        other = free_port("localhost", (port, port + 1))
        assert other in (0, port + 1)  # port + 1 may belong to someone else
    assert free_port("localhost", (port, port)) == port


def test_server_defaults_fill_in_hosts_and_ssh_config() -> None:
    from jupyter_dist.common.hosts import parse_hosts
    from jupyter_dist.common.spec import ShapeRequest
    from jupyter_dist.control.manager import SessionDefaults
    from jupyter_dist.errors import SpecError

    defaults = SessionDefaults(hosts=parse_hosts("a,b,c"), ssh_config="/etc/cfg")
    every = defaults.apply(ShapeRequest(procs=2))
    assert [h.name for h in every.hosts] == ["a", "b", "c"] and every.ssh_config == "/etc/cfg"
    assert [h.name for h in defaults.apply(ShapeRequest(nodes=2)).hosts] == ["a", "b"]
    assert defaults.apply(ShapeRequest(nodes=1)).hosts == ()  # this machine
    assert defaults.apply(ShapeRequest(hosts=parse_hosts("x"))).hosts == parse_hosts("x")
    with pytest.raises(SpecError, match="--nodes 4: the server knows 3 hosts"):
        defaults.apply(ShapeRequest(nodes=4))


def test_cpu_ranks_tell_accelerate_they_are_distributed() -> None:
    rdzv = Rendezvous("localhost", 1, "r")
    cpu = SessionSpec("s", procs_per_node=2)
    env = rank_env(cpu, places(cpu)[1], rdzv, {})
    assert env["ACCELERATE_USE_CPU"] == "1"
    assert env["JUPYTER_DIST_FRAMEWORK"] == "torch"
    mine = rank_env(cpu, places(cpu)[1], rdzv, {"ACCELERATE_USE_CPU": "false"})
    assert mine["ACCELERATE_USE_CPU"] == "false"  # the user's own value wins
    gpus = SessionSpec("s", procs_per_node=2, device="cuda", backend="nccl", framework="jax")
    gpu_env = rank_env(gpus, places(gpus)[0], rdzv, {})
    assert "ACCELERATE_USE_CPU" not in gpu_env
    assert gpu_env["JUPYTER_DIST_FRAMEWORK"] == "jax"
