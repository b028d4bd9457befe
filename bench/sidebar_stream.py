"""What the sidebar's live charts cost the Jupyter server: its CPU while one panel listens
to a session's metrics stream.

    .venv/bin/python bench/sidebar_stream.py                 # 32 CPU ranks, 1 Hz, 30 s
    .venv/bin/python bench/sidebar_stream.py --ranks 8 --interval 0.5 --seconds 20

Starts a real ``jupyter server`` with the extension and token auth, starts a session of
``--ranks`` CPU ranks through the REST API (``--no-init``: no process group), then reads
``GET /sessions/NAME/metrics?interval=...`` for ``--seconds``, measuring the CPU time
(user + system) of the server process and of the node's agent (which takes the samples)
over that time, and the same with nobody listening (the baseline). Target (issue
"JupyterLab sidebar"): under 2% of one core for the server at 32 ranks and 1 Hz. Prints a
markdown row and writes bench/results/sidebar-stream-<time>.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.server_process import API, start_server, stop_server  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def agents(server_proc: psutil.Process) -> list[psutil.Process]:
    return [
        p
        for p in server_proc.children(recursive=True)
        if " agent " in " ".join(p.cmdline()) or "jupyter_dist.node" in " ".join(p.cmdline())
    ]


def measure(server: Any, seconds: float, interval: float | None) -> dict[str, float]:
    """CPU of the server and of the agents over ``seconds``, with a listening stream when
    ``interval`` is given; and the samples received."""
    proc = psutil.Process(server.process.pid)
    nodes = agents(proc)
    before = cpu_seconds(proc), sum(cpu_seconds(a) for a in nodes)
    samples = 0
    began = time.monotonic()
    if interval is None:
        time.sleep(seconds)
    else:
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request(
            "GET",
            f"{API}/sessions/bench/metrics?interval={interval}",
            headers={"Authorization": f"token {server.token}"},
        )
        stream = conn.getresponse()
        assert stream.status == 200, stream.status
        while time.monotonic() - began < seconds:
            line = stream.readline()
            if line.startswith(b"data: "):
                samples += 1
        conn.close()
    wall = time.monotonic() - began
    after = cpu_seconds(proc), sum(cpu_seconds(a) for a in nodes)
    return {
        "wall_s": wall,
        "server_cpu_percent": 100 * (after[0] - before[0]) / wall,
        "agent_cpu_percent": 100 * (after[1] - before[1]) / wall,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()

    workdir = RESULTS / "sidebar-stream-work"
    workdir.mkdir(parents=True, exist_ok=True)
    # a 2-core machine allows 8 ranks a node by default; the benchmark asks for more
    limit = {"JUPYTER_DIST_MAX_RANKS_PER_NODE": str(max(args.ranks, 8))}
    server = start_server(workdir, workdir / "config", extra_env=limit)
    try:
        status, created = server.call(
            "POST", f"{API}/sessions", {"name": "bench", "procs": args.ranks, "init": False}
        )
        assert status == 201, created
        time.sleep(3)  # start-up settles
        idle = measure(server, args.seconds, None)
        listening = measure(server, args.seconds, args.interval)
        server.call("DELETE", f"{API}/sessions/bench")
    finally:
        stop_server(server)
    extra = listening["server_cpu_percent"] - idle["server_cpu_percent"]
    print(
        "| ranks | interval | samples | server CPU, nobody listening | server CPU, one panel "
        "| its cost | agent CPU, one panel |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.ranks} | {args.interval:g} s | {listening['samples']} | "
        f"{idle['server_cpu_percent']:.2f}% | {listening['server_cpu_percent']:.2f}% | "
        f"{extra:+.2f}% | {listening['agent_cpu_percent']:.2f}% |"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"sidebar-stream-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
                "idle": idle,
                "listening": listening,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
