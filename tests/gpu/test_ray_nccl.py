"""A ``--ray`` session on real GPUs: a one-node Ray cluster started here with every CUDA
device, ranks on the GPUs Ray gave the node's actor, NCCL between them. Skipped on
machines without CUDA or without ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from .nccl_cell import run_and_pull

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA devices"),
]
ray = pytest.importorskip("ray")

GCS_PORT = 6390


@pytest.fixture
def one_node_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``ray start --head`` with every GPU of this machine; its address. Stopped after, by
    its own processes' pids (never ``ray stop``, which ends every cluster here)."""
    temp = Path(tempfile.mkdtemp(prefix="jdrg-"))
    address = f"127.0.0.1:{GCS_PORT}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head"]
    argv += ["--port", str(GCS_PORT), "--node-ip-address", "127.0.0.1", "--temp-dir", str(temp)]
    argv += ["--num-gpus", str(torch.cuda.device_count()), "--include-dashboard", "false"]
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=180)
    monkeypatch.setenv("RAY_ADDRESS", address)
    try:
        yield address
    finally:
        found = subprocess.run(
            ["pgrep", "-f", str(temp)], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in found:
            subprocess.run(["kill", "-9", pid], check=False)
        shutil.rmtree(temp, ignore_errors=True)


def test_ranks_on_the_gpus_ray_gave_all_reduce_over_nccl(one_node_cluster: str, shell: Any) -> None:
    gpus = torch.cuda.device_count()
    flags = f"--ray --ray-address {one_node_cluster} --gpus {gpus}"
    visible, totals, backends = run_and_pull(
        shell,
        "rg",
        flags,
        "import os\nvisible = os.environ.get('CUDA_VISIBLE_DEVICES')\n",
        "visible",
    )
    # Ray gave the node's actor every GPU; each rank sees them and picks its own
    assert sorted(map(int, visible[0].split(","))) == list(range(gpus))
    assert totals == [gpus * (gpus + 1) / 2] * gpus
    assert backends == ["nccl"] * gpus
