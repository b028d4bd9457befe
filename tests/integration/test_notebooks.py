"""Whole notebooks executed headless by nbclient, as nbconvert and CI run them."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

pytestmark = pytest.mark.slow
NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def execute(nb: nbformat.NotebookNode, kernel_name: str, cwd: Path) -> nbformat.NotebookNode:
    client = NotebookClient(
        nb, kernel_name=kernel_name, timeout=300, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return nb


def text_of(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_demo_notebook_runs(path: Path, kernel_name: str) -> None:
    nb = execute(nbformat.read(path, as_version=4), kernel_name, path.parent)
    assert "error" not in {o.output_type for c in nb.cells for o in c.get("outputs", [])}


def test_quickstart_outputs(kernel_name: str) -> None:
    path = Path(__file__).parents[2] / "notebooks" / "quickstart.ipynb"
    text = text_of(execute(nbformat.read(path, as_version=4), kernel_name, path.parent))
    assert "[ranks 0-1] all_reduce: 3.0" in text
    assert "[rank 0] rank 0 of 2" in text
    assert "[rank 1] rank 1 of 2" in text
    assert "ranks agree: True" in text


def test_a_failing_rank_fails_the_notebook(kernel_name: str, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext jupyter_dist"),
        nbformat.v4.new_code_cell(
            "%%distributed --procs 2\nimport os\n"
            "if os.environ['RANK'] == '1':\n    raise KeyError('missing on rank one')"
        ),
        nbformat.v4.new_code_cell("print('not reached')"),
    ]
    with pytest.raises(CellExecutionError) as info:
        execute(nb, kernel_name, tmp_path)
    assert "RanksFailed" in str(info.value)
    assert "missing on rank one" in str(info.value)
    assert "not reached" not in text_of(nb)
