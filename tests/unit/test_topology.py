"""The environment each rank gets, against torchrun's rules."""

from __future__ import annotations

from jupyter_dist.rendezvous import Rendezvous, free_port
from jupyter_dist.spec import SessionSpec
from jupyter_dist.topology import places, rank_env


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
