"""Metrics from inside a rank: ``jupyter_dist.log(step=None, **scalars)`` and samples of
the rank process (CPU %, RSS; GPU utilisation and memory where NVML sees the device).

`log` only appends to a list: no blocking, no I/O. The list goes to the notebook in
batches, at most `FLUSH_S` apart, as one ``jupyter_dist_metrics`` message on the rank
kernel's IOPub channel, tagged with the running cell's request so the notebook knows which
cell it belongs to; whatever is left goes out when the cell ends. Outside a rank kernel
(a script under torchrun) `log` keeps nothing and costs nearly nothing.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from jupyter_dist.common.wire_names import METRICS_MSG_TYPE
from jupyter_dist.settings import DEVICE_VAR

MSG_TYPE = METRICS_MSG_TYPE
FLUSH_S = 0.2
SAMPLE_S = 1.0
MAX_BATCH = 5000  # points in one message; more and a flush happens at once


class MetricsChannel:
    """Batches points and process samples onto the kernel's IOPub."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.points: list[tuple[str, float, float]] = []  # (name, step, value)
        self.steps: dict[str, float] = {}
        self.last_flush = time.monotonic()
        self.parent: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._busy_since: float | None = None
        self._sampler = ProcessSampler()
        threading.Thread(target=self._sample_loop, name="jupyter-dist-metrics", daemon=True).start()

    # -- cell boundaries (IPython events) ---------------------------------------------------
    def pre_execute(self) -> None:
        self.parent = dict(self.kernel.get_parent() or {})
        self._busy_since = time.monotonic()
        self.steps.clear()  # each cell's charts start at step 0: one step axis per cell run

    def post_execute(self) -> None:
        self._busy_since = None
        if self.points:
            self.flush()

    # -- points -------------------------------------------------------------------------
    def log(self, step: float | None, scalars: dict[str, Any]) -> None:
        now = time.monotonic()
        for name, raw in scalars.items():
            value = _scalar(name, raw)
            at = self.steps.get(name, -1.0) + 1 if step is None else float(step)
            self.steps[name] = at
            self.points.append((name, at, value))
        if now - self.last_flush >= FLUSH_S or len(self.points) >= MAX_BATCH:
            self.flush()

    def flush(self, process: dict[str, float] | None = None) -> None:
        with self._lock:
            points, self.points = self.points, []
            self.last_flush = time.monotonic()
            if not points and process is None:
                return
            content: dict[str, Any] = {"points": points}
            if process is not None:
                content["process"] = process
            self.kernel.session.send(
                self.kernel.iopub_socket, MSG_TYPE, content, parent=self.parent
            )

    def _sample_loop(self) -> None:
        """A sample every `SAMPLE_S` while a cell runs. The thread only wakes on its own
        clock (never when a cell starts), and cells shorter than `SAMPLE_S` get no
        sample, so quick cells pay nothing for it."""
        while True:
            time.sleep(SAMPLE_S)
            since = self._busy_since
            if since is not None and time.monotonic() - since >= SAMPLE_S:
                sample = self._sampler.sample()
                if sample and self._busy_since is not None:
                    self.flush(sample)


class ProcessSampler:
    """CPU %, resident memory, and GPU use of this rank's device."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call only starts the clock
        self._nvml: Any = None
        self._handle: Any = None
        self._nvml_tried = False

    def _gpu(self) -> Any:
        if self._nvml_tried:
            return self._handle
        self._nvml_tried = True
        local = os.environ.get("LOCAL_RANK")
        if os.environ.get(DEVICE_VAR) != "cuda" or local is None:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            ids = [v for v in visible.split(",") if v.strip()] if visible else []
            index = int(ids[int(local)]) if ids and ids[int(local)].isdigit() else int(local)
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            self._handle = None
        return self._handle

    def sample(self) -> dict[str, float]:
        try:
            found = {
                "cpu_percent": self.process.cpu_percent(None),
                "rss_mb": self.process.memory_info().rss / 2**20,
            }
        except Exception:
            return {}
        handle = self._gpu()
        if handle is not None:
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                found["gpu_percent"] = float(util.gpu)
                found["gpu_mem_mb"] = memory.used / 2**20
            except Exception:
                pass
        return found


def _scalar(name: str, raw: Any) -> float:
    item = getattr(raw, "item", None)  # tensors and numpy scalars
    value = item() if callable(item) else raw
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"jupyter_dist.log({name}=...): expected a number or a one-element tensor, "
            f"got {type(raw).__name__}"
        ) from None
    return number


_channel: MetricsChannel | None = None


def install(kernel: Any, shell: Any) -> MetricsChannel:
    """Set up the channel in a rank kernel (called by the rank bootstrap)."""
    global _channel
    if _channel is None:
        _channel = MetricsChannel(kernel)
        shell.events.register("pre_execute", _channel.pre_execute)
        shell.events.register("post_execute", _channel.post_execute)
    return _channel


def log(step: float | None = None, **scalars: Any) -> None:
    """Stream scalars to the notebook's cell view: ``log(loss=0.3, lr=1e-3)``.

    ``step`` is the x value (default: how many times this metric was logged before in
    this cell).
    Cheap and non-blocking: points are sent in batches. Outside a rank it does nothing.
    """
    if _channel is not None and scalars:
        _channel.log(step, scalars)
