"""The same start, cells and stop on a real Kubernetes cluster, for a maintainer who has one
(opt-in: skipped unless ``JUPYTER_DIST_TEST_K8S_CONTEXT`` names a kubeconfig context).

    kind create cluster
    docker build -t jupyter-dist-test:dev -f - . <<'EOF'
    FROM python:3.11-slim
    COPY . /src
    RUN pip install torch==2.13.0 /src
    EOF
    kind load docker-image jupyter-dist-test:dev
    JUPYTER_DIST_TEST_K8S_CONTEXT=kind-kind \\
    JUPYTER_DIST_TEST_K8S_IMAGE=jupyter-dist-test:dev \\
    JUPYTER_DIST_TEST_K8S_CALLBACK=172.18.0.1 \\
        pytest -m k8s_cluster tests/k8s

``JUPYTER_DIST_TEST_K8S_CALLBACK`` is an address of this machine the pods can reach (for
kind, the docker network's gateway); ``JUPYTER_DIST_TEST_K8S_GPUS=N`` also runs an NCCL
all_reduce on N GPUs a pod (skipped without it). ``JUPYTER_DIST_TEST_K8S_NAMESPACE``
(default ``default``) must allow the README's Role.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import pytest

from jupyter_dist.common.ports import free_port
from tests.conftest import CellOutput
from tests.integration.rank_lines import with_start

CONTEXT = os.environ.get("JUPYTER_DIST_TEST_K8S_CONTEXT", "")
IMAGE = os.environ.get("JUPYTER_DIST_TEST_K8S_IMAGE", "")
CALLBACK = os.environ.get("JUPYTER_DIST_TEST_K8S_CALLBACK", "")
NAMESPACE = os.environ.get("JUPYTER_DIST_TEST_K8S_NAMESPACE", "default")
GPUS = int(os.environ.get("JUPYTER_DIST_TEST_K8S_GPUS", "0") or 0)

pytestmark = [
    pytest.mark.k8s_cluster,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (CONTEXT and IMAGE and CALLBACK),
        reason="a real cluster: set JUPYTER_DIST_TEST_K8S_CONTEXT, _IMAGE and _CALLBACK "
        "(see this module's docstring)",
    ),
]


def flags(extra: str) -> str:
    return (
        f"--k8s --context {CONTEXT} --namespace {NAMESPACE} --image {IMAGE} "
        f"--k8s-callback {CALLBACK}:{free_port()} --k8s-timeout 600 {extra}"
    )


def left_on_cluster(session: str) -> str:
    """What ``kubectl`` still lists of the session's Jobs, Secrets and pods."""
    out = subprocess.run(
        ["kubectl", "--context", CONTEXT, "-n", NAMESPACE, "get", "jobs,secrets,pods",
         "-l", f"jupyter-dist.io/session={session}", "-o", "name"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def wait_nothing_left(session: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while (left := left_on_cluster(session)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not left, f"left on the cluster: {left}"


def test_two_pods_run_gloo_keep_state_and_leave_nothing(
    run: Callable[[str], CellOutput],
) -> None:
    cell = (
        "import os, torch, torch.distributed as dist\n"
        "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
        "print('sum', int(t.item()), os.environ['MASTER_ADDR'])"
    )
    out = run(f"%%distributed {flags('--nodes 2 --procs 1')} --session kreal\n{cell}")
    try:
        assert out.result.success, out.stdout + out.stderr
        sums = {lines[0].split()[1] for lines in with_start(out.stdout, "sum ").values() if lines}
        assert sums == {"3"}, out.stdout
        again = run("%%distributed --session kreal\nprint('world', dist.get_world_size())")
        assert "world 2" in again.stdout
    finally:
        run("%dist shutdown --session kreal")
    wait_nothing_left("kreal")


@pytest.mark.skipif(not GPUS, reason="JUPYTER_DIST_TEST_K8S_GPUS is not set")
def test_nccl_across_gpu_pods(run: Callable[[str], CellOutput]) -> None:
    cell = (
        "import torch, torch.distributed as dist\n"
        "t = torch.ones(1, device='cuda') * (dist.get_rank() + 1); dist.all_reduce(t)\n"
        "print('nccl', dist.get_backend(), int(t.item()))"
    )
    out = run(f"%%distributed {flags(f'--nodes 2 --gpus {GPUS}')} --session kgpu\n{cell}")
    try:
        assert out.result.success, out.stdout + out.stderr
        world = 2 * GPUS
        assert f"nccl nccl {world * (world + 1) // 2}" in out.stdout, out.stdout
    finally:
        run("%dist shutdown --session kgpu")
    wait_nothing_left("kgpu")
