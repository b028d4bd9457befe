"""A rank killed in a training session: recovery against a restart and a checkpoint.

    .venv/bin/python bench/recovery.py                     # 4 ranks, ~25 M parameters, 3 repeats
    .venv/bin/python bench/recovery.py --ranks 2 --params 10e6 --repeats 5
    .venv/bin/python bench/recovery.py --steps 30 --every 20 --lost-steps 10

In a real notebook kernel (`notebook_kernel.NotebookKernel`, as in bench/run.py), one
session of ``--ranks`` local CPU ranks (gloo) trains an MLP of about ``--params``
parameters with DDP and SGD with momentum on synthetic data for ``--steps`` steps, rank 0
saving a checkpoint (``torch.save`` of the model's and the optimizer's ``state_dict``)
every ``--every`` steps, the last step included, so a restart loses no step (with
``--lost-steps L`` the last checkpoint is of the step L before the kill: a fault costs a
restart what was trained since, half a checkpoint interval on average). Then rank 1
is killed (SIGKILL, by its pid from the session's status) and the session brought back
to training, one of two ways:

* **A, recovery** (jupyter_dist's): the next cell on all ranks, which replaces rank 1
  alone and regroups every rank before it runs, re-runs the imports and definitions;
  ``%dist sync model,opt --from 0`` copies the model and the optimizer (momentum
  included) to the other ranks; a cell rebuilds DDP and runs one training step.
* **B, restart + checkpoint** (what people do today): ``%dist restart`` (every rank
  fresh), a cell with the imports and definitions, a cell that builds the model and the
  optimizer and loads the checkpoint on every rank (``torch.load`` + ``load_state_dict``),
  a cell that rebuilds DDP and runs one training step (after training again the
  ``--lost-steps`` since the checkpoint, to be back at the step the run was at).

Each is timed from the kill to the end of that step (the request sent to reply and idle,
as a notebook sees a cell), with its parts: the kill noticed (the session DEGRADED), then
each cell. Both start from the same weights and momentum (the checkpoint is of the last
step) and run the same step, so the weights after it must be the same on every rank and
in both paths: a checksum of the weights (and of the momentum) is compared and printed.
The paths alternate (A, B, A, B, ...) ``--repeats`` times, each after a fresh training
run; the table gives medians, min-max and A / B. Target: A at most 0.3x B.

Prints a markdown table and writes bench/results/recovery-<time>.json with every sample,
the settings and the CPU other processes used meanwhile (`noise.ForeignLoad`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noise import ForeignLoad
from notebook_kernel import CellResult, NotebookKernel, notebook_kernel

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SESSION = "recovery"
CELL_TIMEOUT_S = 600.0
DETECT_TIMEOUT_S = 60.0
TARGET = 0.3
HIDDEN_LAYERS = 4
OUTPUTS = 10
BATCH = 32
KILLED_RANK = 1
#: what rank 0 prints for this script to read: ``@@ key=value key=value``
MARK = re.compile(r"@@ (.*)$", re.MULTILINE)

DEFS = """\
import os, time, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

CKPT = {ckpt!r}
WIDTH, LAYERS, OUTPUTS, BATCH = {width}, {layers}, {outputs}, {batch}

def net():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, OUTPUTS))

def optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

def batch(step):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, OUTPUTS, (BATCH,), generator=g)

def train(ddp, opt, steps):
    for step in steps:
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

def save(model, opt, step):
    if dist.get_rank() == 0:
        torch.save({{"model": model.state_dict(), "opt": opt.state_dict(), "step": step}},
                   CKPT + ".tmp")
        os.replace(CKPT + ".tmp", CKPT)
    dist.barrier()
"""

TRAIN = """\
model = net(); opt = optimizer(model); ddp = DDP(model)
step_s, save_s = [], []
for step in range({steps}):
    t0 = time.perf_counter(); train(ddp, opt, [step]); step_s.append(time.perf_counter() - t0)
    if (step + 1) % {every} == 0 and step + 1 <= {last_save} or step + 1 == {last_save}:
        t0 = time.perf_counter(); save(model, opt, step + 1)
        save_s.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print("@@ params=%d step_s=%.4f save_s=%.4f threads=%d" % (
        sum(p.numel() for p in model.parameters()), sorted(step_s)[len(step_s) // 2],
        sorted(save_s)[len(save_s) // 2], torch.get_num_threads()))
"""

LOAD = """\
model = net(); opt = optimizer(model)
state = torch.load(CKPT, map_location="cpu", weights_only=True)
model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
del state
"""

STEP = """\
import sys as _sys
_t = [float("torch._dynamo" in _sys.modules), time.perf_counter()]
ddp = DDP(model)
_t.append(time.perf_counter())
train(ddp, opt, range({first}, {step} + 1))
_t.append(time.perf_counter())
_t = torch.tensor([_t[0], _t[2] - _t[1], _t[3] - _t[2]], dtype=torch.float64)
_all = [torch.zeros_like(_t) for _ in range(dist.get_world_size())]
dist.all_gather(_all, _t)
if dist.get_rank() == 0:
    print("@@ warm=%s ddp_s=%s step_s=%s" % tuple(
        ",".join("%.3f" % t[i].item() for t in _all) for i in range(3)))
del _sys, _t, _all
"""

CHECK = """\
def _sums():
    w = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    m = torch.cat([opt.state[p]["momentum_buffer"].flatten() for p in model.parameters()])
    return torch.tensor([w.sum().item(), (w * w).sum().item(), m.double().abs().sum().item()])
_mine = _sums(); _all = [torch.zeros_like(_mine) for _ in range(dist.get_world_size())]
dist.all_gather(_all, _mine)
if dist.get_rank() == 0:
    print("@@ agree=%s checksum=%.17g,%.17g,%.17g" % (
        all(torch.equal(_all[0], t) for t in _all), *_mine.tolist()))
del _sums, _mine, _all
"""

STATUS = """\
import json as _json
from jupyter_dist.notebook.owners import embedded_owner as _owner
_st = _owner().manager.get({name!r}).status()
print(_json.dumps({{"state": _st["state"], "generation": _st["generation"],
                   "pids": {{r["rank"]: r["pid"] for r in _st["ranks"]}}}}))
del _st, _owner, _json
"""

#: each path's parts, in order, as the table shows them
PARTS = {
    "A": ("detect", "heal_defs", "sync", "rebuild_step"),
    "B": ("detect", "restart", "defs", "load", "rebuild_step"),
}
PART_TITLES = {
    "detect": "kill noticed (session DEGRADED)",
    "heal_defs": "next cell: rank 1 replaced, regroup, imports + defs",
    "sync": "`%dist sync model,opt --from 0`",
    "rebuild_step": "DDP rebuilt + one step",
    "restart": "`%dist restart`",
    "defs": "imports + defs",
    "load": "model + optimizer built, checkpoint loaded",
}


@dataclass
class Trial:
    """One recovery: which path, its parts and total in seconds, what it checked."""

    path: str
    repeat: int
    parts: dict[str, float] = field(default_factory=dict)
    total: float = math.nan
    checksum: str = ""
    agree: bool = False
    train: dict[str, str] = field(default_factory=dict)
    #: per rank, from the step cell: torch._dynamo imported before it (1.0), seconds of
    #: DDP(model), seconds of the step
    step_ranks: dict[str, str] = field(default_factory=dict)
    foreign_cpu_percent: float | None = None
    said: str = ""


def width_for(params: float) -> int:
    """The hidden width that gives an MLP of `HIDDEN_LAYERS` square layers and its head
    about ``params`` parameters."""
    a, b, c = HIDDEN_LAYERS, HIDDEN_LAYERS + OUTPUTS, OUTPUTS - params
    return max(16, round((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))


def marks(result: CellResult) -> dict[str, str]:
    """The ``key=value`` pairs rank 0 printed after ``@@``."""
    found: dict[str, str] = {}
    for line in MARK.findall(result.stream("stdout")):
        for pair in line.split():
            key, _, value = pair.partition("=")
            found[key] = value
    return found


def cell(nk: NotebookKernel, code: str) -> CellResult:
    """Run one cell; raise with its output unless it succeeded."""
    return nk.run(code, timeout=CELL_TIMEOUT_S)


def status(nk: NotebookKernel) -> dict[str, Any]:
    """The session's state, generation and rank pids, read in the notebook kernel."""
    out = cell(nk, STATUS.format(name=SESSION)).stream("stdout")
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    data["pids"] = {int(r): int(p) for r, p in data["pids"].items()}
    return data


def kill_rank(nk: NotebookKernel) -> tuple[float, float]:
    """SIGKILL rank `KILLED_RANK` by its pid; return when it was killed (perf_counter)
    and how long until the session was DEGRADED."""
    pid = status(nk)["pids"][KILLED_RANK]
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    while status(nk)["state"] != "degraded":
        if time.perf_counter() - killed > DETECT_TIMEOUT_S:
            raise RuntimeError(f"rank {KILLED_RANK} killed, the session not DEGRADED in time")
        time.sleep(0.005)
    return killed, time.perf_counter() - killed


def train_and_kill(nk: NotebookKernel, defs: str, args: argparse.Namespace, trial: Trial) -> float:
    """A fresh training run with its checkpoints, then rank 1 killed; returns the kill's
    perf_counter() time and records the kill's detection."""
    cell(nk, f"%%distributed --session {SESSION}\n{defs}")
    result = cell(
        nk,
        f"%%distributed --session {SESSION}\n"
        + TRAIN.format(steps=args.steps, every=args.every, last_save=args.steps - args.lost_steps),
    )
    trial.train = marks(result)
    killed, trial.parts["detect"] = kill_rank(nk)
    return killed


def recover(nk: NotebookKernel, defs: str, args: argparse.Namespace, trial: Trial) -> None:
    """Path A: the next cell heals, then sync, then DDP and a step."""
    killed = train_and_kill(nk, defs, args, trial)
    heal = cell(nk, f"%%distributed --session {SESSION}\n{defs}")
    said = " ".join(heal.text.split())
    if "replaced by a fresh rank kernel" not in said:
        raise RuntimeError(f"the cell after the kill did not say it replaced rank 1: {said}")
    trial.said = said
    trial.parts["heal_defs"] = heal.elapsed
    others = ",".join(str(r) for r in range(1, args.ranks))
    to = f" --to {others}" if args.sync_to == "all" else ""
    trial.parts["sync"] = cell(nk, f"%dist sync model,opt --from 0{to} --session {SESSION}").elapsed
    code = STEP.format(first=args.steps, step=args.steps)
    step = cell(nk, f"%%distributed --session {SESSION}\n{code}")
    trial.total = time.perf_counter() - killed
    trial.parts["rebuild_step"] = step.elapsed
    trial.step_ranks = marks(step)


def restart(nk: NotebookKernel, defs: str, args: argparse.Namespace, trial: Trial) -> None:
    """Path B: a restart of every rank, definitions, the checkpoint, DDP and a step."""
    killed = train_and_kill(nk, defs, args, trial)
    trial.parts["restart"] = cell(nk, f"%dist restart --session {SESSION}").elapsed
    trial.parts["defs"] = cell(nk, f"%%distributed --session {SESSION}\n{defs}").elapsed
    trial.parts["load"] = cell(nk, f"%%distributed --session {SESSION}\n{LOAD}").elapsed
    # from the checkpoint's step: the steps trained since it are trained again
    code = STEP.format(first=args.steps - args.lost_steps, step=args.steps)
    step = cell(nk, f"%%distributed --session {SESSION}\n{code}")
    trial.total = time.perf_counter() - killed
    trial.parts["rebuild_step"] = step.elapsed
    trial.step_ranks = marks(step)


def check(nk: NotebookKernel, trial: Trial) -> None:
    """Untimed: every rank has the same weights and momentum after the step."""
    found = marks(cell(nk, f"%%distributed --session {SESSION}\n{CHECK}"))
    trial.agree = found.get("agree") == "True"
    trial.checksum = found.get("checksum", "")


def measure(args: argparse.Namespace, folder: Path, monitor: ForeignLoad) -> list[Trial]:
    defs = DEFS.format(
        ckpt=str(folder / "checkpoint.pt"),
        width=width_for(args.params),
        layers=HIDDEN_LAYERS,
        outputs=OUTPUTS,
        batch=BATCH,
    )
    env = {
        "JUPYTER_DIST_OUTPUT": "text",
        "JUPYTER_DIST_MAX_RANKS_PER_NODE": str(max(args.ranks, 2 * (os.cpu_count() or 1))),
    }
    log = BENCH_DIR / "results" / "logs" / f"recovery-{args.stamp}.log"
    trials: list[Trial] = []
    with notebook_kernel(REPO_ROOT, "%dist shutdown --all", log_path=log, extra_env=env) as nk:
        cell(nk, "%load_ext jupyter_dist")
        cell(nk, f"%%distributed --session {SESSION} --procs {args.ranks}\npass")
        for repeat in range(args.repeats):
            for path, run in (("A", recover), ("B", restart)):
                trial = Trial(path, repeat)
                print(f"[recovery] {path} #{repeat + 1} ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                run(nk, defs, args, trial)
                trial.foreign_cpu_percent = monitor.mean_between(t0, time.perf_counter())
                check(nk, trial)
                print(
                    f"[recovery] {path} #{repeat + 1}: {trial.total:.2f} s "
                    + " ".join(f"{k}={v:.2f}" for k, v in trial.parts.items())
                    + f" agree={trial.agree}",
                    file=sys.stderr,
                    flush=True,
                )
                trials.append(trial)
    return trials


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


#: how close path B's weights come to path A's once it trained steps again: a DDP made
#: anew lays its gradient buckets out afresh for its first step, so those steps sum the
#: ranks' gradients in another order than the run they repeat (the same bits only with 2
#: ranks, whose sums do not depend on the order)
REDONE_RTOL = 1e-4


def same_checksums(checksums: set[str], exact: bool) -> bool:
    """Whether the trials' weight checksums are the same (``exact``: bitwise)."""
    if exact or len(checksums) <= 1:
        return len(checksums) == 1
    sums = [[float(v) for v in c.split(",")] for c in checksums if c]
    if len(sums) != len(checksums):
        return False
    pairs = [pair for other in sums for pair in zip(sums[0], other, strict=True)]
    return all(math.isclose(a, b, rel_tol=REDONE_RTOL) for a, b in pairs)


def summary(trials: list[Trial], exact: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, parts in PARTS.items():
        mine = [t for t in trials if t.path == path]
        out[path] = {"total": spread([t.total for t in mine])}
        for part in parts:
            out[path][part] = spread([t.parts[part] for t in mine])
    out["ratio"] = out["A"]["total"]["median"] / out["B"]["total"]["median"]
    checksums = {t.checksum for t in trials}
    out["same_weights_everywhere"] = all(t.agree for t in trials) and same_checksums(
        checksums, exact
    )
    return out


def _s(stats: dict[str, float]) -> str:
    return f"{stats['median']:.2f} s ({stats['min']:.2f}-{stats['max']:.2f})"


def table(result: dict[str, Any], args: argparse.Namespace, trials: list[Trial]) -> str:
    a, b = result["A"], result["B"]
    verdict = "PASS" if result["ratio"] <= TARGET else "FAIL"
    first = trials[0].train
    lines = [
        f"{args.ranks} CPU ranks (gloo), MLP of {int(first.get('params', 0)) / 1e6:.1f} M "
        f"parameters, SGD with momentum, {args.steps} steps, a checkpoint every {args.every}, "
        f"the last {args.lost_steps} steps before the kill"
        f"{' (none lost)' if not args.lost_steps else ' not in a checkpoint'}; "
        f"median (min-max) of {args.repeats} each",
        "",
        "| path | part | seconds |",
        "| --- | --- | --- |",
    ]
    for path, stats in (("A recovery", a), ("B restart + checkpoint", b)):
        key = path[0]
        for part in PARTS[key]:
            title = PART_TITLES[part]
            if part == "sync" and args.sync_to == "all":
                title = title.replace("--from 0", "--from 0 --to all others")
            if part == "rebuild_step" and key == "B" and args.lost_steps:
                title = (
                    f"DDP rebuilt + the {args.lost_steps} steps trained since the checkpoint "
                    "trained again + one step"
                )
            lines.append(f"| {path} | {title} | {_s(stats[part])} |")
        total = _s(stats["total"])
        lines.append(f"| {path} | **kill to a step done on every rank** | **{total}** |")
    lines += [
        "",
        f"A / B: {result['ratio']:.2f}x (target <= {TARGET}x): {verdict}. Weights and "
        "momentum after the step the same on every rank and in both paths: "
        f"{'yes' if result['same_weights_everywhere'] else 'NO'}"
        + (
            f" (to a relative {REDONE_RTOL:g}: B's steps trained again in a new DDP sum the "
            "ranks' gradients in another order)."
            if args.lost_steps
            else "."
        ),
    ]
    step = statistics.median(float(t.train.get("step_s", "nan")) for t in trials)
    save = statistics.median(float(t.train.get("save_s", "nan")) for t in trials)
    lines.append(
        f"A training step took {step:.2f} s and a checkpoint save {save:.2f} s (medians, "
        "rank 0, during the training runs)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="local CPU ranks (default 4)")
    p.add_argument(
        "--params", type=float, default=25e6, help="model parameters, about (default 25e6)"
    )
    p.add_argument("--steps", type=int, default=6, help="training steps before the kill")
    p.add_argument("--every", type=int, default=3, help="steps between checkpoints")
    p.add_argument(
        "--lost-steps",
        type=int,
        default=0,
        help="steps trained after the last checkpoint before the kill, which path B trains "
        "again (default 0: a checkpoint of the last step; half a checkpoint interval is what "
        "a fault costs on average)",
    )
    p.add_argument("--repeats", type=int, default=3, help="recoveries of each path")
    p.add_argument(
        "--sync-to",
        choices=("all", "replaced"),
        default="replaced",
        help="path A's sync: to the replaced rank, as `%%dist sync model,opt --from 0` does "
        "after a heal (default), or to every other rank (--to 1,2,...)",
    )
    args = p.parse_args(argv)
    if not 2 <= args.ranks <= 64:
        p.error(f"--ranks {args.ranks}: expected 2 to 64 (rank {KILLED_RANK} is killed)")
    if not 1e4 <= args.params <= 1e9:
        p.error(f"--params {args.params:g}: expected 1e4 to 1e9")
    if args.steps < 1 or args.every < 1 or args.repeats < 1:
        p.error("--steps, --every and --repeats: expected at least 1")
    if not 0 <= args.lost_steps < args.steps:
        p.error(f"--lost-steps {args.lost_steps}: expected 0 to {args.steps - 1} (--steps - 1)")
    args.stamp = time.strftime("%Y%m%d-%H%M%S")
    load_before = os.getloadavg()
    monitor = ForeignLoad().start()
    folder = Path(tempfile.mkdtemp(prefix="jd-recovery-"))
    try:
        trials = measure(args, folder, monitor)
    finally:
        monitor.stop()
        shutil.rmtree(folder, ignore_errors=True)
    result = summary(trials, exact=not args.lost_steps)
    print(table(result, args, trials))
    foreign = [t.foreign_cpu_percent for t in trials if t.foreign_cpu_percent is not None]
    if foreign:
        print(
            f"\nCPU used by other processes meanwhile: {statistics.mean(foreign):.0f}% of one "
            f"core (mean); load average before the run {load_before[0]:.2f}"
        )
    out = BENCH_DIR / "results" / f"recovery-{args.stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "load_average_before": load_before,
    }
    settings = {k: v for k, v in vars(args).items() if k != "stamp"}
    settings["width"] = width_for(args.params)
    out.write_text(
        json.dumps(
            {
                "machine": machine,
                "settings": settings,
                "summary": result,
                "trials": [t.__dict__ for t in trials],
            },
            indent=1,
        )
    )
    print(f"\nwritten to {out.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
