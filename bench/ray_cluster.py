"""Ray benchmark: jupyter_dist on a Ray cluster vs Ray Train's ``TorchTrainer``, same cluster.

    make bench-ray        # = .venv/bin/python bench/ray_cluster.py: root, `ip netns`, ray[train]

The cluster is the test suite's (``tests/ray/cluster.py``): a head and two worker nodes,
each a ``ray start`` in its own network namespace, token authentication on, one CPU a
node. Both sides run 2 nodes x 2 CPU ranks with gloo, and every driver (the notebook
kernel, the Ray Train script) runs in the head's namespace, as a Ray driver must.

* cold start: jupyter_dist from ``%load_ext jupyter_dist`` in a fresh notebook kernel
  (its start not counted) to the all_reduce result of the first ``%%distributed --ray
  --nodes 2 --procs 2`` cell; Ray Train from calling ``TorchTrainer.fit()`` (after
  ``ray.init()``) to the moment rank 0's worker finished the same all_reduce, and to the
  end of ``fit()``. Target: <= 0.5x Ray Train's time to the all_reduce.
* re-run: a training cell (a tiny model under DDP, a few steps), changed (another
  learning rate) and run again in the warm session, against ``fit()`` of a trainer whose
  loop runs the same code. Target: <= 0.05x.

The progress lines jupyter_dist prints while the session starts are timed as they arrive,
and a bare Ray driver then times the steps the session's driver takes before any agent
starts (``import ray``, connecting, the placement group, the actors), so the report says
where the cold start goes. Nothing here fails the build.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: rank output as prefixed text on the notebook kernel's stdout, where markers are looked for
TEXT_MODE = {"JUPYTER_DIST_OUTPUT": "text"}
#: Ray Train as Ray 2.60 runs it by default (its V2 implementation), said explicitly
RAY_TRAIN_ENV = {"RAY_TRAIN_V2_ENABLED": "1"}
COLD_TARGET = 0.5
RERUN_TARGET = 0.05
NODES, PROCS = 2, 2
WORLD = NODES * PROCS
ALLREDUCE_MARK = f"allreduce={float(sum(range(1, WORLD + 1)))}"

ALLREDUCE = (
    "import torch, torch.distributed as dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)])\n"
    "dist.all_reduce(t)\n"
    "print('allreduce=' + str(t.item()))\n"
)
#: the training cell; LR is what the re-run changes
TRAIN = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=LR)
g = torch.Generator().manual_seed(dist.get_rank())
x, y = torch.randn(256, 32, generator=g), torch.randn(256, 1, generator=g)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(f"trained, loss={loss.item():.4f}")
"""
#: the learning rates of the training runs: the first is the warm-up, the others are timed
LEARNING_RATES = (0.1, 0.05, 0.02, 0.01, 0.005)


def train_code(lr: float) -> str:
    return TRAIN.replace("LR", repr(lr))


# -- the pure part: ratios, verdicts, the report -------------------------------------------


@dataclasses.dataclass
class Measured:
    """One run's numbers, in seconds; None where that side did not get there."""

    jd_cold: float | None = None
    ray_cold_to_allreduce: float | None = None
    ray_cold_fit: float | None = None
    jd_rerun: float | None = None
    ray_rerun_fit: float | None = None
    #: (seconds since the cold cell was sent, text) of each progress line of jupyter_dist
    progress: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    #: seconds from ``%load_ext`` sent to the cold cell sent
    load_ext: float | None = None
    #: a bare Ray driver's steps (what the session's driver does before its agents start)
    ray_steps: dict[str, float] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


def ratio(mine: float | None, reference: float | None) -> float | None:
    """mine / reference, or None where either is missing or the reference is not positive."""
    if mine is None or reference is None or reference <= 0 or math.isnan(mine):
        return None
    return mine / reference


def verdict(value: float | None, at_most: float) -> str:
    """``PASS (0.31x)`` / ``FAIL (0.62x)`` against an upper bound, ``-`` without a value;
    two significant digits, so a re-run's small ratio (``0.005x``) does not read as 0."""
    if value is None:
        return "-"
    return f"{'PASS' if value <= at_most else 'FAIL'} ({value:.2g}x)"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def phases(progress: Sequence[tuple[float, str]], end: float | None) -> list[tuple[str, float]]:
    """How long each progress line lasted: from its arrival to the next line's (the last
    to ``end``, the all_reduce result), in seconds; the time before the first line is
    named "(before the first line)"."""
    out: list[tuple[str, float]] = []
    if end is not None:
        progress = [p for p in progress if p[0] < end]  # what came after the result is not in it
    if not progress:
        return out
    out.append(("(before the first line)", progress[0][0]))
    for (at, text), nxt in zip(progress, [*progress[1:], None], strict=True):
        until = nxt[0] if nxt is not None else end
        if until is not None:
            out.append((text, until - at))
    return out


def render(m: Measured) -> str:
    """The markdown report: the table of targets, then where jupyter_dist's cold start went."""
    cold = ratio(m.jd_cold, m.ray_cold_to_allreduce)
    rerun = ratio(m.jd_rerun, m.ray_rerun_fit)
    rows = [
        ["metric", "jupyter_dist", "Ray Train TorchTrainer", "target", "verdict"],
        ["---"] * 5,
        [
            f"cold start, {NODES} nodes x {PROCS} CPU ranks, to the first all_reduce",
            seconds(m.jd_cold),
            f"{seconds(m.ray_cold_to_allreduce)} (fit() to the all_reduce; whole fit() "
            f"{seconds(m.ray_cold_fit)})",
            f"<= {COLD_TARGET:g}x Ray Train",
            verdict(cold, COLD_TARGET),
        ],
        [
            "re-run of a changed DDP training cell (20 steps)",
            seconds(m.jd_rerun),
            f"{seconds(m.ray_rerun_fit)} (fit() again)",
            f"<= {RERUN_TARGET:g}x Ray Train",
            verdict(rerun, RERUN_TARGET),
        ],
    ]
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    if m.progress:
        lines += ["", "Where jupyter_dist's cold start went (each progress line until the next):"]
        lines += ["", "| seconds | from the line |", "| ---: | --- |"]
        if m.load_ext is not None:
            lines.append(f"| {m.load_ext:.2f} | `%load_ext jupyter_dist` (its cell) |")
        for text, took in phases(
            m.progress, None if m.jd_cold is None else m.jd_cold - (m.load_ext or 0.0)
        ):
            lines.append(f"| {took:.2f} | {_cell(text)} |")
    if m.ray_steps:
        lines += [
            "",
            "A bare Ray driver on the head node doing what the session's driver does "
            "first, step by step:",
            "",
            "| seconds | step |",
            "| ---: | --- |",
        ]
        lines += [f"| {took:.2f} | {_cell(step)} |" for step, took in m.ray_steps.items()]
    for what, why in m.errors.items():
        lines.append(f"\n{what}: error: {_cell(why)}")
    return "\n".join(lines)


def _cell(text: str, limit: int = 160) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- what the machine needs ---------------------------------------------------------------


def missing() -> list[str]:
    """Why this machine cannot run the benchmark; empty when it can."""
    from tests.ray.cluster import missing_requirements

    problems = missing_requirements()
    if not problems:
        try:
            import ray.train.torch  # noqa: F401
        except ImportError as exc:
            problems.append(f"Ray Train cannot be imported ({exc}): pip install 'ray[train]'")
    return problems


# -- jupyter_dist in a notebook kernel in the head's namespace ---------------------------


def jupyter_dist_side(cluster: Any, work: Path, m: Measured, log: Path) -> None:
    from notebook_kernel import notebook_kernel

    from tests.ray.head_kernel import HEAD_KERNEL, TRANSPORT, head_kernelspecs

    arrived: list[tuple[float, str]] = []  # (time.perf_counter(), progress line)

    def on_iopub(msg: dict[str, Any], t: float) -> bool:
        if msg["header"]["msg_type"] == "stream":
            for line in msg["content"].get("text", "").splitlines():
                if line.startswith("[jupyter_dist]"):
                    arrived.append((t, line.removeprefix("[jupyter_dist]").strip()))
        return False

    env = {**cluster.env, **TEXT_MODE}
    options = {
        "kernel_spec": head_kernelspecs(cluster, work),
        "kernel_name": HEAD_KERNEL,
        "transport": TRANSPORT,  # the kernel's loopback is the head namespace's, not ours
        "startup_timeout": 120.0,
    }
    with notebook_kernel(work, "%dist shutdown --all", log, extra_env=env, **options) as nk:
        first = nk.run("%load_ext jupyter_dist")
        cell = f"%%distributed --ray --nodes {NODES} --procs {PROCS}\n" + ALLREDUCE
        res = nk.run(cell, timeout=300, marker=ALLREDUCE_MARK, on_iopub=on_iopub)
        if res.marker_at is None:
            raise RuntimeError(f"no all_reduce result: {res.tail()}")
        m.jd_cold = res.sent_at + res.marker_at - first.sent_at
        m.load_ext = res.sent_at - first.sent_at
        m.progress = [(t - res.sent_at, text) for t, text in arrived]
        nk.run("%%distributed\n" + train_code(LEARNING_RATES[0]), timeout=300).check()
        times = []
        for lr in LEARNING_RATES[1:]:
            rerun = nk.run("%%distributed\n" + train_code(lr), timeout=300).check()
            if "trained, loss=" not in rerun.text:
                raise RuntimeError(f"the training cell printed no loss: {rerun.tail()}")
            times.append(rerun.elapsed)
        m.jd_rerun = statistics.median(times)


# -- Ray Train: a driver script in the head's namespace -----------------------------------

RAY_TRAIN_SCRIPT = '''
import json, sys, tempfile, time
import ray, ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

ALLREDUCE = """ALLREDUCE_CODE"""


def loop(config):
    import json, os, time
    exec(config["code"], {})
    done_at = time.time()
    # Ray Train 2.60 (V2) keeps no metrics reported without a checkpoint: a file per rank
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump({"done_at": done_at}, f)


def fit(code, name, storage):
    out = tempfile.mkdtemp(dir=storage)
    trainer = TorchTrainer(
        loop,
        train_loop_config={"code": code, "out": out},
        # 4 workers of half a CPU: PACK puts two on each of two 1-CPU nodes
        scaling_config=ScalingConfig(
            num_workers=WORLD, use_gpu=False, resources_per_worker={"CPU": 0.5},
            placement_strategy="PACK",
        ),
        run_config=RunConfig(name=name, storage_path=storage),
    )
    began = time.time()
    trainer.fit()
    ended = time.time()
    with open(f"{out}/rank0.json") as f:
        done = json.load(f)["done_at"]
    return began, done, ended


codes, ifname = json.loads(sys.argv[1]), sys.argv[2]
# gloo binds where the node's hostname resolves, loopback here: name the nodes' interface,
# as jupyter_dist does for its ranks
ray.init(logging_level="ERROR", runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": ifname}})
with tempfile.TemporaryDirectory(prefix="jd-bench-raytrain-") as storage:
    began, done, ended = fit(ALLREDUCE, "cold", storage)
    print(json.dumps({"cold_to_allreduce": done - began, "cold_fit": ended - began}), flush=True)
    for i, code in enumerate(codes):
        began, done, ended = fit(code, f"train{i}", storage)
        print(json.dumps({"fit": ended - began}), flush=True)
'''


def ray_train_side(cluster: Any, work: Path, m: Measured, log: Path) -> None:
    script = work / "ray_train_bench.py"
    # the all_reduce code is the cell's, but done_at is taken after it, by every worker;
    # rank 0's report is what fit() returns
    text = RAY_TRAIN_SCRIPT.replace("ALLREDUCE_CODE", ALLREDUCE).replace("WORLD", str(WORLD))
    script.write_text(textwrap.dedent(text))
    codes = [train_code(lr) for lr in LEARNING_RATES[1:3]]
    ifname = interface_of(cluster, 0)
    argv = cluster.driver_argv([sys.executable, str(script), json.dumps(codes), ifname])
    with log.open("ab") as err:
        proc = subprocess.run(
            argv,
            env=cluster.driver_env(**RAY_TRAIN_ENV),
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            timeout=900,
            check=False,
            cwd=work,
        )
    results = [
        json.loads(line) for line in proc.stdout.decode().splitlines() if line.startswith("{")
    ]
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"the Ray Train script failed ({proc.returncode}); see {log}")
    m.ray_cold_to_allreduce = results[0]["cold_to_allreduce"]
    m.ray_cold_fit = results[0]["cold_fit"]
    fits = [r["fit"] for r in results[1:]]
    if fits:
        m.ray_rerun_fit = statistics.median(fits)


def interface_of(cluster: Any, node: int) -> str:
    """The interface holding node ``node``'s address (the test cluster's nodes name theirs
    alike)."""
    argv = cluster.driver_argv(["ip", "-o", "-4", "addr", "show"], node)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    for line in out.splitlines():
        if f" {cluster.network.addresses[node]}/" in line:
            return line.split()[1]
    raise RuntimeError(f"no interface holds {cluster.network.addresses[node]} on node {node}")


RAY_STEPS_SCRIPT = """
import json, sys, time
t0 = time.time()
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
t1 = time.time()
ray.init(logging_level="ERROR")
t2 = time.time()
pg = placement_group([{"CPU": 1}] * NODES, strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=120)
t3 = time.time()

@ray.remote(num_cpus=1)
class Host:
    def ping(self):
        return 1

hosts = [
    Host.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
    for i in range(NODES)
]
ray.get([h.ping.remote() for h in hosts], timeout=120)
t4 = time.time()
print(json.dumps({
    "python starts (from the call to its first line)": t0 - float(sys.argv[1]),
    "import ray": t1 - t0,
    "ray.init() connects": t2 - t1,
    "placement group of NODES bundles ready": t3 - t2,
    "NODES actors started, one per bundle, answering": t4 - t3,
}))
"""


def ray_steps(cluster: Any, work: Path, m: Measured, log: Path) -> None:
    """Time a bare driver's steps: Python and ``import ray``, connecting, placing, actors."""
    script = work / "ray_steps.py"
    script.write_text(RAY_STEPS_SCRIPT.replace("NODES", str(NODES)))
    argv = cluster.driver_argv([sys.executable, str(script), repr(time.time())])
    with log.open("ab") as err:
        proc = subprocess.run(
            argv, env=cluster.driver_env(), stdout=subprocess.PIPE, stderr=err,
            stdin=subprocess.DEVNULL, timeout=300, check=False, cwd=work,
        )  # fmt: skip
    lines = [x for x in proc.stdout.decode().splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the bare Ray driver failed ({proc.returncode}); see {log}")
    m.ray_steps = json.loads(lines[-1])


def prime() -> None:
    """Import the heavy modules once, so neither side pays for a cold page cache."""
    code = "import torch, torch.distributed, ipykernel, ray, ray.train.torch"
    subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="logs and JSON")
    args = p.parse_args(argv)
    # the test suite's Ray cluster and the bench's notebook kernel
    sys.path[:0] = [str(REPO), str(REPO / "bench")]
    problems = missing()
    if problems:
        print("skipped: this machine cannot run the Ray cluster: " + "; ".join(problems))
        return 0
    from tests.ray.cluster import ray_cluster

    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = args.out / "logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    m = Measured()
    prime()
    with tempfile.TemporaryDirectory(prefix="jd-bench-ray-") as tmp:
        work = Path(tmp)
        print("starting the Ray cluster (head + 2 worker nodes)", flush=True)
        with ray_cluster(workdir=work / "cluster") as cluster:
            print(f"cluster up in {cluster.start_seconds:.0f} s; jupyter_dist", flush=True)
            for what, side, log in (
                ("jupyter_dist", jupyter_dist_side, logs / "jupyter_dist-kernel.log"),
                ("Ray Train", ray_train_side, logs / "ray-train.log"),
                ("a bare Ray driver", ray_steps, logs / "ray-steps.log"),
            ):
                print(f"== {what}", flush=True)
                try:
                    side(cluster, work, m, log)
                except Exception as exc:  # one side failing must not lose the other's numbers
                    m.errors[what] = f"{type(exc).__name__}: {exc}"
    report = render(m)
    print()
    print(report)
    path = args.out / f"bench-ray-{stamp}.json"
    payload = {**dataclasses.asdict(m), "report_markdown": report}
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
