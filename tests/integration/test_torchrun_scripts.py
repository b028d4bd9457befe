"""Training code people already have, run unchanged in a session's ranks: a torchrun script
under ``%run`` (twice in a row, resuming from its snapshot), its own ``init_process_group``
and ``destroy_process_group``, its argparse, and a crash under ``%run`` that must fail
the cell, not vanish."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.errors import RanksFailed
from jupyter_dist.rank.output_log import PART_BYTES, PARTS, read_output
from jupyter_dist.text import strip_ansi
from tests.conftest import CellOutput, session_status

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "torchrun_scripts"
SESSION = "scripts"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, shell: Any) -> Iterator[Path]:
    """A 2-rank session whose ranks work in a folder of their own (the snapshot goes there)."""
    folder = tmp_path_factory.mktemp("torchrun")
    result = shell.run_cell(
        f"%%distributed --session {SESSION} --procs 2\nimport os\nos.chdir({str(folder)!r})"
    )
    assert result.success, result.error_in_exec
    yield folder
    shell.run_line_magic("dist", f"shutdown --session {SESSION}")


def cell(run: Any, body: str) -> CellOutput:
    out: CellOutput = run(f"%%distributed --session {SESSION} --timeout 300\n{body}")
    return out


def test_the_ddp_tutorial_script_runs_unchanged_twice_in_a_row(run: Any, workdir: Path) -> None:
    script = SCRIPTS / "multigpu_torchrun.py"
    first = cell(run, f"%run {script} 2 1 --batch_size 64")
    assert first.ok, first.stdout + first.stderr
    for rank in (0, 1):  # both ranks trained both epochs: the script's argparse, its group
        for epoch in (0, 1):
            assert f"[GPU{rank}] Epoch {epoch} | Batchsize: 64 | Steps: 16" in first.stdout
    assert "Epoch 1 | Training snapshot saved at snapshot.pt" in first.stdout
    assert (workdir / "snapshot.pt").exists()
    # again, in the same ranks: its init_process_group after its destroy_process_group of
    # the first run, and the tutorial's resume from the snapshot rank 0 saved
    second = cell(run, f"%run {script} 3 1 --batch_size 64")
    assert second.ok, second.stdout + second.stderr
    assert "Resuming training from snapshot at Epoch 1" in second.stdout
    assert "[GPU0] Epoch 2 | Batchsize: 64" in second.stdout
    assert "[GPU1] Epoch 2 | Batchsize: 64" in second.stdout
    assert "Epoch 0 |" not in second.stdout  # resumed, not restarted


def test_argparse_in_a_cell_sees_no_arguments_not_the_agents(run: Any) -> None:
    """An entry point's argparse run in a cell (hydra, a main() with defaults) parses what a
    fresh interpreter has, where it used to meet the agent's ``--session ...``."""
    out = cell(
        run,
        "import argparse, sys\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, default=0.1)\n"
        "print('argv', sys.argv, parser.parse_args())",
    )
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] argv [''] Namespace(lr=0.1)" in out.stdout, out.stdout
    bad = cell(run, f"%run {SCRIPTS / 'multigpu_torchrun.py'} 1 1 --batch-size 8")
    assert isinstance(bad.error, RanksFailed)  # argparse's exit fails the cell, once
    assert "unrecognized arguments: --batch-size 8" in bad.stderr, bad.stderr


def test_a_crash_under_run_fails_the_cell_and_reaches_the_log(
    run: Any, workdir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import os\n"
        "def step():\n"
        "    raise RuntimeError(f'crashed on rank {os.environ[\"RANK\"]}')\n"
        "step()\n"
    )
    out = cell(run, f"%run {script}")
    assert isinstance(out.error, RanksFailed), out.stdout
    assert sorted(out.error.failed_ranks) == [0, 1]
    shown = strip_ansi("\n".join(out.error.failures[0].traceback))
    assert "RuntimeError: crashed on rank" in shown and "step()" in shown
    # the rank's output log, beside its process log (diagnostics) in the agent's folder
    process_log = Path(session_status(SESSION)["ranks"][1]["log"])
    log, _, _ = read_output(str(process_log.parent / "rank-1.out"), 0, PART_BYTES * PARTS)
    assert "RuntimeError: crashed on rank 1" in strip_ansi(log)
    assert cell(run, "print('still fine')").ok  # nothing else was harmed


def test_a_scripts_group_is_the_sessions_and_can_be_made_again(run: Any) -> None:
    out = cell(
        run,
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')  # what a torchrun script does first\n"
        "for round in range(3):\n"
        "    dist.destroy_process_group()\n"
        "    dist.init_process_group(backend='gloo')\n"
        "    t = torch.ones(1) * (dist.get_rank() + 1)\n"
        "    dist.all_reduce(t)\n"
        "    print('round', round, t.item())",
    )
    assert out.ok, out.stdout + out.stderr
    for round_ in range(3):
        assert f"[ranks 0-1] round {round_} 3.0" in out.stdout


def test_a_group_unlike_the_sessions_is_refused_with_what_differs(run: Any) -> None:
    out = cell(run, "import torch.distributed as dist\ndist.init_process_group('nccl')")
    assert isinstance(out.error, RanksFailed)
    text = strip_ansi(str(out.error.failures[0].evalue))
    assert re.search(r"asks for backend 'nccl' \(the session's group is 'gloo'\)", text), text
    assert "--backend" in text
