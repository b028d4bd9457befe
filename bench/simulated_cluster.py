"""The notebook side at cluster scale: a cell on up to 1,024 simulated ranks, on one machine.

    .venv/bin/python bench/simulated_cluster.py                    # 32, 256 and 1,024 ranks
    .venv/bin/python bench/simulated_cluster.py --nodes 64 --ranks-per-node 16 --cells 20

Real rank kernels cost about 60 MB and a CPU's worth of start-up each, so 1,024 of them do
not fit on a laptop. Here the rank side is a load generator: one process per simulated
node answers the Jupyter protocol for its ranks (kernel_info, and an ``execute_request``
answered as a rank kernel answers ``x = 1``, signed with the session key: the notebook
side's cells with one IOPub reply, `jupyter_dist.rank.iopub_reply`; others with the busy
status, the shell reply and the idle status). It is never used by the tests in place of real
ranks; it exists so that what the notebook process pays per rank can be measured at a
count this machine could not start for real.

The notebook side is the project's own: an `AttachedSession` (the same `RankGroup`,
`RankClient` and `CellTracker` an embedded session runs a cell with) connects to the
responders' sockets, runs ``--cells`` cells on every rank, and a thread draws each cell's
events with the text renderer, as a notebook's thread does. Measured per cell:

Each simulated node also gets the project's own relay (`jupyter_dist.node.relay`, one
process a node, told which responders to serve as an agent tells it: IOPub in batches, a
cell sent once a node and the replies back in batches), and the same cluster is measured
without relays (``--relays on,off``, the default: both).

* **control-plane CPU**: CPU time (user + system, every thread) of this process,
  divided by the number of cells. It leaves out what IPython and ipykernel spend on any
  cell (about 3 ms here, see `bench/scale.py`'s plain cell), which does not grow with N.
* **wall time**: median and p90, request sent to every rank's reply and idle. The
  responders share this machine's cores with the notebook side, so this is an upper bound.

Prints a markdown table and writes bench/results/simulated-<time>.json. Target (issue
"2 to 1,024 ranks"): at most 100 ms of notebook CPU per empty cell at 1,024 ranks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import queue
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from jupyter_dist.common.wire_codec import DELIMITER, WireCodec, WireError  # noqa: E402
from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE, IOPUB_REPLY_KEY  # noqa: E402

#: the most simulated ranks one run may ask for (each takes three sockets and their files)
MAX_RANKS = 4096
MAX_RANKS_PER_NODE = 256
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}


# -- the rank side: a protocol responder per simulated node ------------------------------
def serve(node: int, ranks: int, key: str, folder: str) -> None:
    """Answer the Jupyter protocol for ``ranks`` ranks of ``node`` until stdin closes.

    Prints one JSON line first: each rank's connection (ipc sockets in ``folder``)."""
    context = zmq.Context()
    poller = zmq.Poller()
    #: each rank's iopub socket, codec (its own replay check, as a kernel's) and count
    kernels: dict[zmq.Socket[bytes], tuple[zmq.Socket[bytes], WireCodec, list[int]]] = {}
    connections = []
    for local in range(ranks):
        base = os.path.join(folder, f"n{node}r{local}")
        shell, control = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
        iopub = context.socket(zmq.PUB)
        shell.bind(f"ipc://{base}-{PORTS['shell_port']}")
        control.bind(f"ipc://{base}-{PORTS['control_port']}")
        iopub.bind(f"ipc://{base}-{PORTS['iopub_port']}")
        codec, count = WireCodec(key), [0]
        for socket in (shell, control):
            kernels[socket] = (iopub, codec, count)
            poller.register(socket, zmq.POLLIN)
        connections.append(
            {
                **PORTS,
                "ip": base,
                "transport": "ipc",
                "signature_scheme": "hmac-sha256",
                "kernel_name": "responder",
            }
        )
    print(json.dumps(connections), flush=True)
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not stop.is_set():
        for socket, _ in poller.poll(200):
            iopub, codec, count = kernels[socket]
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                _answer(codec, socket, iopub, count, frames)


def _answer(
    codec: WireCodec,
    socket: zmq.Socket[bytes],
    iopub: zmq.Socket[bytes],
    count: list[int],
    frames: list[bytes],
) -> None:
    """What a kernel sends for a kernel_info or execute request; nothing for the rest."""
    split = frames.index(DELIMITER)
    idents = frames[:split]
    try:
        msg = codec.decode(frames)
    except WireError:
        return
    kind = msg["msg_type"]
    if kind == "kernel_info_request":
        reply_type = "kernel_info_reply"
        content: dict[str, Any] = {"status": "ok", "protocol_version": "5.3"}
    elif kind == "execute_request":
        count[0] += 1
        reply_type = "execute_reply"
        content = {"status": "ok", "execution_count": count[0], "user_expressions": {}}
    else:  # credit acks, interrupts: nothing to answer in a load generator
        return
    parent = msg["header"]
    if kind == "execute_request" and msg["metadata"].get(IOPUB_REPLY_KEY):
        _, parts = codec.encode(EXECUTE_REPLY_MSG_TYPE, content, parent=parent)
        iopub.send_multipart([EXECUTE_REPLY_MSG_TYPE.encode(), *parts])
        return

    def publish(state: str) -> None:
        _, parts = codec.encode("status", {"execution_state": state}, parent=parent)
        iopub.send_multipart([b"kernel.status", *parts])

    publish("busy")
    _, parts = codec.encode(reply_type, content, parent=parent)
    socket.send_multipart([*idents, *parts])
    publish("idle")


# -- the notebook side --------------------------------------------------------------------
def relay(key: str, folder: str) -> None:
    """A node's relay, the project's own (`jupyter_dist.node.relay`), told on stdin which
    ranks to serve, as its agent tells it."""
    from jupyter_dist.node.relay import run_relay

    run_relay(key.encode(), folder, sys.stdin.fileno())


class Responders:
    """The responder processes of one simulated cluster, and a relay a node."""

    def __init__(self, nodes: int, per_node: int, key: str, folder: str, relays: bool) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--serve", str(node), str(per_node), folder],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "JUPYTER_DIST_BENCH_KEY": key},
                text=True,
            )
            for node in range(nodes)
        ]
        self.connections: list[list[dict[str, Any]]] = []
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a responder exited with {proc.wait()}")
            self.connections.append(json.loads(line))
        self.relays: list[subprocess.Popen[str]] = []
        from jupyter_dist.node.relay import IOPUB_SOCKET, SHELL_SOCKET

        for node, conns in enumerate(self.connections if relays else []):
            place = os.path.join(folder, f"relay{node}")
            os.mkdir(place)
            proc = subprocess.Popen(
                [sys.executable, __file__, "--relay", place],
                stdin=subprocess.PIPE,
                env={**os.environ, "JUPYTER_DIST_BENCH_KEY": key},
                text=True,
            )
            assert proc.stdin is not None
            for local, conn in enumerate(conns):
                url = f"ipc://{conn['ip']}"
                iopub, shell = f"{url}-{conn['iopub_port']}", f"{url}-{conn['shell_port']}"
                proc.stdin.write(f"+{node * per_node + local} {iopub} {shell}\n")
                conn["relay_iopub"] = os.path.join(place, IOPUB_SOCKET)
                conn["relay_shell"] = os.path.join(place, SHELL_SOCKET)
            proc.stdin.flush()
            self.relays.append(proc)

    def close(self) -> None:
        for proc in [*self.procs, *self.relays]:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in [*self.procs, *self.relays]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _session(nodes: int, per_node: int, key: str, responders: Responders) -> Any:
    from jupyter_dist.common.spec import SessionSpec
    from jupyter_dist.server_client.attached_session import AttachedSession

    spec = SessionSpec(
        name="simulated", nodes=nodes, procs_per_node=per_node, init_process_group=False
    )
    ranks, entries = [], []
    for node, conns in enumerate(responders.connections):
        for local, conn in enumerate(conns):
            rank = node * per_node + local
            ranks.append({"rank": rank, "pid": None, "state": "idle"})
            entries.append(
                {
                    "rank": rank,
                    "local_rank": local,
                    "node_rank": node,
                    "host": f"node{node}",
                    "connection": conn,
                }
            )
    status = {"spec": spec.to_json(), "state": "ready", "ranks": ranks}
    connection = {"name": "simulated", "key": key, "signature_scheme": "hmac-sha256"}
    return AttachedSession(status, {**connection, "ranks": entries})  # type: ignore[arg-type,typeddict-item]


def _draw(sink: Any, ranks: list[int], done: threading.Event) -> None:
    """The notebook thread's part: every event of every cell through the text renderer."""
    from jupyter_dist.common.events import CellFinished
    from jupyter_dist.display.render_text import TextRenderer

    while not done.is_set():
        renderer = TextRenderer(ranks, io.StringIO(), io.StringIO(), summary=True)
        while True:
            try:
                event = sink.get(timeout=0.2)
            except queue.Empty:
                if done.is_set():
                    return
                continue
            renderer.handle(event)
            if isinstance(event, CellFinished):
                renderer.finish()
                break


async def _cells(session: Any, cells: int) -> dict[str, float]:
    from jupyter_dist.control.event_queue import EventQueue

    await session.connect(120)
    sink = EventQueue()
    done = threading.Event()
    ranks = sorted(session.ranks)
    drawer = threading.Thread(target=_draw, args=(sink, ranks, done), daemon=True)
    drawer.start()
    try:
        for _ in range(3):  # warm-up
            result = await session.execute("x = 1", sink=sink)
            if result.failures:
                raise RuntimeError(f"a warm-up cell failed: {result.failures[0]}")
        walls = []
        cpu0 = time.process_time()
        for _ in range(cells):
            began = time.perf_counter()
            await session.execute("x = 1", sink=sink)
            walls.append(time.perf_counter() - began)
        cpu = (time.process_time() - cpu0) / cells
    finally:
        done.set()
        drawer.join(5)
        await session.close_clients()
    walls.sort()
    return {
        "cpu_per_cell_ms": 1000 * cpu,
        "cpu_per_rank_us": 1e6 * cpu / len(ranks),
        "wall_median_ms": 1000 * statistics.median(walls),
        "wall_p90_ms": 1000 * walls[min(len(walls) - 1, int(0.9 * len(walls)))],
    }


def measure(nodes: int, per_node: int, cells: int, relays: bool) -> dict[str, Any]:
    key = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="jd-sim-") as folder:
        began = time.perf_counter()
        responders = Responders(nodes, per_node, key, folder, relays)
        try:
            session = _session(nodes, per_node, key, responders)
            started = time.perf_counter() - began
            values = asyncio.run(_cells(session, cells))
        finally:
            responders.close()
    return {"nodes": nodes, "ranks_per_node": per_node, "ranks": nodes * per_node,
            "relays": relays, "responders_up_s": started, **values}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--serve", nargs=3, metavar=("NODE", "RANKS", "FOLDER"), help=argparse.SUPPRESS)
    p.add_argument("--nodes", default="2,16,64", help="simulated node counts (default 2,16,64)")
    p.add_argument("--ranks-per-node", type=int, default=16)
    p.add_argument("--cells", type=int, default=20)
    p.add_argument(
        "--relays",
        default="on,off",
        help="with a node's IOPub relay (on), each rank read on its own (off), or both "
        "(on,off: the default)",
    )
    p.add_argument("--relay", metavar="FOLDER", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.relay:
        relay(os.environ["JUPYTER_DIST_BENCH_KEY"], args.relay)
        return 0
    if args.serve:
        node, ranks, folder = args.serve
        serve(int(node), int(ranks), os.environ["JUPYTER_DIST_BENCH_KEY"], folder)
        return 0
    try:
        node_counts = [int(s) for s in args.nodes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--nodes {args.nodes!r}: expected node counts such as 2,16,64")
    per_node = args.ranks_per_node
    if not 1 <= per_node <= MAX_RANKS_PER_NODE:
        p.error(f"--ranks-per-node {per_node}: expected 1 to {MAX_RANKS_PER_NODE}")
    bad = [n for n in node_counts if n < 1 or n * per_node > MAX_RANKS]
    if bad or not node_counts:
        p.error(f"--nodes {args.nodes!r}: expected counts whose ranks are 1 to {MAX_RANKS}")
    if not 1 <= args.cells <= 10_000:
        p.error(f"--cells {args.cells}: expected 1 to 10000")
    modes = [m.strip() for m in args.relays.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        p.error(f"--relays {args.relays!r}: expected on, off or on,off")
    rows = []
    for nodes in node_counts:
        for mode in modes:
            print(f"[simulated] {nodes} nodes x {per_node} ranks, relays {mode} ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            rows.append(measure(nodes, per_node, args.cells, mode == "on"))
    head = ["ranks", "nodes", "relays", "cpu_per_cell_ms", "cpu_per_rank_us", "wall_median_ms",
            "wall_p90_ms", "responders_up_s"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(_fmt(row[h]) for h in head) + " |")
    out = REPO_ROOT / "bench" / "results" / f"simulated-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "cells": args.cells}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nwritten to {out.relative_to(REPO_ROOT)}")
    return 0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if value < 100 else f"{value:.0f}"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
