"""notebooks/ray_cluster.ipynb, executed as CI runs every notebook, on the Ray test cluster:
its kernel runs in the head's namespace with the cluster's environment, as a notebook
kernel on a Ray head node does."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from tests.integration.test_notebooks import text_of

from .cluster import START_TIMEOUT, RayCluster
from .head_kernel import HEAD_KERNEL, TRANSPORT, head_kernelspecs, socket_prefix

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 420)]
NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "ray_cluster.ipynb"


def test_ray_notebook_runs_on_two_ray_nodes(
    ray_nodes: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in ray_nodes.env.items():  # the kernel's environment: a Ray driver's
        monkeypatch.setenv(key, value)
    km = AsyncKernelManager(
        kernel_name=HEAD_KERNEL,
        kernel_spec_manager=head_kernelspecs(ray_nodes, tmp_path),
        transport=TRANSPORT,
        ip=socket_prefix(tmp_path),
    )
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, km=km, timeout=300, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / NOTEBOOK.name)  # as it ran, to look at
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    text = text_of(nb)
    addresses = ray_nodes.network.addresses
    # the default STRICT_SPREAD puts the session's two nodes on two machines
    node_of: dict[int, tuple[int, str]] = {}
    for rank in range(4):
        found = re.search(
            rf"\[rank {rank}\] rank {rank}: node (\d) at ([\d.]+), all_reduce 10", text
        )
        assert found, text
        node_of[rank] = (int(found[1]), found[2])
        assert found[2] in addresses, text
        assert f"[rank {rank}] rank {rank} still on {found[2]}" in text, text
    assert node_of[0] == node_of[1] and node_of[2] == node_of[3], node_of
    assert (node_of[0][0], node_of[2][0]) == (0, 1), node_of
    assert node_of[0][1] != node_of[2][1], node_of
    for rank in range(4):
        assert re.search(
            rf"\[rank {rank}\] rank {rank}: loss [\d.]+, same weights on every rank: True", text
        ), text
    status = next(
        "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in c.outputs)
        for c in nb.cells
        if c.cell_type == "code" and c.source.startswith("%dist status")
    )
    for rank, (node, address) in node_of.items():  # the rank table: rank, node · address
        assert re.search(rf"^ *{rank} +{node} · {re.escape(address)} ", status, re.M), status
    assert "ray_demo" in status, status
