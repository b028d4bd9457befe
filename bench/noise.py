"""How busy the machine was with processes that are not the benchmark's own.

On a 2-core machine anything else running (a test suite, a build) shows up directly in
the numbers. `ForeignLoad` samples, every `interval` seconds in a background thread, the
CPU used by processes that are neither this process, nor its descendants, nor tagged by a
`NotebookKernel` (see notebook_kernel.TAG_VAR), so each peer's numbers can be reported
with the foreign load during its measurement.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time

import psutil
from notebook_kernel import TAG_VAR


def _is_ours(proc: psutil.Process, me: int) -> bool:
    try:
        if proc.pid == me or any(p.pid == me for p in proc.parents()):
            return True
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            return f"{TAG_VAR}=".encode() in f.read()
    except (psutil.Error, OSError):
        return False


class ForeignLoad:
    """Background sampler of other processes' CPU use, in % of one core."""

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="foreign-load", daemon=True)
        self._procs: dict[int, psutil.Process] = {}
        self._ours: dict[int, bool] = {}

    def start(self) -> ForeignLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            total = 0.0
            alive = set()
            for proc in psutil.process_iter():
                pid = proc.pid
                alive.add(pid)
                known = self._procs.get(pid)
                if known is None:
                    self._procs[pid] = known = proc
                    self._ours[pid] = _is_ours(proc, me)
                    with contextlib.suppress(psutil.Error):
                        known.cpu_percent(None)  # first call only primes the counter
                    continue
                if self._ours[pid]:
                    continue
                with contextlib.suppress(psutil.Error):
                    total += known.cpu_percent(None)
            for pid in set(self._procs) - alive:
                self._procs.pop(pid, None)
                self._ours.pop(pid, None)
            self.samples.append((time.perf_counter(), total))
            self._stop.wait(self.interval)

    def mean_between(self, t0: float, t1: float) -> float | None:
        """Mean foreign CPU % (of one core) sampled between two perf_counter() times."""
        window = [v for t, v in self.samples if t0 <= t <= t1]
        return statistics.mean(window) if window else None

    def busy_now(self, seconds: float = 1.0) -> float:
        """Foreign CPU % over the next `seconds` (blocks)."""
        t0 = time.perf_counter()
        time.sleep(seconds + self.interval)
        return self.mean_between(t0, time.perf_counter()) or 0.0
