"""Whole notebooks executed headless by nbclient, as nbconvert and CI run them."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.integration.rank_lines import by_rank, with_start

pytestmark = pytest.mark.slow
NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))
#: need a cluster: multi_node against the test suite's sshd nodes (tests/multinode),
#: ray_cluster against its Ray cluster with the kernel on the head node (tests/ray)
ON_NODES = {"multi_node.ipynb", "ray_cluster.ipynb"}
#: run once each, by a test of their own below that reads their outputs, and checked
#: there as `test_demo_notebook_runs` checks the others (`run_demo`)
DEDICATED = {
    "mingpt_ddp.ipynb",
    "observability.ipynb",
    "quickstart.ipynb",
    "hugging_face.ipynb",
    "lightning.ipynb",
}
HERE = [p for p in NOTEBOOKS if p.name not in ON_NODES | DEDICATED]


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


def expected_to_fail(cell: nbformat.NotebookNode) -> bool:
    """A cell whose error is the point (tagged as nbclient knows it)."""
    return "raises-exception" in cell.get("metadata", {}).get("tags", [])


def run_demo(path: Path, kernel_name: str) -> nbformat.NotebookNode:
    """The demo notebook ``path``, executed in its folder, its outputs in it; an error
    only in each cell tagged to raise one."""
    nb = execute(nbformat.read(path, as_version=4), kernel_name, path.parent)
    for cell in nb.cells:
        kinds = {o.output_type for o in cell.get("outputs", [])}
        assert ("error" in kinds) == expected_to_fail(cell), cell.source
    return nb


def demo(name: str) -> Path:
    path = Path(__file__).parents[2] / "notebooks" / name
    assert name in DEDICATED, f"{name} is run by test_demo_notebook_runs too"
    return path


def test_every_notebook_is_executed_somewhere() -> None:
    assert len(NOTEBOOKS) >= 8, [p.name for p in NOTEBOOKS]
    assert {p.name for p in NOTEBOOKS} >= ON_NODES | DEDICATED


@pytest.mark.parametrize("path", HERE, ids=[p.name for p in HERE])
def test_demo_notebook_runs(path: Path, kernel_name: str) -> None:
    run_demo(path, kernel_name)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebooks_are_kept_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (path.name, cell.source)


def test_mingpt_resumes_from_its_snapshot_with_identical_weights(kernel_name: str) -> None:
    text = text_of(run_demo(demo("mingpt_ddp.ipynb"), kernel_name))
    assert "[ranks 0-1] False" in text  # the restart left no variables
    assert "resumed after 2 epochs" in text
    assert "identical weights after the restart: True" in text
    assert "[rank 0] epoch 2: loss" in text


def test_the_hang_is_found_in_all_reduce(kernel_name: str) -> None:
    nb = run_demo(demo("observability.ipynb"), kernel_name)
    failed = [c for c in nb.cells if expected_to_fail(c)]
    (error,) = [o for o in failed[0].outputs if o.output_type == "error"]
    assert error.ename == "CellTimeout"
    shown = "\n".join(error.traceback)
    assert "ranks 0-1: in all_reduce" in shown, shown
    said = " ".join(error.evalue.split())  # ranks 0-1 freed: every rank keeps its variables
    assert "Ranks 0-1 were blocked in a collective the other ranks were not in" in said, said
    assert "Every rank kept its variables" in said and "replaced" not in said, said


def test_quickstart_outputs(kernel_name: str) -> None:
    text = text_of(run_demo(demo("quickstart.ipynb"), kernel_name))
    assert "[ranks 0-1] all_reduce: 3.0" in text
    assert "[rank 0] rank 0 of 2" in text
    assert "[rank 1] rank 1 of 2" in text
    assert "ranks agree: True" in text
    assert "rank 1 got lr=0.01, and still has 256 rows" in text  # pushed, one rank only
    assert "[rank 0] rank 0 got lr" not in text
    assert "[ranks 0-1] still here: torch.Size([1, 4])" in text  # the failure lost nothing
    assert "[ranks 0-1] False True 2" in text  # restarted: fresh ranks, a process group


def test_hugging_face_sees_the_session(kernel_name: str) -> None:
    text = text_of(run_demo(demo("hugging_face.ipynb"), kernel_name))
    assert "[rank 1] process 1 of 2, DistributedType.MULTI_CPU, ACCELERATE_USE_CPU=1" in text
    assert "[rank 0] rank 0: DistributedDataParallel, 8 of the 16 batches" in text
    assert "[rank 1] rank 1: world size 2, parallel mode DISTRIBUTED" in text
    assert "model wrapped as DistributedDataParallel" in text
    assert "[ranks 0-1] same weights on every rank: True" in text


def test_lightning_trains_again_and_resumes_after_a_restart(kernel_name: str) -> None:
    pytest.importorskip("lightning")
    text = text_of(run_demo(demo("lightning.ipynb"), kernel_name))
    lines = by_rank(text)
    for rank in (0, 1):
        assert "DDPStrategy over 2 ranks, 24 steps on this rank" in lines[rank], text
        assert "the session's group is still there: all_reduce gives 2" in lines[rank], text
    weights = with_start(text, "weights [")  # after the second fit, then after the restart
    assert weights[0][-2:] == weights[1][-2:], text
    saved, loaded = weights[0][-2:]
    assert saved == loaded, text


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
