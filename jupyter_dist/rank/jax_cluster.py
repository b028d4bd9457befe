"""JAX inside a rank: ``jax.distributed.initialize()`` works with no arguments.

A session started with ``--framework jax`` gets no torch process group; instead `prepare`
(called by the bootstrap) gives every rank what JAX's own launchers would:

* the coordinator's address, ``JAX_COORDINATOR_ADDRESS``: a port of its own on the
  session's ``MASTER_ADDR``, beside torch's store. Rank 0 picks one free there (from
  ``JUPYTER_DIST_MASTER_PORTS`` when the user gave a range, ``JAX_COORDINATOR_PORT`` when
  the user named one) and publishes it through the session's store; the other ranks read
  it from there. A call that uses it (no ``coordinator_address``) has the coordinator
  listen on that address only (``coordinator_bind_address``), not on every interface as
  JAX's default would. The session does not export ``JAX_COORDINATOR_BIND_ADDRESS``: JAX
  code that names its own coordinator (``initialize('localhost:10000', 2, rank)``, as
  JAX's docs do) would have its coordinator bind the session's port instead, and wait
  for itself until JAX's timeout. Such a call works as in a plain process;
* the process count and id, and on GPUs the local device id: JAX reads these only from a
  cluster it recognises (``jax._src.clusters``: Slurm, Open MPI, Kubernetes, TPU VMs), so
  `register` adds one, ``jupyter_dist``, first in JAX's list (a session inside a Slurm
  allocation would otherwise be taken for a Slurm job step, with the agents' ids). It
  reads torchrun's variables: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``.

The bootstrap does not call ``jax.distributed.initialize()`` itself: JAX code people
already have calls it, once, before anything else of JAX runs, and the user may want to
pass options of its own (timeouts, ``local_device_ids``). A second no-argument call, as
re-running a notebook cell makes, returns at once instead of raising "should only be
called once" (`wrap_initialize`). CPU ranks use gloo for cross-process collectives,
JAX's default, set explicitly where an older JAX has none.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from jupyter_dist.common.ports import free_port, parse_port_range
from jupyter_dist.settings import DEVICE_VAR, FRAMEWORK_VAR, MASTER_PORTS_VAR, SESSION_VAR

#: JAX's own variables, read by ``jax.distributed.initialize``
ADDRESS_VAR = "JAX_COORDINATOR_ADDRESS"
BIND_VAR = "JAX_COORDINATOR_BIND_ADDRESS"
PORT_VAR = "JAX_COORDINATOR_PORT"
LOCAL_IDS_VAR = "JAX_LOCAL_DEVICE_IDS"
#: the store key under which rank 0 publishes the coordinator's address
COORDINATOR_KEY = "jupyter_dist/jax_coordinator"
#: the name of the cluster `register` adds to JAX's list
CLUSTER_NAME = "jupyter_dist"
_WRAPPED = "_jupyter_dist_wrapped"
#: the coordinator `prepare` chose for this session (None: the user named one)
_session_address: str | None = None


def host_port(addr: str, port: int | str) -> str:
    """``host:port`` as gRPC takes it (an IPv6 address in brackets)."""
    host = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
    return f"{host}:{port}"


def _pick_port(addr: str) -> int:
    """Rank 0: a port for the coordinator, free on ``addr`` right now."""
    named = os.environ.get(PORT_VAR, "").strip()
    if named:
        low, high = parse_port_range(named, PORT_VAR)
        if low != high:
            raise ValueError(f"{PORT_VAR}={named!r}: expected one port, like 29600")
        return low
    allowed = os.environ.get(MASTER_PORTS_VAR, "").strip()
    port = free_port(addr, parse_port_range(allowed) if allowed else None)
    if port == 0:
        raise RuntimeError(
            f"no free port for JAX's coordinator on {addr}: every port of {MASTER_PORTS_VAR}="
            f"{allowed} is taken; widen the range"
        )
    return port


def coordinator_address(store: Any) -> str:
    """The coordinator's ``host:port``: chosen by rank 0, read from the store by the rest
    (who wait for it as long as the store's timeout)."""
    if int(os.environ["RANK"]) == 0:
        address = host_port(os.environ["MASTER_ADDR"], _pick_port(os.environ["MASTER_ADDR"]))
        store.set(COORDINATOR_KEY, address)
        return address
    raw: bytes = store.get(COORDINATOR_KEY)
    return raw.decode()


def session_store(hosted: Any, timeout_s: float) -> Any:
    """The session's store: the one rank 0 hosts, else a client of it."""
    if hosted is not None:
        return hosted
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def prepare(hosted_store: Any, timeout_s: float) -> None:
    """Give this rank what a no-argument ``jax.distributed.initialize()`` needs."""
    global _session_address
    if ADDRESS_VAR not in os.environ:  # a coordinator the user named wins
        address = coordinator_address(session_store(hosted_store, timeout_s))
        os.environ[ADDRESS_VAR] = address
        _session_address = address
    if os.environ.get(DEVICE_VAR) == "cuda":
        os.environ.setdefault(LOCAL_IDS_VAR, os.environ["LOCAL_RANK"])
    config: Any = importlib.import_module("jax").config
    if os.environ.get(DEVICE_VAR) != "cuda" and not config.jax_cpu_collectives_implementation:
        config.update("jax_cpu_collectives_implementation", "gloo")  # an older JAX's default
    register()
    wrap_initialize()


def in_session() -> bool:
    """This process is a rank of a ``--framework jax`` session."""
    return os.environ.get(SESSION_VAR) is not None and os.environ.get(FRAMEWORK_VAR) == "jax"


def _is_env_present(cls: type) -> bool:
    return in_session() and ADDRESS_VAR in os.environ


def _coordinator(cls: type, timeout_secs: int | None, override_coordinator_port: str | None) -> str:
    address = os.environ[ADDRESS_VAR]
    if override_coordinator_port:
        address = f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
    return address


def _process_count(cls: type) -> int:
    return int(os.environ["WORLD_SIZE"])


def _process_id(cls: type) -> int:
    return int(os.environ["RANK"])


def _local_process_id(cls: type) -> int | None:
    if os.environ.get(DEVICE_VAR) != "cuda":
        return None  # a CPU rank sees its own CPU device, whatever the ids
    return int(os.environ["LOCAL_RANK"])


def register() -> type:
    """Add the session's cluster to JAX's auto-detection, first in its list; idempotent.

    The cluster is a subclass of JAX's ``ClusterEnv`` (made with `type`, JAX being an
    optional dependency) whose answers are torchrun's variables.
    """
    clusters: Any = importlib.import_module("jax._src.clusters")
    types: list[type] = clusters.ClusterEnv._cluster_types
    cluster = next((t for t in types if getattr(t, "name", None) == CLUSTER_NAME), None)
    if cluster is None:
        cluster = type(
            "SessionCluster",
            (clusters.ClusterEnv,),
            {
                "__doc__": "A jupyter_dist session's ranks, as torchrun's variables describe them.",
                "__module__": __name__,
                "name": CLUSTER_NAME,
                "is_env_present": classmethod(_is_env_present),
                "get_coordinator_address": classmethod(_coordinator),
                "get_process_count": classmethod(_process_count),
                "get_process_id": classmethod(_process_id),
                "get_local_process_id": classmethod(_local_process_id),
            },
        )  # ClusterEnv.__init_subclass__ appends it to the list: it moves to the front
    types.remove(cluster)
    types.insert(0, cluster)
    return cluster


#: arguments of ``initialize`` a repeated call may name, and the state that holds them
_SAME_AS = {
    "coordinator_address": "coordinator_address",
    "num_processes": "num_processes",
    "process_id": "process_id",
}


def wrap_initialize() -> None:
    """Make a repeated ``jax.distributed.initialize()`` return at once; idempotent.

    Only a call that asks for what is already there (no arguments, or the same
    coordinator, process count and id) is let through; any other goes to JAX, which
    refuses a second initialisation itself. A first call that takes the session's
    coordinator has it bind that address only (`bind_address`).
    """
    public: Any = importlib.import_module("jax.distributed")
    state_module: Any = importlib.import_module("jax._src.distributed")
    original: Callable[..., Any] = public.initialize
    if getattr(original, _WRAPPED, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        state = state_module.global_state
        bound = signature.bind(*args, **kwargs)
        if state.client is not None and _asks_same(bound, state):
            return None
        bind = bind_address(bound)
        if bind is not None:
            kwargs["coordinator_bind_address"] = bind
        return original(*args, **kwargs)

    setattr(initialize, _WRAPPED, True)
    public.initialize = initialize


def bind_address(bound: inspect.BoundArguments) -> str | None:
    """Where the coordinator of a call to ``initialize`` should listen, when it is the
    session's: the session's address (not every interface). None for a call that names
    its own coordinator or bind address, or when the user exported either variable."""
    named = bound.arguments.get("coordinator_address")
    if _session_address is None or named not in (None, _session_address):
        return None
    if bound.arguments.get("coordinator_bind_address") is not None or BIND_VAR in os.environ:
        return None
    return _session_address


def _asks_same(bound: inspect.BoundArguments, state: Any) -> bool:
    for name, value in bound.arguments.items():
        if value is None:
            continue
        if name not in _SAME_AS or getattr(state, _SAME_AS[name], None) != value:
            return False
    return True
