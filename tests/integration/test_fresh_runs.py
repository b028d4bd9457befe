"""The same training code run twice in the same ranks behaves the second time as the first,
as two fresh launches would: a group destroyed by a cell is there again for the next one
(said once in its output), accelerate's cached state follows it, a script's own
``init_process_group(device_id=...)`` gets the same answer both times (a fresh launch's),
and the session's status tells the group as the ranks have it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_dist.common.ports import free_port
from jupyter_dist.display.status_table import group_summary
from jupyter_dist.errors import RanksFailed
from jupyter_dist.text import strip_ansi
from tests.conftest import CellOutput, session_status

pytestmark = pytest.mark.slow

SESSION = "fresh"
MADE_AGAIN = "the process group an earlier cell destroyed is made again (gloo, world size 2)"


@pytest.fixture(scope="module")
def fresh(shell: Any) -> Iterator[str]:
    result = shell.run_cell(f"%%distributed --session {SESSION} --procs 2\npass")
    assert result.success, result.error_in_exec
    yield SESSION
    shell.run_line_magic("dist", f"shutdown --session {SESSION}")


def cell(run: Any, body: str, flags: str = "") -> CellOutput:
    out: CellOutput = run(f"%%distributed --session {SESSION} --timeout 300 {flags}\n{body}")
    return out


def said(out: CellOutput) -> str:
    return strip_ansi(out.stdout + out.stderr)


def on_both(out: CellOutput, text: str) -> bool:
    """Both ranks printed ``text`` (folded into one line, or one line each)."""
    lines = out.stdout.splitlines()
    return f"[ranks 0-1] {text}" in lines or all(f"[rank {r}] {text}" in lines for r in (0, 1))


ACCELERATE_LOOP = """\
import torch
from accelerate import Accelerator
torch.manual_seed(0)
acc = Accelerator()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
model, opt, data = acc.prepare(model, opt, data)
for x, y in data:
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
seen = acc.gather(torch.ones(1)).sum().item()
print('trained', acc.distributed_type, acc.num_processes, seen, type(model).__name__)
acc.end_training()
"""


def test_accelerate_loop_with_end_training_runs_twice(run: Any, fresh: str) -> None:
    pytest.importorskip("accelerate")
    first = cell(run, ACCELERATE_LOOP)
    assert first.ok, said(first)
    trained = "trained DistributedType.MULTI_CPU 2 2.0 DistributedDataParallel"
    assert f"[ranks 0-1] {trained}" in first.stdout, said(first)
    assert MADE_AGAIN not in said(first)  # the session's own group: nothing to say
    second = cell(run, ACCELERATE_LOOP)  # after end_training() destroyed the group
    assert second.ok, said(second)
    assert f"[ranks 0-1] {trained}" in second.stdout, said(second)
    assert said(second).count(MADE_AGAIN) == 1, said(second)  # once, for both ranks
    # as in a fresh launch, the next run may choose what the last one did not
    other = cell(
        run,
        "from accelerate import Accelerator\n"
        "acc = Accelerator(mixed_precision='bf16')\n"
        "print('precision', acc.mixed_precision, acc.num_processes)\n"
        "acc.end_training()",
    )
    assert other.ok, said(other)
    assert "[ranks 0-1] precision bf16 2" in other.stdout, said(other)
    assert said(other).count("is set aside for this one's arguments") == 1, said(other)


FSDP2_START = """\
import torch, torch.distributed as dist
device = torch.device('cpu')  # pytorch/examples' FSDP2 example.py without a GPU
dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
print('joined')
dist.destroy_process_group()
"""


def fresh_launch_answer(tmp_path: Any) -> str:
    """What one process started as torchrun starts it says to ``FSDP2_START``."""
    script = tmp_path / "fresh_launch.py"
    script.write_text(
        "try:\n" + "".join(f"    {line}\n" for line in FSDP2_START.splitlines()) + ""
        "except ValueError as err:\n    print('refused:', err)\n"
    )
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1")))
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "refused:" in done.stdout, done.stdout + done.stderr
    return done.stdout.split("refused:", 1)[1].strip()


def test_an_fsdp2_script_passing_device_id_gets_a_fresh_launchs_answer_every_run(
    run: Any, fresh: str, tmp_path: Any
) -> None:
    torch_says = fresh_launch_answer(tmp_path)
    answers = []
    for _ in range(2):
        out = cell(run, FSDP2_START)
        assert isinstance(out.error, RanksFailed), said(out)  # as under torchrun, run 1 too
        assert "joined" not in out.stdout
        failure = out.error.failures[0]
        assert sorted(out.error.failed_ranks) == [0, 1]
        assert failure.ename == "ValueError", failure
        answers.append(strip_ansi(str(failure.evalue)))
    assert answers[0] == answers[1], answers
    assert torch_says in answers[0], (torch_says, answers[0])  # torch's own words, quoted
    assert "device_id=device(type='cpu')" in answers[0] and "leave device_id out" in answers[0]
    # with the group gone first, the group made anew gets the same answer
    destroy = "import torch.distributed as dist\ndist.destroy_process_group()\n"
    gone = cell(run, destroy + FSDP2_START)
    assert isinstance(gone.error, RanksFailed)
    assert strip_ansi(str(gone.error.failures[0].evalue)) == answers[0]
    # and without device_id the script runs, twice
    for _ in range(2):
        plain = cell(run, FSDP2_START.replace(", device_id=device", ""))
        assert plain.ok, said(plain)
        assert "[ranks 0-1] joined" in plain.stdout


SCRIPT_THAT_DESTROYS = """\
import torch, torch.distributed as dist
dist.init_process_group('gloo')
t = torch.ones(1)
dist.all_reduce(t)
print('script', t.item())
dist.destroy_process_group()
"""
ALL_REDUCE = """\
import torch, torch.distributed as dist
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print('sum', t.item())
"""


def test_a_plain_cell_after_a_script_that_destroys_the_group(run: Any, fresh: str) -> None:
    for _ in range(2):
        script = cell(run, SCRIPT_THAT_DESTROYS)
        assert script.ok, said(script)
        assert "[ranks 0-1] script 2.0" in script.stdout
        status = session_status(fresh)
        assert [r["group"] for r in status["ranks"]] == ["", ""]  # as the ranks have it
        summary = group_summary(status)
        assert summary.startswith("none: a cell destroyed it"), summary
        shown = run("%dist status")  # what the user reads
        assert "none: a cell destroyed it" in shown.stdout, shown.stdout
        plain = cell(run, ALL_REDUCE)
        assert plain.ok, said(plain)
        assert "[ranks 0-1] sum 3.0" in plain.stdout
        assert said(plain).count(MADE_AGAIN) == 1, said(plain)
        assert group_summary(session_status(fresh)) == "gloo"
        assert "a cell destroyed it" not in run("%dist status").stdout


def test_a_cell_on_some_ranks_leaves_the_group_to_the_next_cell_on_all(
    run: Any, fresh: str
) -> None:
    gone = cell(run, "import torch.distributed as dist\ndist.destroy_process_group()")
    assert gone.ok, said(gone)
    has = "import torch.distributed as dist\nprint('has', dist.is_initialized())"
    some = cell(run, has, "--ranks 0")
    assert some.ok, said(some)  # no wait for a rank that does not run the cell
    assert "[rank 0] has False" in some.stdout, said(some)
    assert "the next cell run on all of them makes it again" in said(some)
    summary = group_summary(session_status(fresh))
    assert summary.startswith("none"), summary
    back = cell(run, ALL_REDUCE)
    assert back.ok and "[ranks 0-1] sum 3.0" in back.stdout, said(back)


TRAINING_ARGUMENTS = """\
import tempfile
from transformers import TrainingArguments
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=4,
                         report_to='none', disable_tqdm=True, save_strategy='no', use_cpu=True)
"""
TRAINER_RUN = """\
import torch
from transformers import Trainer

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {'loss': torch.nn.functional.mse_loss(self.layer(x), labels)}

rows = [{'x': torch.randn(4), 'labels': torch.randn(1)} for _ in range(16)]
trainer = Trainer(model=Tiny(), args=args, train_dataset=rows)
result = trainer.train()
print('steps', result.global_step, args.world_size, type(trainer.model_wrapped).__name__)
trainer.end()  # accelerate's end_training(): the group is destroyed
"""


def test_a_trainer_run_twice_with_the_same_training_arguments(run: Any, fresh: str) -> None:
    pytest.importorskip("transformers")
    made = cell(run, TRAINING_ARGUMENTS)
    assert made.ok, said(made)
    for _ in range(2):
        out = cell(run, TRAINER_RUN)
        assert out.ok, said(out)
        assert on_both(out, "steps 2 2 DistributedDataParallel"), said(out)
    # a Trainer made before trains again after its end(), as notebooks re-run cells
    again = cell(run, "result = trainer.train()\nprint('again', result.global_step)\ntrainer.end()")
    assert again.ok, said(again)
    assert on_both(again, "again 2"), said(again)
    # the arguments made before still describe the ranks, and the group is there
    after = cell(run, "print('world', args.world_size, args.process_index)\n" + ALL_REDUCE)
    assert after.ok, said(after)
    assert "[rank 0] world 2 0" in after.stdout and "[rank 1] world 2 1" in after.stdout
    assert "[ranks 0-1] sum 3.0" in after.stdout
