"""Rank-side helpers: info() and shard()."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import jupyter_dist
from jupyter_dist.errors import NotInRankError, SpecError
from jupyter_dist.rank.helpers import shard


def test_info_outside_a_rank_says_where_it_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(NotInRankError, match="RANK is not set"):
        jupyter_dist.info()


def test_info_reads_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in dict(
        RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", NODE_RANK="1"
    ).items():
        monkeypatch.setenv(k, v)
    info = jupyter_dist.info()
    assert (info.rank, info.local_rank, info.world_size, info.node_rank) == (3, 1, 4, 1)
    assert not info.is_head


@pytest.mark.parametrize("n", [10, 11, 3, 0])
def test_blocks_cover_everything_once(n: int) -> None:
    data = list(range(n))
    parts = [shard(data, rank=r, world_size=4) for r in range(4)]
    assert [x for part in parts for x in part] == data
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shuffle_is_consistent_across_arrays_and_ranks() -> None:
    x = np.arange(100)
    y = torch.arange(100) * 10
    seen = []
    for r in range(3):
        xs, ys = shard(x, y, shuffle=True, seed=7, rank=r, world_size=3)
        assert torch.equal(torch.from_numpy(xs) * 10, ys)
        seen.extend(xs.tolist())
    assert sorted(seen) == list(range(100))
    assert seen != list(range(100))


def test_unshuffled_numpy_shard_is_a_view() -> None:
    x = np.arange(10)
    part = shard(x, rank=1, world_size=2)
    assert part.base is x


def test_lengths_must_match() -> None:
    with pytest.raises(SpecError, match=r"different lengths \[2, 3\]"):
        shard([1, 2], [1, 2, 3], rank=0, world_size=1)


def test_distributed_sampler_is_reexported() -> None:
    from torch.utils.data.distributed import DistributedSampler

    assert jupyter_dist.DistributedSampler is DistributedSampler
