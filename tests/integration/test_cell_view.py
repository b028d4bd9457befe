"""The widget view of a cell, in a real notebook kernel: what each part shows after real
cells on 2 and 8 ranks (routing, folding, error chips, metrics, bounds, relayed widgets)."""

from __future__ import annotations

import html
import json
import queue
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from jupyter_dist.display.cell_view import LIVE_AFTER_S
from jupyter_dist.text import strip_ansi
from tests.conftest import rank_waits_for_file_cell, ready_client
from tests.integration.view_sampling import Sampled, run_sampled

pytestmark = pytest.mark.slow
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
STATE = (
    "import json as _j\n"
    "print('STATE', _j.dumps(get_ipython().magics_manager.registry['DistMagics']"
    ".last_view.state(), default=str))"
)


class Kernel:
    def __init__(self, km: KernelManager) -> None:
        self.km = km
        self.kc = ready_client(km, timeout=60)
        self.messages: list[dict[str, Any]] = []

    def run(self, code: str, timeout: float = 180) -> dict[str, Any]:
        self.messages = []
        reply = self.kc.execute_interactive(code, output_hook=self.messages.append, timeout=timeout)
        return dict(reply["content"])

    def state(self) -> dict[str, Any]:
        assert self.run(STATE)["status"] == "ok"
        text = "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream")
        line = next(t for t in text.splitlines() if t.startswith("STATE "))
        return dict(json.loads(line[6:]))

    def snapshot(self) -> dict[str, Any]:
        """What the cell's output ends as: its view's snapshot, shown at once by a cell that
        ended before the view went live, else put in place of the live view."""
        kinds = ("display_data", "update_display_data")
        shown = [m for m in self.messages if m["msg_type"] in kinds]
        last = [m for m in shown if WIDGET_MIME not in m["content"]["data"]][-1]
        return dict(last["content"]["data"])

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["msg_type"] == kind]


@pytest.fixture(scope="module")
def kernel(kernel_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(cwd=str(tmp_path_factory.mktemp("cell-view")))
    kernel = Kernel(km)
    assert kernel.run("%load_ext jupyter_dist")["status"] == "ok"
    yield kernel
    kernel.run("%dist shutdown --all")
    kernel.kc.stop_channels()
    km.shutdown_kernel(now=True)


def test_two_ranks_route_fold_chart_and_mark_the_failing_rank(kernel: Kernel) -> None:
    reply = kernel.run(
        "%%distributed --procs 2\n"
        "import sys, time, jupyter_dist, torch.distributed as dist\n"
        "me = dist.get_rank()\n"
        f"time.sleep({2 * LIVE_AFTER_S})  # the view goes live\n"
        "from IPython.display import HTML, display\n"
        "if me == 0:\n"
        "    display(HTML('<b>table of rank 0</b>'))\n"
        "for step in range(40):\n"
        "    jupyter_dist.log(loss=1 / (step + 1), lr=0.1)\n"
        "print('same on both')\n"
        "print('mine', me)\n"
        "print('careful', file=sys.stderr)\n"
        "if me == 1:\n"
        "    raise ValueError('rank one is unhappy')\n"
    )
    assert reply["status"] == "error" and reply["ename"] == "RanksFailed"
    # the view went out as a widget, and its final text/plain copy folds the ranks
    shown = kernel.of_type("display_data")[-1]["content"]["data"]
    assert "application/vnd.jupyter.widget-view+json" in shown
    final = kernel.of_type("update_display_data")[-1]["content"]["data"]["text/plain"]
    assert "[ranks 0-1] same on both" in final and "[rank 1] mine 1" in final
    assert "error on rank 1; done on rank 0" in final
    # ... and the aggregated error is still the cell's error
    assert kernel.of_type("error")[-1]["content"]["ename"] == "RanksFailed"

    state = kernel.state()
    assert state["chips"] == {"0": "done", "1": "error"}
    assert state["views"] == ["rank 0", "rank 1", "all ranks"]
    assert state["shown"] == "rank 1"  # the view turned to the rank that failed
    assert "mine 0" in state["lines"]["0"] and "mine 1" not in state["lines"]["0"]
    assert (
        "mine 1" in state["lines"]["1"]
        and "ValueError: rank one is unhappy" in (state["lines"]["1"])
    )
    assert "[ranks 0-1] same on both" in state["all"]
    assert "[ranks 0-1] careful" in state["all"]
    assert state["metrics"] == {"loss": {"0": 40, "1": 40}, "lr": {"0": 40, "1": 40}}
    # rich output shows in the view of the rank that made it, and only there
    assert state["rich"]["0"] == [["text/html", "text/plain"]]
    assert [kinds for kinds in state["rich"]["1"] if "text/html" in kinds] == []


def test_a_quick_cell_shows_its_snapshot_and_sends_no_widgets(kernel: Kernel) -> None:
    """A cell that ends before the view would go live (most cells) is shown once, as its
    snapshot: no widget is opened in the browser only to be closed again. One that also
    printed nothing and ran fine shows nothing, as a plain cell."""
    for code, shows in (("print('quick', 6 * 7)", True), ("x = 1", False)):
        for _ in range(3):  # a loaded machine may hold one cell past LIVE_AFTER_S
            assert kernel.run(f"%%distributed --procs 2\n{code}")["status"] == "ok"
            if not kernel.of_type("comm_open"):
                break
        assert kernel.of_type("comm_open") == [] and kernel.of_type("comm_close") == []
        displayed = [m["content"]["data"] for m in kernel.of_type("display_data")]
        if not shows:
            assert displayed == [] and kernel.of_type("update_display_data") == []
            assert kernel.state()["quiet"] is True
            continue
        [shown] = displayed
        assert WIDGET_MIME not in shown and "done on ranks 0-1" in shown["text/plain"]
        assert "[ranks 0-1] quick 42" in shown["text/plain"]
        assert 'class="jd-cell-view jd-snapshot"' in shown["text/html"]
        # it opens on every rank's output, each line with its rank, as text output shows
        assert '<details class="jd-snap-all" open>' in shown["text/html"]
        assert 'class="jd-snap-rank" data-rank="0" data-state="done" open' not in shown["text/html"]
        state = kernel.state()
        assert state["live"] is False and state["chips"] == {"0": "done", "1": "done"}
        assert state["shown"] == "all ranks"


TRACEBACK = "Traceback (most recent call last)"


@pytest.mark.parametrize("mode", ["text", "widget"])
def test_a_raising_ranks_traceback_reaches_the_notebook_once(kernel: Kernel, mode: str) -> None:
    """The traceback both ranks raised is shown once, with their output (after what they
    printed, with their rank label; in the all-ranks view and each rank's own); the cell's
    error names the failure and says where its traceback is, without printing it again."""
    reply = kernel.run(
        f"%%distributed --procs 2 --output {mode}\n"
        "print('before it')\n"
        "def f():\n"
        "    raise ValueError('told once')\n"
        "f()\n"
    )
    assert reply["status"] == "error" and reply["ename"] == "RanksFailed"
    error = strip_ansi("\n".join(reply["traceback"]))
    assert "ValueError: told once" in error and "(the traceback is above" in error
    assert TRACEBACK not in error and "raise ValueError" not in error, error
    if mode == "text":
        streams = strip_ansi("".join(m["content"]["text"] for m in kernel.of_type("stream")))
        # once for each rank: folded when both arrive together, else each under its label
        # (a loaded machine may hold one rank's back)
        labels = sorted(
            line.split("]")[0] + "]" for line in streams.splitlines() if TRACEBACK in line
        )
        assert labels in (["[ranks 0-1]"], ["[rank 0]", "[rank 1]"]), streams
        folded = labels == ["[ranks 0-1]"]
        if folded:
            assert "[ranks 0-1] ValueError: told once" in streams
        assert streams.index("before it") < streams.index(TRACEBACK)
        return
    snapshot = kernel.snapshot()
    text = snapshot["text/plain"]
    assert text.count(TRACEBACK) == 1, text
    assert "[ranks 0-1] ValueError: told once" in text
    # the HTML: once in the all-ranks block, once in each rank's own block
    blocks = snapshot["text/html"].split("<details")[1:]
    assert len(blocks) == 3 and 'class="jd-snap-all"' in blocks[0]
    for block in blocks:
        assert block.count(TRACEBACK) == 1, block
    assert "[ranks 0-1] ValueError: told once" in blocks[0]
    state = kernel.state()
    assert state["all"].count(TRACEBACK) == 1 and "[ranks 0-1] ----> 4 f()" in state["all"]
    for rank in ("0", "1"):
        assert state["lines"][rank].count(TRACEBACK) == 1


def test_a_rank_that_only_raised_has_its_traceback_in_its_log_after_a_restart(
    kernel: Kernel,
) -> None:
    """After ``%dist restart`` the ranks' variables are gone: a cell using one raises a
    NameError on every rank and prints nothing. Each rank's log holds its traceback, and
    the footer names the logs."""
    assert kernel.run("%%distributed --procs 2\nkept_here = 1")["status"] == "ok"
    assert kernel.run("%dist restart")["status"] == "ok"
    reply = kernel.run("%%distributed --procs 2\nkept_here")
    assert reply["status"] == "error" and reply["ename"] == "RanksFailed"
    state = kernel.state()
    logs = Path(state["logs"])
    assert f"logs: {logs}" in state["footer"], state["footer"]
    for rank in (0, 1):
        log = (logs / f"rank-{rank}.log").read_text()
        assert TRACEBACK in log and "NameError: name 'kept_here' is not defined" in log, log
        assert "\x1b[" not in log  # plain text, no colours
    # a rank that showed nothing still has its (empty) log in the folder the footer names
    assert (
        kernel.run("%%distributed --procs 2\nif dist.get_rank() == 1:\n    print('one')")["status"]
        == "error"
    )  # the restart lost `dist` too
    assert kernel.run("%%distributed --procs 2\nimport torch.distributed as dist")["status"] == "ok"
    reply = kernel.run("%%distributed --procs 2\nif dist.get_rank() == 1:\n    print('one')")
    assert reply["status"] == "ok"
    state = kernel.state()
    logs = Path(state["logs"])
    assert f"logs: {logs}" in state["footer"]
    assert (logs / "rank-0.log").read_text() == "" and (logs / "rank-1.log").read_text() == "one\n"
    # and when another rank failed: the silent rank's log is there, empty, beside the traceback
    reply = kernel.run(
        "%%distributed --procs 2\nif dist.get_rank() == 1:\n    raise ValueError('one')"
    )
    assert reply["status"] == "error"
    state = kernel.state()
    logs = Path(state["logs"])
    assert f"logs: {logs}" in state["footer"]
    assert (logs / "rank-0.log").read_text() == ""
    assert "ValueError: one" in (logs / "rank-1.log").read_text()


def test_a_display_updated_step_after_step_shows_its_last_state(kernel: Kernel) -> None:
    """As transformers' progress table is: ``display(HTML, display_id=True)``, then updates.
    The rank's view shows the last state, the text copy reads it as text."""
    reply = kernel.run(
        "%%distributed --procs 2\n"
        "from IPython.display import HTML, display\n"
        "handle = display(HTML('<p>step 0/3</p>'), display_id=True)\n"
        "for step in range(1, 4):\n"
        "    handle.update(HTML(f'<p>step {step}/3</p>'))\n"
    )
    assert reply["status"] == "ok", reply
    final = kernel.snapshot()["text/plain"]
    assert "IPython.core.display.HTML object" not in final, final
    assert "step 3/3" in final and "step 2/3" not in final, final
    state = kernel.state()
    assert "step 3/3" in state["lines"]["0"] and "step 0/3" not in state["lines"]["0"]
    assert state["rich"]["1"] == [["text/html", "text/plain"]]  # one output, updated


class RankZerosProgress:
    """Waits until the all-ranks view shows rank 0's live displays and they advanced there
    twice: a widget of rank 0 (tqdm's bar, an ipywidgets progress, rich's Output widget)
    drawn in the all-ranks view and not rank 1's, the line folding rank 1's under it, and
    after that two changes of what the widget shows (``progress``: the part that moves)."""

    def __init__(self, progress: Callable[[Sampled, str], object]) -> None:
        self.progress = progress
        self.widget = ""  # rank 0's, once the all-ranks view drew it
        self.states: list[object] = []  # what it showed from then on
        self.folded = ""

    def __call__(self, page: Sampled, _changed: object) -> bool:
        if not self.widget:
            ours, theirs = page.widgets_in(0), page.widgets_in(1)
            shown = [w for w in page.widgets_in(-1) if w in ours]
            if shown and not set(page.widgets_in(-1)) & set(theirs):
                self.widget = shown[0]
                self.folded = page.text_in(-1)
            return False
        state = self.progress(page, self.widget)
        if state is not None and state not in self.states:
            self.states.append(state)
        return len(self.states) >= 3  # as first drawn, then two changes

    def check(self, said: bool, rank_1_shows: bool = True) -> None:
        assert self.widget, "the all-ranks view never drew rank 0's live display"
        assert said, f"rank 0's display did not advance in the all-ranks view: {self.states}"
        folded = "[rank 1] live progress: in rank 1's own view" in self.folded
        assert folded == rank_1_shows, self.folded


def _bar_value(page: Sampled, box: str) -> object:
    """tqdm's bar is a box of an HTML, a progress and an HTML: its progress's value."""
    children = [c.removeprefix("IPY_MODEL_") for c in page.models[box].get("children", [])]
    bars = [page.models[c] for c in children if "Progress" in page.models[c]["_model_name"]]
    return bars[0].get("value") if bars else None


def _output_text(page: Sampled, widget: str) -> object:
    """What an Output widget (rich's live display) holds, as text."""
    outputs = page.models[widget].get("outputs") or []
    return "".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs) or None


def test_rank_0s_progress_is_live_in_the_all_ranks_view(kernel: Kernel, tmp_path: Path) -> None:
    """tqdm.auto's bar (a widget) and a table updated in place (transformers' notebook
    progress) on every rank: while the loop runs, the all-ranks view, where the cell view
    opens, draws rank 0's bar and rank 0's table, and the bar advances there; rank 1's are
    one line under them. Each rank's own view shows its own."""
    go = tmp_path / "go"
    code = (
        "%%distributed --procs 2\n"
        "import os, time\n"
        "from tqdm.auto import tqdm\n"
        "from IPython.display import HTML, display\n"
        "print('before the loop')\n"
        "handle = display(HTML('<p>step 0</p>'), display_id=True)\n"
        "bar = tqdm(total=1200, desc='epoch', mininterval=0)\n"
        "for step in range(1, 1201):  # slowly, until the test saw enough\n"
        "    handle.update(HTML(f'<p>step {step}</p>'))\n"
        "    bar.update(1)\n"
        f"    if os.path.exists({str(go)!r}):\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "bar.close()\n"
        "print('after the loop')\n"
    )
    waits = RankZerosProgress(_bar_value)
    reply, page, said = run_sampled(kernel.kc, code, waits, go)
    assert reply["status"] == "ok", reply
    waits.check(said)
    # the text a finished cell keeps: the bar's last state, not its first
    kernel.messages = page.messages
    final = kernel.snapshot()["text/plain"]
    assert "0/1200 [00:00<?" not in final, final  # its text/plain when first shown
    assert re.search(r"epoch: +\d+% \[#*-*\] \d+/1200", final), final
    state = kernel.state()
    assert state["live"]
    bar = [WIDGET_MIME, "text/plain"]
    for rank in ("0", "1"):
        assert state["rich"][rank] == [["text/html", "text/plain"], bar], state["rich"]
        assert "step 0\n" not in state["lines"][rank] + "\n"  # its table, updated
    widgets = state["widgets"]
    assert len(widgets["rank 0"]) == len(widgets["rank 1"]) == 1
    assert widgets["all ranks"] == widgets["rank 0"], widgets  # rank 0's bar, not rank 1's
    # rank 0's table and bar, and the line folding rank 1's
    assert sorted(state["all_rich"]) == sorted([["text/html", "text/plain"], ["text/plain"], bar])
    shown = state["all"]
    assert "[ranks 0-1] before the loop" in shown and "[ranks 0-1] after the loop" in shown
    assert shown.count("live progress") == 1, shown  # rank 1's folded into one line


LIGHTNING_MODEL = """\
import os, time, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Tiny(L.LightningModule):
    def __init__(self, go):
        super().__init__()
        self.go = go
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, _index):
        if not os.path.exists(self.go):  # slowly, until the test saw enough
            time.sleep(0.05)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(1200, 4), torch.randn(1200, 1))
"""


def test_lightnings_default_progress_bar_is_live_on_every_run(
    kernel: Kernel, tmp_path: Path
) -> None:
    """Lightning's default Trainer draws rich's progress bar (rich is installed): a rank
    is a notebook kernel to rich, whose live display is an Output widget the notebook side
    fills. While ``fit`` runs, rank 0's bar is in the all-ranks view and advances there,
    on the first run and on a second run in the same ranks."""
    pytest.importorskip("lightning")
    pytest.importorskip("rich")
    assert kernel.run("%%distributed --procs 2\n" + LIGHTNING_MODEL)["status"] == "ok"
    for run in (1, 2):
        go = tmp_path / f"go-{run}"
        code = (
            "%%distributed\n"
            "trainer = L.Trainer(accelerator='cpu', devices=2, strategy='ddp', max_epochs=1,\n"
            "                    logger=False, enable_checkpointing=False,\n"
            "                    enable_model_summary=False)\n"
            f"trainer.fit(Tiny({str(go)!r}), DataLoader(data, batch_size=2))\n"
            "print('bar', type(trainer.progress_bar_callback).__name__)\n"
        )
        waits = RankZerosProgress(_output_text)
        reply, page, said = run_sampled(kernel.kc, code, waits, go)
        assert reply["status"] == "ok", reply
        waits.check(said, rank_1_shows=False)  # Lightning draws its bar on rank 0 alone
        assert page.models[waits.widget]["_model_name"] == "OutputModel"
        assert all("Epoch 0" in str(s) for s in waits.states), waits.states
        # the finished cell keeps the bar's last frame, as text and in its snapshot
        kernel.messages = page.messages
        final = kernel.snapshot()
        assert "Epoch 0" in final["text/plain"] and "Epoch 0" in final["text/html"], final
        state = kernel.state()
        assert "[ranks 0-1] bar RichProgressBar" in state["all"], state["all"]
        assert state["widgets"]["rank 1"] == [], state["widgets"]  # Lightning draws on rank 0


def test_the_group_made_again_is_said_before_the_cells_output(kernel: Kernel) -> None:
    """A cell that destroyed the process group: the next cell's ranks say they made it
    again before its code runs, and the view says so above what the code printed."""
    gone = kernel.run(
        "%%distributed --procs 2\nimport torch.distributed as dist\ndist.destroy_process_group()"
    )
    assert gone["status"] == "ok", gone
    reply = kernel.run("%%distributed\nfor i in range(3):\n    print('line', i)")
    assert reply["status"] == "ok", reply
    shown = kernel.state()["all"].splitlines()
    made = [n for n, line in enumerate(shown) if "is made again" in line]
    assert made and made[0] < shown.index("[ranks 0-1] line 0"), shown


def test_output_is_bounded_and_the_full_log_is_on_disk(kernel: Kernel) -> None:
    reply = kernel.run("%%distributed --procs 2\nfor i in range(3000):\n    print('line', i)")
    assert reply["status"] == "ok"
    state = kernel.state()
    assert state["hidden"]["0"] >= 3000 - 400
    kept = state["lines"]["0"].splitlines()
    assert kept[-1] == "line 2999" and len(kept) <= 400
    logs = Path(state["logs"])
    assert str(logs) in state["footer"]
    assert (logs / "rank-0.log").read_text().count("\n") == 3000
    assert oct((logs / "rank-0.log").stat().st_mode & 0o777) == "0o600"


def test_eight_ranks_get_a_dropdown_and_one_folded_block(kernel: Kernel) -> None:
    reply = kernel.run(
        "%%distributed --procs 8 --session wide --no-init\n"
        "import jupyter_dist\nprint('hello from everyone')\n"
        "for s in range(5):\n    jupyter_dist.log(step=s * 10, acc=0.5)\n"
    )
    assert reply["status"] == "ok", reply
    state = kernel.state()
    assert state["chips"] == {str(r): "done" for r in range(8)}
    assert state["views"][-1] == "all ranks" and len(state["views"]) == 9
    assert "[ranks 0-7] hello from everyone" in state["all"]
    assert state["metrics"] == {"acc": {str(r): 5 for r in range(8)}}
    kernel.run("%dist shutdown --session wide")


def test_widgets_made_in_a_rank_are_relayed(kernel: Kernel) -> None:
    reply = kernel.run(
        "%%distributed --procs 2 --ranks 0\n"
        "from tqdm.auto import tqdm\nimport ipywidgets\n"
        "for _ in tqdm(range(3), desc='epoch'):\n    pass\n"
        "ipywidgets.IntSlider()\n"
    )
    assert reply["status"] == "ok", reply
    opened = [m["content"] for m in kernel.of_type("comm_open")]
    relayed = {c["data"]["state"].get("_model_name") for c in opened}
    assert {"FloatProgressModel", "IntSliderModel"} <= relayed
    # the whole message travels: the browser refuses a comm_open without the widget
    # protocol version in its metadata ("Wrong widget protocol version")
    for msg in kernel.of_type("comm_open"):
        if msg["content"].get("target_name") == "jupyter.widget":
            assert str(msg["metadata"].get("version", "")).startswith("2."), msg["metadata"]
    state = kernel.state()
    assert any("IntSlider widget" in n and "does not reach the rank" in n for n in state["notices"])


#: a bound only a hung cell reaches: 400 widget updates take about a second
WIDGET_BURST_GUARD_S = 60


@pytest.mark.parametrize(
    "also",
    [
        "",  # updates only: those a later one replaces may be left out
        "    bar.send({'step': i})\n",  # a custom message each step: every one is sent
    ],
    ids=["updates", "with-messages"],
)
def test_a_widget_set_in_a_tight_loop_ends_at_once_on_its_last_value(
    kernel: Kernel, also: str
) -> None:
    """Each rank sets a progress bar 400 times in a tight loop, printing every tenth step:
    the cell ends (it used to wait about 10 s for each acknowledgement of its output,
    minutes in all), and the bar the notebook side keeps and the one the browser holds
    are at the last value, the printed lines all there."""
    code = (
        "%%distributed --procs 2\n"
        "import ipywidgets as w\n"
        "bar = w.IntProgress(max=400)\n"
        "display(bar)\n"
        "for i in range(400):\n"
        "    bar.value = i\n"
        f"{also}"
        "    if i % 10 == 0:\n"
        "        print('step', i)\n"
    )
    try:
        reply = kernel.run(code, timeout=WIDGET_BURST_GUARD_S)
    except TimeoutError:
        pytest.fail(f"400 widget updates a rank: the cell did not end in {WIDGET_BURST_GUARD_S} s")
    assert reply["status"] == "ok", reply
    page = Sampled()  # the widget models as the browser builds them
    for msg in kernel.messages:
        page.take(msg)
    state = kernel.state()
    bars = {rank: state["widgets"][f"rank {rank}"] for rank in (0, 1)}
    assert all(len(ids) == 1 for ids in bars.values()), bars
    kept = kernel.run(  # each relayed model's last state, as the notebook side keeps it
        "import json as _j\n"
        "_view = get_ipython().magics_manager.registry['DistMagics'].last_view\n"
        "print('KEPT', _j.dumps({m: s.get('value') for m, s in _view.relay.states.items()}))"
    )
    assert kept["status"] == "ok", kept
    text = "".join(m["content"]["text"] for m in kernel.of_type("stream"))
    values = json.loads(next(t for t in text.splitlines() if t.startswith("KEPT "))[5:])
    for rank, (model,) in bars.items():
        assert page.models[model]["_model_name"] == "IntProgressModel", page.models[model]
        assert page.models[model]["value"] == 399, (rank, page.models[model])
        assert values[model] == 399, (rank, values)
        printed = state["lines"][str(rank)].split("\n")[-40:]
        assert printed == [f"step {i}" for i in range(0, 400, 10)], printed


def test_steady_output_is_drawn_while_the_cell_runs(kernel: Kernel) -> None:
    reply = kernel.run(
        "%%distributed --procs 2\nimport time\n"
        "for i in range(150):\n    print('tick', i, flush=True)\n    time.sleep(0.02)\n"
    )
    assert reply["status"] == "ok"
    # every redraw of a view is a comm_msg setting its outputs; a view that is redrawn
    # only at the end would show up here once or twice
    shown = [
        m["content"]["data"]["state"]["outputs"]
        for m in kernel.of_type("comm_msg")
        if "outputs" in m["content"]["data"].get("state", {})
    ]
    with_ticks = [o for o in shown if any("tick" in x.get("text", "") for x in o)]
    assert len(with_ticks) >= 6, len(with_ticks)


def test_the_stacks_button_answers_while_the_ranks_hang(kernel: Kernel, tmp_path: Path) -> None:
    """The click reaches the notebook kernel while it runs the cell (on its click subshell),
    and shows rank 0 blocked in all_reduce and rank 1 still in its cell."""
    go = tmp_path / "go"
    kc = kernel.kc
    msg_id = kc.execute(rank_waits_for_file_cell(go))
    try:
        shown = _click_stacks_until_both_are_in_place(kc, msg_id)
        # the cell was still running: rank 1 waits for the file, so nothing has replied
        assert not kc.shell_channel.msg_ready()
    finally:
        go.touch()
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "ok"
    # the view keeps what the last click showed
    assert html.unescape(kernel.state()["stacks"]) == shown


def _click_stacks_until_both_are_in_place(kc: Any, msg_id: str) -> str:
    """Click the cell's stacks button (again a second after each answer) until it shows
    rank 0 in all_reduce and rank 1 in its cell; return what it shows."""
    button = stacks_button = ""
    shown = ""
    answered_at: float | None = 0.0  # None: a click is not answered yet
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if button and answered_at is not None and time.monotonic() - answered_at > 1:
            answered_at = None
            click = {"method": "custom", "content": {"event": "click"}}
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": button, "data": click}))
        try:
            msg = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        content = msg["content"]
        state = content.get("data", {}).get("state", {})
        ours = msg["parent_header"].get("msg_id") == msg_id
        if msg["msg_type"] == "comm_open" and ours:
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "stacks":
                stacks_button = content["comm_id"]
        elif msg["msg_type"] == "display_data" and ours and WIDGET_MIME in content["data"]:
            button = stacks_button  # shown: a browser could click it now
        elif msg["msg_type"] == "comm_msg" and "where the ranks were" in str(state.get("value")):
            shown = html.unescape(state["value"])
            answered_at = time.monotonic()
            if "rank 0: in all_reduce" in shown and "rank 1: at cell line 4" in shown:
                break
    assert button, "the cell view has no stacks button"
    assert "rank 0: in all_reduce" in shown and "rank 1: at cell line 4" in shown, shown
    return shown
