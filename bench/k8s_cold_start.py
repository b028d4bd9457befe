"""Kubernetes benchmark: a ``--k8s`` session's cold start through the API emulator.

    make bench-k8s        # = .venv/bin/python bench/k8s_cold_start.py [--runs N]

The cluster is the test suite's (``tests/k8s/cluster.py``): kmock serving the Kubernetes
API on loopback, and a process playing scheduler, kubelet and Job controller, polling
every 0.2 s as a kubelet's watch would deliver. So what is timed is jupyter_dist's part
of a start, plus a pod start that costs a process start and nothing else:

* cold start: from sending a ``%%distributed --k8s --nodes 2 --procs 1`` cell (in a
  notebook kernel that has loaded the extension) to its all_reduce result, best and median
  of ``--runs`` sessions, each one shut down before the next starts;
* where it went: each progress line the start prints is timed as it arrives (connected to
  the API, objects made, pods Running, each agent connected and ready).

Target: all agents connected within 10 s of the cell's start on an idle 2-core machine
(the emulated pods' processes start Python and import jupyter_dist, which is most of it).
Nothing here fails the build.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

TEXT_MODE = {"JUPYTER_DIST_OUTPUT": "text"}
NODES = 2
CONNECTED_TARGET_S = 10.0
ALLREDUCE = (
    "import torch, torch.distributed as dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('allreduce=' + str(t.item()))\n"
)
MARK = f"allreduce={float(sum(range(1, NODES + 1)))}"


def phase_of(line: str) -> str | None:
    """The start-up step a progress line marks, or None for one that marks none."""
    if line.startswith("Kubernetes ") and line.endswith("connecting"):
        return "API reached"
    if line.startswith("job "):
        return "Secret and Job made"
    if line.startswith("pods: ") and "Running" in line and "Pending" not in line:
        return "pods Running"
    if line.endswith("agent ready") or " agent ready in " in line:
        return "agent ready"
    return None


def phases(progress: list[tuple[float, str]]) -> dict[str, float]:
    """Each step's time after the cell was sent (the last agent's, for ``agent ready``)."""
    out: dict[str, float] = {}
    for t, line in progress:
        step = phase_of(line)
        if step is not None and (step == "agent ready" or step not in out):
            out[step] = t
    return out


def run_once(nk: Any, session: str, port: int) -> tuple[float, dict[str, float]]:
    arrived: list[tuple[float, str]] = []

    def on_iopub(msg: dict[str, Any], t: float) -> bool:
        if msg["header"]["msg_type"] == "stream":
            for line in msg["content"].get("text", "").splitlines():
                if line.startswith("[jupyter_dist]"):
                    arrived.append((t, line.removeprefix("[jupyter_dist]").strip()))
        return False

    cell = (
        f"%%distributed --k8s --nodes {NODES} --procs 1 --k8s-callback 127.0.0.1:{port} "
        f"--image bench/jd:1 --session {session}\n{ALLREDUCE}"
    )
    res = nk.run(cell, timeout=300, marker=MARK, on_iopub=on_iopub)
    if res.marker_at is None:
        raise RuntimeError(f"no all_reduce result: {res.tail()}")
    nk.run(f"%dist shutdown --session {session}", timeout=120).check()
    return res.marker_at, phases([(t - res.sent_at, line) for t, line in arrived])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="sessions started (default 5)")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error(f"--runs {args.runs}: expected 1 to 100")
    from notebook_kernel import notebook_kernel

    from jupyter_dist.common.ports import free_port
    from tests.k8s.cluster import start_cluster

    with tempfile.TemporaryDirectory(prefix="jd-bench-k8s-") as tmp:
        work = Path(tmp)
        cluster = start_cluster(work / "cluster")
        try:
            env = {**TEXT_MODE, "KUBECONFIG": str(cluster.kubeconfig)}
            with notebook_kernel(work, "%dist shutdown --all", work / "kernel.log",
                                 extra_env=env) as nk:  # fmt: skip
                nk.run("%load_ext jupyter_dist").check()
                colds: list[float] = []
                steps: list[dict[str, float]] = []
                for i in range(args.runs):
                    cold, where = run_once(nk, f"bench{i}", free_port())
                    colds.append(cold)
                    steps.append(where)
                    print(f"run {i}: cold start {cold:.2f} s; " + ", ".join(
                        f"{k} {v:.2f} s" for k, v in where.items()), flush=True)  # fmt: skip
        finally:
            left = cluster.stop()
    print()
    print(f"cold start to the all_reduce ({NODES} pods): best {min(colds):.2f} s, "
          f"median {statistics.median(colds):.2f} s over {len(colds)} runs")  # fmt: skip
    for step in ("API reached", "Secret and Job made", "pods Running", "agent ready"):
        seen = [s[step] for s in steps if step in s]
        if seen:
            print(f"  {step:22s} median {statistics.median(seen):6.2f} s")
    ready = [s["agent ready"] for s in steps if "agent ready" in s]
    if ready:
        verdict = "PASS" if statistics.median(ready) <= CONNECTED_TARGET_S else "FAIL"
        print(f"all agents connected: median {statistics.median(ready):.2f} s, target "
              f"<= {CONNECTED_TARGET_S:.0f} s: {verdict}")  # fmt: skip
    if left:
        print(f"pod processes left (killed): {left}")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s)")
    sys.exit(code)
