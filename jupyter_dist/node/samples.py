"""What a node's agent reports for the sidebar's live charts: the node's CPU and memory,
each rank's CPU and resident memory, and each GPU's utilisation and memory through NVML
(CUDA is never initialised here: the agent forks ranks).

psutil measures a CPU percentage between two calls, so the sampler keeps its process
objects from one sample to the next; the first sample of a process says 0.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psutil

from jupyter_dist.common.payloads import GPUSample, NodeSample, RankSample

log = logging.getLogger(__name__)
MIB = 1 << 20


class Sampler:
    """Samples on demand (the agent's poll loop asks; no thread)."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._nvml: Any = None
        self._nvml_tried = False
        psutil.cpu_percent(interval=None)  # the first call only starts the count

    def sample(self, pids: Mapping[int, int]) -> NodeSample:
        """``pids``: rank -> pid of this node's ranks."""
        memory = psutil.virtual_memory()
        return {
            "cpu_percent": psutil.cpu_percent(interval=None),
            "cpus": psutil.cpu_count() or 1,
            "mem_used_mib": (memory.total - memory.available) / MIB,
            "mem_total_mib": memory.total / MIB,
            "gpus": self._gpus(),
            "ranks": [self._rank(rank, pid) for rank, pid in sorted(pids.items())],
        }

    def _rank(self, rank: int, pid: int) -> RankSample:
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_percent(interval=None)
                rss = proc.memory_info().rss / MIB
        except psutil.Error:
            self._procs.pop(pid, None)
            return {"rank": rank, "pid": pid, "cpu_percent": None, "rss_mib": None}
        return {"rank": rank, "pid": pid, "cpu_percent": cpu, "rss_mib": rss}

    def forget(self, live: set[int]) -> None:
        for pid in set(self._procs) - live:
            del self._procs[pid]

    def _gpus(self) -> list[GPUSample]:
        nvml = self._nvml_module()
        if nvml is None:
            return []
        found: list[GPUSample] = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                name = nvml.nvmlDeviceGetName(handle)
                found.append(
                    {
                        "index": index,
                        "name": name.decode() if isinstance(name, bytes) else str(name),
                        "util_percent": float(rates.gpu),
                        "mem_used_mib": memory.used / MIB,
                        "mem_total_mib": memory.total / MIB,
                    }
                )
        except Exception as err:  # a GPU fell off the bus, a driver reload: say nothing
            log.info("NVML sampling failed: %s", err)
            return []
        return found

    def _nvml_module(self) -> Any:
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no NVIDIA driver here: CPU and memory only
                self._nvml = None
        return self._nvml
