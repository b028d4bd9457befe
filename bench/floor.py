"""How low can a warm ``x = 1`` cell go with real IPython kernels as ranks?

    .venv/bin/python bench/floor.py                  # 2 ranks, 200 rounds
    .venv/bin/python bench/floor.py --ranks 2,8,32 --rounds 100

In one real notebook kernel (`notebook_kernel.NotebookKernel`, as in bench/run.py), with
N ranks of each kind running side by side, these cells take turns, round after round, so
each kind meets the same load:

* ``x = 1``: a plain cell, no ranks. What ipykernel and IPython spend on any cell: every
  peer pays it.
* ``%%bare_stock``: the barest front end there is, to N stock ipykernels started with
  jupyter_client's `KernelManager` on Unix sockets: the magic sends the ``execute_request``
  to each from the notebook's own thread and waits, blocking, for each ``execute_reply``.
  It reads no output, keeps no state, has no thread, no relay and no error handling.
* ``%%bare_ours``: the same bare front end to jupyter_dist's own rank kernels (the
  session's), straight to each rank's shell and IOPub sockets, not through the relay,
  asking for the reply on IOPub as the notebook side does (it skips the replies to the
  session's own cells that ran in between, one a rank, and the session's relay carries
  its replies to the notebook kernel too, which drops them). What is left is the ranks
  themselves (IPython's ``run_cell``, ipykernel's ``do_execute``, its IOPub thread) and
  the hand-offs between processes: a floor under any front end to these ranks.
* ``%%distributed``: jupyter_dist (the widget view, as a notebook shows it).
* ``%%px``: ipyparallel.

For each: median and p25/p75 of the round trips (request sent to reply and idle) and the
ratio to ipyparallel's median. Under the table, for rank counts with a warm-cell target
(0.5x ipyparallel at 2 ranks, 0.35x at 32, from the issue "2 to 1,024 ranks"): the target
in ms beside the plain cell, the floor and jupyter_dist. Writes
bench/results/floor-<time>.json with every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from notebook_kernel import NotebookKernel, notebook_kernel
from scale import IPP_START

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CELL_TIMEOUT_S = 300.0
WARMUP_ROUNDS = 5

#: warm-cell targets of the issue "2 to 1,024 ranks", as a fraction of ipyparallel's cell
TARGETS = {2: 0.5, 32: 0.35}

BARE_STOCK_SETUP = """\
from IPython.core.magic import register_cell_magic
from jupyter_client.manager import KernelManager

_floor_kms, _floor_kcs = [], []
for _ in range({n}):
    _km = KernelManager(kernel_name="python3", transport="ipc")
    _km.start_kernel()
    _kc = _km.blocking_client()
    _kc.start_channels()
    _kc.wait_for_ready(timeout=120)
    _floor_kms.append(_km)
    _floor_kcs.append(_kc)

@register_cell_magic
def bare_stock(line, cell):
    sent = [kc.execute(cell) for kc in _floor_kcs]
    for kc, msg_id in zip(_floor_kcs, sent):
        while kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != msg_id:
            pass
"""
# the same, straight to jupyter_dist's own rank kernels: their shell and IOPub sockets,
# not the relay, answered on IOPub (the notebook side's way)
BARE_OURS_SETUP = """\
import zmq
from IPython.core.magic import register_cell_magic
from jupyter_dist.common.wire_codec import WireCodec
from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE, IOPUB_REPLY_KEY
from jupyter_dist.notebook.owners import session_owner

def _floor_url(conn, channel):
    port = conn[channel + "_port"]
    if conn["transport"] == "ipc":
        return "ipc://%s-%s" % (conn["ip"], port)
    return "tcp://%s:%s" % (conn["ip"], port)

_floor_ctx = zmq.Context()
_floor_ranks = []
for _rec in next(iter(session_owner().manager.sessions.values())).ranks.values():
    _conn = _rec.client.connection
    _shell = _floor_ctx.socket(zmq.DEALER)
    _shell.connect(_floor_url(_conn, "shell"))
    _sub = _floor_ctx.socket(zmq.SUB)
    _sub.setsockopt(zmq.SUBSCRIBE, b"")
    _sub.connect(_floor_url(_conn, "iopub"))
    _floor_ranks.append((WireCodec(_rec.client.codec.key), _shell, _sub))
import time as _time
_time.sleep(0.5)  # the subscriptions reach the ranks

@register_cell_magic
def bare_ours(line, cell):
    content = {"code": cell, "silent": False, "store_history": True,
               "user_expressions": {}, "allow_stdin": False, "stop_on_error": False}
    sent = []
    for codec, shell, sub in _floor_ranks:
        msg_id, frames = codec.encode("execute_request", content, metadata={IOPUB_REPLY_KEY: True})
        shell.send_multipart(frames)
        sent.append(msg_id.encode())
    for (codec, shell, sub), msg_id in zip(_floor_ranks, sent):
        while True:
            frames = sub.recv_multipart()
            at = frames.index(b"<IDS|MSG>")
            header, parent = frames[at + 2], frames[at + 3]
            if EXECUTE_REPLY_MSG_TYPE.encode() in header and msg_id in parent:
                break
"""
TEARDOWN = """\
for _kc in globals().get("_floor_kcs", []):
    _kc.stop_channels()
for _km in globals().get("_floor_kms", []):
    _km.shutdown_kernel(now=True)
if "_bench_cluster" in globals():
    await _bench_cluster.stop_cluster()
%dist shutdown --all
"""

CELLS = {
    "plain cell": "x = 1",
    "bare client, stock ipykernels": "%%bare_stock\nx = 1",
    "bare client, jupyter_dist's ranks": "%%bare_ours\nx = 1",
    "jupyter_dist": "%%distributed\nx = 1",
    "ipyparallel": "%%px\nx = 1",
}


def setup(nk: NotebookKernel, n: int) -> None:
    for code in (
        "%load_ext jupyter_dist",
        f"%%distributed --procs {n} --no-init\nx = 1",
        BARE_STOCK_SETUP.format(n=n),
        BARE_OURS_SETUP,
        IPP_START.format(n=n),
        "%%px\nx = 1",
    ):
        nk.run(code, timeout=CELL_TIMEOUT_S).check()


def measure(n: int, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    """Round trips (seconds) of each kind of cell, interleaved, at ``n`` ranks."""
    samples: dict[str, list[float]] = {name: [] for name in CELLS}
    with notebook_kernel(REPO_ROOT, TEARDOWN, extra_env=env) as nk:
        setup(nk, n)
        for i in range(WARMUP_ROUNDS + rounds):
            for name, code in CELLS.items():
                elapsed = nk.run(code, timeout=CELL_TIMEOUT_S).check().elapsed
                if i >= WARMUP_ROUNDS:
                    samples[name].append(float(elapsed))
    return {name: summary(times) for name, times in samples.items()} | {"samples": samples}


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": 1000 * statistics.median(ordered),
        "p25_ms": 1000 * ordered[len(ordered) // 4],
        "p75_ms": 1000 * ordered[(3 * len(ordered)) // 4],
    }


def report(n: int, result: dict[str, Any]) -> str:
    ipp = result["ipyparallel"]["median_ms"]
    lines = [
        f"### {n} ranks",
        "",
        "| cell | median ms | p25 | p75 | / ipyparallel |",
        "|---|---|---|---|---|",
    ]
    for name in CELLS:
        s = result[name]
        lines.append(
            f"| {name} | {s['median_ms']:.2f} | {s['p25_ms']:.2f} | {s['p75_ms']:.2f} "
            f"| {s['median_ms'] / ipp:.2f}x |"
        )
    target = TARGETS.get(n)
    if target is not None:
        plain = result["plain cell"]["median_ms"]
        floor = result["bare client, jupyter_dist's ranks"]["median_ms"]
        bound = target * ipp
        lines += [
            "",
            f"target {target}x ipyparallel = {bound:.2f} ms: the plain cell takes {plain:.2f} "
            f"of it, leaving {bound - plain:.2f} ms for a front end to {n} ranks; the bare "
            f"client to jupyter_dist's ranks takes {floor - plain:.2f} ms above the plain "
            f"cell, jupyter_dist {result['jupyter_dist']['median_ms'] - plain:.2f} ms.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", default="2", help="rank counts (default: 2)")
    p.add_argument("--rounds", type=int, default=200, help="timed rounds of the four cells")
    args = p.parse_args(argv)
    try:
        counts = [int(c) for c in args.ranks.split(",") if c.strip()]
    except ValueError:
        p.error(f"--ranks {args.ranks!r}: expected counts separated by commas, e.g. 2,8")
    if not counts or min(counts) < 1 or max(counts) > 64:
        p.error(f"--ranks {args.ranks!r}: expected counts between 1 and 64")
    if not 1 <= args.rounds <= 10_000:
        p.error(f"--rounds {args.rounds}: expected 1 to 10000")
    env = {"JUPYTER_DIST_MAX_RANKS_PER_NODE": str(max(counts)), "JUPYTER_DIST_OUTPUT": "widget"}
    results: dict[int, dict[str, Any]] = {}
    for n in counts:
        print(f"== {n} ranks", file=sys.stderr, flush=True)
        results[n] = measure(n, args.rounds, env)
        print(report(n, results[n]), flush=True)
        print(flush=True)
    out_dir = BENCH_DIR / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"floor-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(), "rounds": args.rounds}
    path.write_text(json.dumps({"settings": meta, "results": results}, indent=1))
    print(f"wrote {path.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
