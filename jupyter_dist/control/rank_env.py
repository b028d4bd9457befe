"""The environment of each rank: the names and meanings torchrun gives.

`rank_env` is the single place where RANK, LOCAL_RANK, WORLD_SIZE ... are decided, so
that a script written for ``torchrun`` reads the same values inside a rank kernel.

Libraries that read their own variables get them here too: Hugging Face accelerate treats
CPU processes as one process each (and ``prepare()`` skips DDP) unless
``ACCELERATE_USE_CPU`` says otherwise, so a CPU session sets it on every rank (a value the
user gave wins). JAX's coordinator and ids come from the rank itself
(`jupyter_dist.rank.jax_cluster`), told by ``JUPYTER_DIST_FRAMEWORK``.

Processes a rank starts inherit all of it, as a torchrun worker's children do, except
that those ``torch.multiprocessing.spawn`` starts see ``TORCHELASTIC_USE_AGENT_STORE=False``
(`jupyter_dist.rank.spawn_env`): they make a group of their own, whose rank 0 hosts its
store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.rendezvous import Rendezvous
from jupyter_dist.settings import BACKEND_VAR, DEVICE_VAR, FRAMEWORK_VAR, SESSION_VAR

#: accelerate's switch for distributed CPU processes (``accelerate.state.AcceleratorState``)
ACCELERATE_CPU_VAR = "ACCELERATE_USE_CPU"


@dataclass(frozen=True)
class RankPlace:
    """Where one rank sits in the world."""

    rank: int
    local_rank: int
    node_rank: int


def places(spec: SessionSpec) -> list[RankPlace]:
    """Ranks in torchrun's order: node-major, local rank within the node."""
    found: list[RankPlace] = []
    for node, count in enumerate(spec.counts):
        found.extend(RankPlace(len(found), local, node) for local in range(count))
    return found


def omp_threads(spec: SessionSpec, user_env: Mapping[str, str], node: int = 0) -> str:
    """torchrun sets OMP_NUM_THREADS=1 when several ranks share a node and the user did not."""
    if "OMP_NUM_THREADS" in user_env:
        return user_env["OMP_NUM_THREADS"]
    return "1" if spec.procs_on(node) > 1 else str(os.cpu_count() or 1)


def rank_env(
    spec: SessionSpec,
    place: RankPlace,
    rdzv: Rendezvous,
    user_env: Mapping[str, str],
) -> dict[str, str]:
    """The variables a rank gets on top of its node's environment."""
    world = str(spec.world_size)
    env = {
        "RANK": str(place.rank),
        "LOCAL_RANK": str(place.local_rank),
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": str(spec.procs_on(place.node_rank)),
        "GROUP_RANK": str(place.node_rank),
        "GROUP_WORLD_SIZE": str(spec.nodes),
        "NODE_RANK": str(place.node_rank),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(place.rank),
        "ROLE_WORLD_SIZE": world,
        "MASTER_ADDR": rdzv.master_addr,
        "MASTER_PORT": str(rdzv.master_port),
        "TORCHELASTIC_RUN_ID": rdzv.run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # rank 0 hosts the store
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": user_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "OMP_NUM_THREADS": omp_threads(spec, user_env, place.node_rank),
        SESSION_VAR: spec.name,
        DEVICE_VAR: spec.device,
        BACKEND_VAR: spec.backend,
        FRAMEWORK_VAR: spec.framework,
    }
    if spec.device == "cpu":
        env[ACCELERATE_CPU_VAR] = user_env.get(ACCELERATE_CPU_VAR, "1")
    return env
