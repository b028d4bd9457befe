"""torchrun: the reference for cold start (W2) and training speed (W5).

Run directly from the bench process (not from a notebook kernel): `torchrun --standalone
--nproc-per-node 2 script.py`, timed from just before the subprocess starts to the moment
the all_reduce result line is read from its stdout. `--standalone` picks a free rendezvous
port, so the run never collides with anything on the default port 29500. torchrun has no
cells, hence no W1, W3, W4 or W4w.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from workloads import ALLREDUCE_BODY, ALLREDUCE_MARKER, N_RANKS, W5_BODY, Metric, parse_w5

from drivers.base import Driver, Results, keys_of, short_error, w5_metric

PROLOGUE = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
"""
EPILOGUE = "\ndist.destroy_process_group()\n"
NO_CELLS = "torchrun runs a script, not notebook cells"


def torchrun_cmd() -> list[str]:
    bindir = str(Path(sys.executable).parent)
    exe = shutil.which("torchrun", path=bindir) or shutil.which("torchrun")
    head = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    return [*head, "--standalone", f"--nproc-per-node={N_RANKS}"]


def _shown(cmd: list[str]) -> list[str]:
    """The command without this machine's paths."""
    return [Path(cmd[0]).name, *cmd[1:]]


class TorchrunDriver(Driver):
    name = "torchrun"
    description = "torchrun --standalone --nproc-per-node 2 script.py (subprocess of the bench)"

    def run(self, workloads: set[str]) -> Results:
        results: Results = {}
        for w in ("W1", "W3", "W4", "W4w"):
            if w in workloads:
                results.update({k: Metric(na=NO_CELLS) for k in keys_of(w)})
        if "W2" in workloads:
            results.update(self.guarded("W2", self.measure_w2))
            results["w2.restart_s"] = Metric(na="no restart: every run is a cold start")
        if "W5" in workloads:
            results.update(self.guarded("W5", self.measure_w5))
        return results

    def launch(self, body: str, marker: str | None, timeout: float) -> tuple[float | None, str]:
        """Run body under torchrun; (seconds to first line containing marker, all output)."""
        with tempfile.TemporaryDirectory(prefix="jd-bench-") as tmp:
            script = Path(tmp) / "script.py"
            script.write_text(PROLOGUE + body + EPILOGUE)
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [*torchrun_cmd(), str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=tmp,
                start_new_session=True,  # its own process group, ended as one below
            )

            def pump() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.put((time.perf_counter(), line))
                lines.put((time.perf_counter(), None))

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            seen: float | None = None
            out: list[str] = []
            try:
                deadline = t0 + timeout
                while True:
                    try:
                        t, line = lines.get(timeout=max(0.01, deadline - time.perf_counter()))
                    except queue.Empty:
                        raise TimeoutError(
                            f"torchrun did not finish in {timeout:.0f}s: {''.join(out)[-500:]}"
                        ) from None
                    if line is None:
                        break
                    out.append(line)
                    if marker and seen is None and marker in line:
                        seen = t - t0
                rc = proc.wait(timeout=30)
                if rc != 0:
                    raise RuntimeError(f"torchrun exited {rc}: {''.join(out)[-800:]}")
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait(timeout=5)
                reader.join(timeout=5)
            return seen, "".join(out)

    def measure_w2(self) -> Results:
        samples: list[float] = []
        errors: list[str] = []
        for i in range(self.cfg.cold_repeats):
            try:
                seen, out = self.launch(ALLREDUCE_BODY, ALLREDUCE_MARKER, self.cfg.cell_timeout_s)
                if seen is None:
                    raise RuntimeError(f"no all_reduce result printed: {out[-500:]}")
                samples.append(seen)
                self.log(f"W2 cold start {i}: {seen:.2f}s")
            except Exception as exc:
                errors.append(short_error(exc))
        if not samples:
            return {"w2.cold_s": Metric(error="; ".join(errors))}
        return {
            "w2.cold_s": Metric(
                statistics.median(samples),
                "s",
                detail={"samples_s": samples, "errors": errors, "cmd": _shown(torchrun_cmd())},
            )
        }

    def measure_w5(self) -> Results:
        runs = []
        for _ in range(self.cfg.w5_repeats):
            _, out = self.launch(W5_BODY, None, self.cfg.cell_timeout_s)
            runs.append(parse_w5(out))
        return {"w5.steps_per_s": w5_metric(runs)}
