"""Helpers for code running inside a rank: who am I, and my share of the data.

Imported as ``jupyter_dist.info``, ``jupyter_dist.shard`` and
``jupyter_dist.DistributedSampler``; they read torchrun's environment, so they also work
in a script started by ``torchrun``.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_dist.errors import NotInRankError, SpecError
from jupyter_dist.settings import GENERATION_VAR


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the distributed job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    host: str
    #: which process group of the session this rank is in: 0 at the start, one more each
    #: time ranks were replaced or the session resized and every rank joined a new one
    generation: int = 0

    @property
    def is_head(self) -> bool:
        """True on rank 0: the rank that should log, save and print summaries."""
        return self.rank == 0


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise NotInRankError(
            f"{name} is not set: jupyter_dist.info() and shard() run inside a rank "
            "(a %%distributed cell, or a torchrun worker)"
        )
    return int(value)


def info() -> RankInfo:
    """This rank's place: rank, local_rank, world_size, node_rank, host, is_head."""
    rank = _env_int("RANK")
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return RankInfo(
        rank=rank,
        local_rank=_env_int("LOCAL_RANK"),
        world_size=_env_int("WORLD_SIZE"),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE") or _env_int("WORLD_SIZE")),
        node_rank=int(node),
        host=socket.gethostname(),
        generation=int(os.environ.get(GENERATION_VAR) or 0),
    )


def _bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous block ``rank`` of ``world`` nearly equal blocks (sizes differ by <= 1)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _take(data: Any, index: Sequence[int] | slice) -> Any:
    if isinstance(index, slice):
        return data[index]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return data[torch.as_tensor(list(index), dtype=torch.long, device=data.device)]
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(data, numpy.ndarray):
        return data[numpy.asarray(index, dtype=numpy.int64)]
    picked = [data[i] for i in index]
    return type(data)(picked) if isinstance(data, (list, tuple)) else picked


def shard(
    *arrays: Any,
    shuffle: bool = False,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
) -> Any:
    """This rank's slice of each array, consistently across arrays and ranks.

    Every array must have the same length. Without ``shuffle`` each rank gets one
    contiguous block (a view where the type allows); with it, the same ``seed`` gives the
    same permutation on every rank, so the blocks still cover every item exactly once.
    One array in, one slice out; several in, a tuple out.
    """
    if not arrays:
        raise SpecError("shard() needs at least one array, list, or tensor")
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise SpecError(
            f"shard(): arrays have different lengths {sorted(lengths)}; expected equal lengths"
        )
    if rank is None or world_size is None:
        here = info()
        rank = here.rank if rank is None else rank
        world_size = here.world_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise SpecError(f"shard(): rank {rank} is outside 0..{world_size - 1}")
    n = lengths.pop()
    start, stop = _bounds(n, rank, world_size)
    index: Sequence[int] | slice
    if shuffle:
        order = list(range(n))
        random.Random(seed).shuffle(order)
        index = order[start:stop]
    else:
        index = slice(start, stop)
    parts = tuple(_take(a, index) for a in arrays)
    return parts[0] if len(parts) == 1 else parts
