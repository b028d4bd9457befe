"""NCCL ranks on real CUDA devices; skipped on machines without them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from jupyter_dist.common.events import CellResult, StreamOut
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.settings import INTERRUPT_ACK_VAR

from .nccl_cell import run_and_pull

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA devices"),
]


def test_one_rank_per_gpu_all_reduce_over_nccl(shell: Any) -> None:
    gpus = torch.cuda.device_count()
    devices, totals, backends = run_and_pull(
        shell, "gpu", f"--gpus {gpus}", "import torch\ndev = torch.cuda.current_device()\n", "dev"
    )
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


def test_a_rank_blocked_in_cuda_is_replaced_and_the_next_cell_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop button on a rank waiting in C code for a long CUDA kernel: the interrupt
    cannot reach it, so the rank is replaced by a fresh one (freeing its GPU), and the
    next cell runs over NCCL, on a new process group."""
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "3")  # read by the session (10 s by default)
    spec = resolve_shape("gpustop", ShapeRequest(gpus=1), torch.cuda.device_count(), "localhost")
    session = Session(spec, SessionTimeouts(start=300))

    async def scenario() -> tuple[CellResult, CellResult, str]:
        await session.start()
        try:
            warm = "import torch\nx = torch.ones(1, device='cuda')"
            assert not (await session.execute(warm)).failures
            blocked = asyncio.ensure_future(
                session.execute(
                    "torch.cuda._sleep(200_000_000_000)\ntorch.cuda.synchronize()",
                    sink=EventQueue(),
                )
            )
            await asyncio.sleep(5)  # the rank waits in cudaDeviceSynchronize by now
            await session.stop_cell()
            stopped = await blocked
            sink = EventQueue()
            after = await session.execute(
                "import torch, torch.distributed as dist\nt = torch.ones(4, device='cuda')\n"
                "dist.all_reduce(t)\nprint('sum', t.sum().item(), dist.get_backend())",
                sink=sink,
            )
            printed = ""
            while not sink.empty():
                event = sink.get()
                if isinstance(event, StreamOut):
                    printed += event.text
            return stopped, after, printed
        finally:
            await session.shutdown()

    stopped, after, printed = asyncio.run(scenario())
    assert stopped.stuck == (0,), stopped
    note = " ".join(stopped.note.split())
    assert note.startswith("rank 0 could not be stopped (blocked in C code"), note
    assert "rank 0 replaced by a fresh rank kernel" in note and "(generation 1)" in note, note
    assert not after.failures, after
    assert "sum 4.0 nccl" in printed, printed
