"""JAX's cluster auto-detection in a ``--framework jax`` rank, without processes."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from jupyter_dist.errors import SpecError
from jupyter_dist.rank import jax_cluster

SESSION_ENV = {
    "JUPYTER_DIST_SESSION": "s",
    "JUPYTER_DIST_FRAMEWORK": "jax",
    "JUPYTER_DIST_DEVICE": "cpu",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "JAX_COORDINATOR_ADDRESS": "127.0.0.1:29601",
}
#: what would make JAX take the rank for a Slurm job step
SLURM_ENV = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
             "SLURM_STEP_NODELIST": "n1", "SLURM_LOCALID": "0"}  # fmt: skip


class DictStore:
    """What `coordinator_address` uses of a TCPStore: set and get."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.values[key]


@pytest.fixture
def session_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**SESSION_ENV, **SLURM_ENV}.items():
        monkeypatch.setenv(name, value)
    for name in ("JAX_COORDINATOR_PORT", "JAX_LOCAL_DEVICE_IDS", "JUPYTER_DIST_MASTER_PORTS"):
        monkeypatch.delenv(name, raising=False)


def detect() -> tuple[Any, ...]:
    clusters: Any = pytest.importorskip("jax._src.clusters")
    found: tuple[Any, ...] = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, 10
    )
    return found


def test_jax_detects_the_session_first_even_inside_slurm(session_env: None) -> None:
    pytest.importorskip("jax")
    cluster = jax_cluster.register()
    assert jax_cluster.register() is cluster  # registered once, kept first
    assert detect() == ("127.0.0.1:29601", 4, 3, None)


def test_gpu_ranks_get_their_local_device(
    session_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("jax")
    jax_cluster.register()
    monkeypatch.setenv("JUPYTER_DIST_DEVICE", "cuda")
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "29700")
    assert detect() == ("127.0.0.1:29700", 4, 3, [1])


def test_outside_a_jax_session_the_cluster_stands_aside(
    session_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("jax")
    jax_cluster.register()
    monkeypatch.setenv("JUPYTER_DIST_FRAMEWORK", "torch")
    _, count, pid, _ = detect()
    assert (count, pid) != (4, 3)  # the next cluster in JAX's list answered (Slurm here)


def test_rank_zero_publishes_a_free_port_the_others_read(
    session_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DictStore()
    monkeypatch.setenv("RANK", "0")
    address = jax_cluster.coordinator_address(store)
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and port != "29500"
    with socket.socket() as probe:  # free when chosen
        probe.bind((host, int(port)))
    monkeypatch.setenv("RANK", "2")
    assert jax_cluster.coordinator_address(store) == address


def test_the_coordinator_port_can_be_named_or_ranged(
    session_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "29611")
    assert jax_cluster.coordinator_address(DictStore()) == "127.0.0.1:29611"
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "10-20")
    with pytest.raises(ValueError, match=r"JAX_COORDINATOR_PORT='10-20': expected one port"):
        jax_cluster.coordinator_address(DictStore())
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "many")
    with pytest.raises(SpecError, match="JAX_COORDINATOR_PORT 'many'"):
        jax_cluster.coordinator_address(DictStore())
    monkeypatch.delenv("JAX_COORDINATOR_PORT")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("JUPYTER_DIST_MASTER_PORTS", f"{port}-{port}")
        with pytest.raises(RuntimeError, match=f"JUPYTER_DIST_MASTER_PORTS={port}-{port} is"):
            jax_cluster.coordinator_address(DictStore())


def test_ipv6_addresses_are_bracketed() -> None:
    assert jax_cluster.host_port("::1", 5) == "[::1]:5"
    assert jax_cluster.host_port("10.0.0.1", 5) == "10.0.0.1:5"
    assert jax_cluster.host_port("[::1]", 5) == "[::1]:5"


class State:
    coordinator_address = "127.0.0.1:29601"
    num_processes = 4
    process_id = 3


@pytest.mark.parametrize(
    ("kwargs", "same"),
    [
        ({}, True),
        ({"coordinator_address": "127.0.0.1:29601", "num_processes": 4, "process_id": 3}, True),
        ({"num_processes": 5}, False),
        ({"local_device_ids": [0]}, False),
        ({"initialization_timeout": 10}, False),
    ],
)
def test_only_a_call_asking_for_what_is_there_is_repeated(
    kwargs: dict[str, Any], same: bool
) -> None:
    import inspect

    def initialize(
        coordinator_address: str | None = None,
        num_processes: int | None = None,
        process_id: int | None = None,
        local_device_ids: list[int] | None = None,
        initialization_timeout: int | None = None,
    ) -> None:
        """JAX's signature, in short."""

    bound = inspect.signature(initialize).bind(**kwargs)
    assert jax_cluster._asks_same(bound, State()) is same


@pytest.mark.parametrize(
    ("kwargs", "env", "bind"),
    [
        ({}, {}, "127.0.0.1:29601"),  # the session's coordinator: its address only
        ({"coordinator_address": "127.0.0.1:29601"}, {}, "127.0.0.1:29601"),
        ({"coordinator_address": "localhost:10000"}, {}, None),  # the user's: JAX's default
        ({"coordinator_bind_address": "0.0.0.0:29601"}, {}, None),
        ({}, {"JAX_COORDINATOR_BIND_ADDRESS": "0.0.0.0:29601"}, None),
    ],
)
def test_only_the_sessions_coordinator_is_bound_to_its_address(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], env: dict[str, str], bind: str | None
) -> None:
    import inspect

    def initialize(
        coordinator_address: str | None = None,
        num_processes: int | None = None,
        process_id: int | None = None,
        coordinator_bind_address: str | None = None,
    ) -> None:
        """JAX's signature, in short."""

    monkeypatch.setattr(jax_cluster, "_session_address", "127.0.0.1:29601")
    monkeypatch.delenv("JAX_COORDINATOR_BIND_ADDRESS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bound = inspect.signature(initialize).bind(**kwargs)
    assert jax_cluster.bind_address(bound) == bind


def test_a_coordinator_the_user_exported_is_not_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    monkeypatch.setattr(jax_cluster, "_session_address", None)
    bound = inspect.signature(lambda coordinator_address=None: None).bind()
    assert jax_cluster.bind_address(bound) is None
