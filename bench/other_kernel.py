"""W4w's "another session": a second, plain notebook kernel answering `1+1` during a flood.

The runner starts that kernel (a `NotebookKernel` without jupyter_dist, so it is shut down
and reaped like every other) before the flood. The cells are sent by a separate process,
this file run as a script, that connects to the kernel with its connection file and runs
`1+1` again and again (a short pause between cells) until told to stop. A separate process
rather than a thread, so the runner's own work reading the flood (it decodes every IOPub
message) cannot delay the probe's round trips through a shared GIL. A round trip is what
W1 times: from sending the execute_request to having its reply and its `idle` status.

Times are CLOCK_MONOTONIC, which both processes share: the runner says which stretches
were floods (`during`), and the probe's samples are sorted into those and the rest.

    python bench/other_kernel.py CONNECTION_FILE [--pause S] [--max-s S]

prints `ready` once connected and warmed up, then, after a line (or EOF) on stdin, one
JSON line `{"samples": [[sent, round_trip_s], ...], "errors": [...]}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import select
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from notebook_kernel import CellTimeout, NotebookKernel
from workloads import OTHER_KERNEL_CELL, OTHER_KERNEL_PAUSE_S

WARMUP_CELLS = 3
CELL_TIMEOUT_S = 30.0


def monotonic() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def perf_to_monotonic() -> float:
    """What to add to a time.perf_counter() value to get CLOCK_MONOTONIC."""
    return monotonic() - time.perf_counter()


# -- the probe process ------------------------------------------------------------------------


def _stop_asked() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable)


def probe_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="round trips of a trivial cell on a kernel")
    p.add_argument("connection_file")
    p.add_argument("--pause", type=float, default=OTHER_KERNEL_PAUSE_S)
    p.add_argument("--max-s", type=float, default=600.0)
    args = p.parse_args(argv)

    from jupyter_client.blocking.client import BlockingKernelClient

    kc = BlockingKernelClient(connection_file=args.connection_file)
    kc.load_connection_file()
    kc.start_channels()
    samples: list[tuple[float, float]] = []
    errors: list[str] = []
    try:
        kc.wait_for_ready(timeout=60)
        nk = NotebookKernel(cwd=Path.cwd())
        nk.kc = kc  # only its cell loop is used: the runner owns the kernel
        for _ in range(WARMUP_CELLS):
            nk.run(OTHER_KERNEL_CELL, timeout=CELL_TIMEOUT_S, track=False)
        print("ready", flush=True)
        end = monotonic() + args.max_s
        while monotonic() < end and not _stop_asked():
            sent = monotonic()
            try:
                res = nk.execute(OTHER_KERNEL_CELL, timeout=CELL_TIMEOUT_S, track=False)
                samples.append((sent, res.elapsed))
                if res.status != "ok":
                    errors.append(f"cell ended {res.status}: {res.error}")
            except CellTimeout as exc:
                samples.append((sent, monotonic() - sent))
                errors.append(str(exc).splitlines()[0])
            time.sleep(args.pause)
    finally:
        print(json.dumps({"samples": samples, "errors": errors}), flush=True)
        kc.stop_channels()
    return 0


# -- the runner's side ------------------------------------------------------------------------


@dataclass
class ProbeResult:
    samples: list[tuple[float, float]]  # (sent, round trip in s), CLOCK_MONOTONIC
    errors: list[str] = field(default_factory=list)

    def during(self, windows: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
        """Round trips (ms) that overlapped one of the windows, and those that did not."""
        inside: list[float] = []
        outside: list[float] = []
        for sent, rtt in self.samples:
            hit = any(sent <= end and sent + rtt >= start for start, end in windows)
            (inside if hit else outside).append(rtt * 1000)
        return inside, outside


def describe_ms(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p90": ordered[max(0, round(0.9 * len(ordered)) - 1)],
        "max": ordered[-1],
        "min": ordered[0],
    }


class OtherKernelProbe:
    """Runs `probe_main` in a child process against a kernel's connection file."""

    def __init__(self, connection_file: str, stderr: IO[bytes] | None = None) -> None:
        self.connection_file = connection_file
        self.stderr = stderr
        self.proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    def start(self, timeout: float = 90.0) -> OtherKernelProbe:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), self.connection_file],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr if self.stderr is not None else subprocess.DEVNULL,
            text=True,
            cwd=str(Path(__file__).resolve().parent),
        )
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        line = self._next_line(timeout)
        if line != "ready":
            raise RuntimeError(f"the other kernel's probe did not start: {line!r}")
        return self

    def _read(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _next_line(self, timeout: float) -> str | None:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self, timeout: float = 60.0) -> ProbeResult:
        """Ask the probe to stop; its samples."""
        if self.proc is None or self.proc.stdin is None:
            raise RuntimeError("probe not started")
        with contextlib.suppress(OSError):
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            self.proc.stdin.close()
        deadline = time.monotonic() + timeout
        while True:
            line = self._next_line(max(0.01, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError("the other kernel's probe ended without its samples")
            if line.startswith("{"):
                data = json.loads(line)
                samples = [(float(s), float(r)) for s, r in data["samples"]]
                return ProbeResult(samples, [str(e) for e in data.get("errors", [])])

    def close(self) -> None:
        """End the probe process (ours) if it is still running."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> OtherKernelProbe:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(probe_main())
