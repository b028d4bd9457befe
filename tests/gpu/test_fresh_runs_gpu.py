"""pytorch/examples' FSDP2 start on real CUDA devices, run twice in the same ranks: its
``init_process_group(device_id=...)`` joins the session's NCCL group on the first run and
the group made again on the second, as under torchrun; skipped without CUDA."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA devices"),
]

FSDP2_START = """\
import os, torch, torch.distributed as dist
device = torch.device('cuda', int(os.environ['LOCAL_RANK']))
dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
t = torch.ones(4, device=device)
dist.all_reduce(t)
print('sum', t[0].item(), dist.get_backend())
dist.destroy_process_group()
"""


def test_an_fsdp2_start_with_its_cuda_device_runs_twice(run: Any) -> None:
    gpus = torch.cuda.device_count()
    head = f"%%distributed --session fsdp2 --gpus {gpus} --timeout 300\n"
    try:
        for attempt in range(2):
            out = run(head + FSDP2_START)
            assert out.ok, out.stdout + out.stderr
            assert f"sum {float(gpus)} nccl" in out.stdout, out.stdout
            made_again = "is made again (nccl" in out.stdout + out.stderr
            assert made_again == (attempt == 1), out.stdout + out.stderr
        plain = run(head + "import torch.distributed as dist\nprint('group', dist.get_backend())")
        assert plain.ok and "group nccl" in plain.stdout, plain.stdout + plain.stderr
    finally:
        run("%dist shutdown --session fsdp2")
