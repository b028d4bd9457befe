"""The multi-node notebook, executed as CI runs every notebook, on the two sshd nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.integration.test_notebooks import execute, text_of

pytestmark = pytest.mark.slow
NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "multi_node.ipynb"


def test_multi_node_notebook_runs_on_two_nodes(
    cluster: Any, kernel_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the notebook's first cell reads its nodes from these (the kernel inherits them)
    monkeypatch.setenv("EXAMPLE_HOSTS", ",".join(cluster.hosts))
    monkeypatch.setenv("EXAMPLE_SSH_CONFIG", str(cluster.config_path))
    nb = execute(nbformat.read(NOTEBOOK, as_version=4), kernel_name, NOTEBOOK.parent)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    text = text_of(nb)
    assert "[rank 0] rank 0: node 0 (node0), local rank 0, all_reduce 10" in text
    assert "[rank 3] rank 3: node 1 (node1), local rank 1, all_reduce 10" in text
    assert "[rank 1] rank 1 of 3 on node0: local rank 1 of 2" in text
    assert "[rank 2] rank 2 of 3 on node1: local rank 0 of 1" in text
    assert not (NOTEBOOK.parent / "hostfile").exists()  # the notebook cleans up
