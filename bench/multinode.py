"""Multi-node benchmark: jupyter_dist over SSH vs torchrun started by hand on each node.

    sudo .venv/bin/python bench/multinode.py        # needs root: it makes network namespaces

Two nodes are real sshd servers in network namespaces on this machine (the test suite's
cluster), two CPU ranks each, gloo. Measured from a real notebook kernel:

* cold start: `%load_ext` + the first `%%distributed --hosts node0,node1 --procs 2` cell
  up to its all_reduce result, against `ssh nodeI torchrun --nnodes 2 --node-rank I ...`
  started on both nodes at once, up to the same result (target: <= 1x);
* warm round trip of an `x = 1` cell through the SSH tunnels, against the same cell on
  four local ranks (target: <= 2x).
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from notebook_kernel import notebook_kernel  # noqa: E402

from jupyter_dist.common.ports import free_port  # noqa: E402
from tests.multinode.cluster import Cluster, ssh_cluster  # noqa: E402

ALLREDUCE = (
    "import torch, torch.distributed as dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)])\n"
    "dist.all_reduce(t)\n"
    "print('allreduce=' + str(t.item()))\n"
)
SCRIPT = 'import torch.distributed as dist\ndist.init_process_group("gloo")\n' + ALLREDUCE
RUNS, REPEATS = 30, 3
# rank output as prefixed text on the notebook kernel's stdout, where the marker is looked for
TEXT_MODE = {"JUPYTER_DIST_OUTPUT": "text"}


def jupyter_dist_ssh(cluster: Cluster, work: Path) -> tuple[float, float]:
    """Cold start to the all_reduce, then the warm round trip, over SSH."""
    hosts = ",".join(cluster.hosts)
    with notebook_kernel(work, "%dist shutdown --all", extra_env=TEXT_MODE) as nk:
        first = nk.run("%load_ext jupyter_dist")
        cell = f"%%distributed --hosts {hosts} --ssh-config {cluster.config_path} --procs 2\n"
        res = nk.run(cell + ALLREDUCE, timeout=300, marker="allreduce=10.0")
        if res.marker_at is None:
            raise RuntimeError(f"no all_reduce result: {res.tail()}")
        cold = res.sent_at + res.marker_at - first.sent_at
        return cold, warm_round_trip(nk)


def jupyter_dist_local(work: Path) -> float:
    with notebook_kernel(work, "%dist shutdown --all", extra_env=TEXT_MODE) as nk:
        nk.run("%load_ext jupyter_dist")
        nk.run("%%distributed --procs 4\nx = 0", timeout=300).check()
        return warm_round_trip(nk)


def warm_round_trip(nk: object) -> float:
    times = []
    for i in range(RUNS + 5):
        res = nk.run("%%distributed\nx = 1")  # type: ignore[attr-defined]
        if i >= 5:
            times.append(res.elapsed)
    return statistics.median(times)


def interface_of(cluster: Cluster, node: int) -> str:
    out = cluster.run(node, ["ip", "-o", "-4", "addr", "show"]).stdout
    for line in out.splitlines():
        if f" {cluster.addresses[node]}/" in line:
            return line.split()[1]
    raise RuntimeError(f"no interface holds {cluster.addresses[node]} on node {node}")


def torchrun_by_hand(cluster: Cluster, work: Path) -> float:
    """ssh to every node and start torchrun there, as one would without jupyter_dist."""
    script = work / "allreduce.py"
    script.write_text(SCRIPT)
    port = free_port()
    procs = []
    began = time.perf_counter()
    for node, _host in enumerate(cluster.hosts):
        remote = (
            f"cd {shlex.quote(str(work))} && GLOO_SOCKET_IFNAME={interface_of(cluster, node)} "
            f"{shlex.quote(sys.executable)} -m torch.distributed.run --nnodes 2 "
            f"--node-rank {node} --nproc-per-node 2 --master-addr {cluster.addresses[0]} "
            f"--master-port {port} {script.name}"
        )
        procs.append(
            subprocess.Popen(
                cluster.ssh_argv(node, remote), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    seen = None
    assert procs[0].stdout is not None
    for raw in procs[0].stdout:
        if b"allreduce=10.0" in raw:
            seen = time.perf_counter() - began
            break
    for proc in procs:
        proc.wait(120)
    if seen is None:
        raise RuntimeError("torchrun printed no all_reduce result")
    return seen


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="jd-bench-") as tmp:
        work = Path(tmp)
        with ssh_cluster(2, workdir=work / "cluster") as cluster:
            colds, warms, hands = [], [], []
            for _ in range(REPEATS):
                cold, warm = jupyter_dist_ssh(cluster, work)
                colds.append(cold)
                warms.append(warm)
                hands.append(torchrun_by_hand(cluster, work))
            local = jupyter_dist_local(work)
    cold, hand, warm = (statistics.median(v) for v in (colds, hands, warms))
    rows = [
        ("cold start, 2 nodes x 2 ranks, to first all_reduce", f"{cold:.2f} s",
         f"{hand:.2f} s (torchrun by hand over ssh)", f"{cold / hand:.2f}x", "<= 1x"),
        ("warm `x = 1` round trip", f"{warm * 1000:.2f} ms",
         f"{local * 1000:.2f} ms (4 local ranks)", f"{warm / local:.2f}x", "<= 2x"),
    ]  # fmt: skip
    print("| metric | jupyter_dist over SSH | reference | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nmedians of {REPEATS} cold starts; warm: median of {RUNS} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
