"""PyTorch Lightning in a cell, unchanged, uses the session's ranks as under torchrun.

``Trainer(strategy="ddp")`` (and ``"auto"`` with ``devices=N``) trains with every rank as
one DDP job: the ranks' weights agree after ``fit`` (DDP averaged their gradients while
each saw its own shard of the data); ``fit``, ``validate`` and ``test`` run again in the
same ranks, the session's process group still serves a plain collective afterwards, and a
checkpoint rank 0 saved loads in the fresh ranks of ``%dist restart``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CellOutput, started_session
from tests.integration.rank_lines import by_rank, with_start

pytestmark = pytest.mark.slow

MODEL = """\
import os, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def _loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def training_step(self, batch, _index):
        return self._loss(batch)

    def validation_step(self, batch, _index):
        self.log('val_loss', self._loss(batch), sync_dist=True)

    def test_step(self, batch, _index):
        self.log('test_loss', self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
loader = DataLoader(data, batch_size=8)
"""

FIT = """\
torch.manual_seed(int(os.environ['RANK']))  # each rank its own initial weights
model = Tiny()
trainer = L.Trainer(accelerator='cpu', devices=2, strategy={strategy!r}, max_epochs=2,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir={root!r})
trainer.fit(model, loader, loader)
val = trainer.validate(model, loader, verbose=False)[0]['val_loss']
test = trainer.test(model, loader, verbose=False)[0]['test_loss']
print('strategy', type(trainer.strategy).__name__, 'world', trainer.world_size,
      'steps', trainer.global_step)
print('weights', [round(v, 5) for v in model.layer.weight.flatten().tolist()])
print('val equals test', round(val, 5) == round(test, 5))
"""

ALL_REDUCE = """\
import torch, torch.distributed as dist
t = torch.ones(1)
dist.all_reduce(t)
print('sum', t.item(), dist.get_backend())
"""


@pytest.fixture(scope="module")
def lightning_session(shell: Any) -> Iterator[str]:
    pytest.importorskip("lightning")
    yield from started_session(shell, "lightning")


def cell(run: Any, name: str, body: str) -> CellOutput:
    out: CellOutput = run(f"%%distributed --session {name} --timeout 300\n{body}")
    assert out.ok, out.stdout + out.stderr
    return out


def weights(out: CellOutput) -> str:
    """The weights every rank printed, the same on all (DDP kept them in step)."""
    printed = with_start(out.stdout, "weights [")
    assert sorted(printed) == [0, 1], out.stdout
    assert len(printed[0]) == 1 and printed[0] == printed[1], out.stdout
    return printed[0][0].removeprefix("weights ")


def said_by_both(out: CellOutput, line: str) -> bool:
    """Both ranks printed ``line`` (folded into one or not)."""
    return (
        all(line in lines for lines in by_rank(out.stdout).values())
        and len(by_rank(out.stdout)) == 2
    )


@pytest.mark.parametrize("strategy", ["ddp", "auto"])
def test_fit_validate_test_twice_in_the_same_ranks(
    run: Any, lightning_session: str, tmp_path: Path, strategy: str
) -> None:
    cell(run, lightning_session, MODEL)
    fit = FIT.format(strategy=strategy, root=str(tmp_path))
    for _ in range(2):  # a notebook's second run behaves as its first
        out = cell(run, lightning_session, fit)
        # 64 samples, 2 ranks, batches of 8: 4 steps an epoch on each rank
        assert said_by_both(out, "strategy DDPStrategy world 2 steps 8"), out.stdout
        weights(out)  # both ranks ended with the same weights: DDP kept them in step
        assert said_by_both(out, "val equals test True"), out.stdout
        after = cell(run, lightning_session, ALL_REDUCE)  # the session's group is still there
        assert said_by_both(after, "sum 2.0 gloo"), after.stdout


def test_a_checkpoint_saved_on_rank_0_loads_after_a_restart(
    shell: Any, run: Any, lightning_session: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "tiny.ckpt")
    cell(run, lightning_session, MODEL)
    trained = cell(
        run,
        lightning_session,
        FIT.format(strategy="ddp", root=str(tmp_path)) + f"trainer.save_checkpoint({path!r})\n",
    )
    saved = weights(trained)
    assert Path(path).is_file()
    shell.run_line_magic("dist", f"restart --session {lightning_session}")
    cell(run, lightning_session, MODEL)
    loaded = cell(
        run,
        lightning_session,
        f"model = Tiny.load_from_checkpoint({path!r})\n"
        "print('weights', [round(v, 5) for v in model.layer.weight.flatten().tolist()])\n"
        + FIT.format(strategy="ddp", root=str(tmp_path)),
    )
    printed = with_start(loaded.stdout, "weights [")
    assert printed[0][0] == printed[1][0] == f"weights {saved}", loaded.stdout
    assert said_by_both(loaded, "strategy DDPStrategy world 2 steps 8"), loaded.stdout


def test_the_default_progress_bar_draws_no_cursor_movements(
    run: Any, lightning_session: str, tmp_path: Path
) -> None:
    """With rich installed (transformers brings it), Lightning's default progress bar is
    rich's. A rank's output is not a terminal: the bar is written once, finished, never
    redrawn frame by frame with cursor movements the cell and its logs would show."""
    pytest.importorskip("rich")
    cell(run, lightning_session, MODEL)
    out = cell(
        run,
        lightning_session,
        "trainer = L.Trainer(accelerator='cpu', devices=2, strategy='ddp', max_epochs=2,\n"
        f"    logger=False, enable_checkpointing=False, default_root_dir={str(tmp_path)!r})\n"
        "print('bar', type(trainer.progress_bar_callback).__name__)\n"
        "trainer.fit(Tiny(), loader)",
    )
    assert said_by_both(out, "bar RichProgressBar"), out.stdout
    text = out.stdout + out.stderr
    for movement in ("\x1b[?25l", "\x1b[2K", "\x1b[1A", "\r"):
        assert movement not in text, repr(text[-2000:])
    assert "Epoch 1" in text, text  # the finished bar is shown
