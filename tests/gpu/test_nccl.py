"""NCCL ranks on real CUDA devices; skipped on machines without them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA devices"),
]


def test_one_rank_per_gpu_all_reduce_over_nccl(shell: Any) -> None:
    gpus = torch.cuda.device_count()
    result = shell.run_cell(
        f"%%distributed --session gpu --gpus {gpus}\n"
        "import os, torch, torch.distributed as dist\n"
        "dev = torch.cuda.current_device()\n"
        "t = torch.ones(1024, device='cuda') * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "total = t[0].item()\n"
        "backend = dist.get_backend()\n"
    )
    try:
        assert result.success, result.error_in_exec
        devices = shell.run_line_magic("dist", "pull dev --session gpu")
        totals = shell.run_line_magic("dist", "pull total --session gpu")
        backends = shell.run_line_magic("dist", "pull backend --session gpu")
    finally:
        shell.run_line_magic("dist", "shutdown --session gpu")
    assert devices == list(range(gpus))  # set_device(LOCAL_RANK) before the first cell
    assert totals == [gpus * (gpus + 1) / 2] * gpus
    assert backends == ["nccl"] * gpus


def test_cuda_tensors_pull_back(shell: Any) -> None:
    result = shell.run_cell(
        "%%distributed --session gpu2 --gpus 1\nimport torch\nx = torch.arange(4.0, device='cuda')"
    )
    try:
        assert result.success, result.error_in_exec
        (x,) = shell.run_line_magic("dist", "pull x --session gpu2")
    finally:
        shell.run_line_magic("dist", "shutdown --session gpu2")
    assert x.device.type == "cpu"  # the notebook never touches the GPU
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
