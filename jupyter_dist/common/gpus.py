"""Find a node's CUDA devices without initialising CUDA.

The node agent forks rank kernels, and a process that has initialised CUDA cannot fork
children that use it; so devices are counted through NVML (nvidia-ml-py), which opens
no CUDA context. ``CUDA_VISIBLE_DEVICES`` is honoured like CUDA would.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from jupyter_dist.common.payloads import GPUJSON

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GPUInfo:
    """One CUDA device as NVML reports it."""

    index: int
    name: str
    memory_total_mib: int
    uuid: str

    def to_json(self) -> GPUJSON:
        return {
            "index": self.index,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "uuid": self.uuid,
        }


def _visible(devices: list[GPUInfo], visible: str | None) -> list[GPUInfo]:
    """Apply CUDA_VISIBLE_DEVICES (indices or UUIDs) the way the CUDA runtime does."""
    if visible is None:
        return devices
    chosen: list[GPUInfo] = []
    for item in (v.strip() for v in visible.split(",")):
        if not item:
            break
        match = [d for d in devices if str(d.index) == item or d.uuid.startswith(item)]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen.append(match[0])
    return [GPUInfo(i, d.name, d.memory_total_mib, d.uuid) for i, d in enumerate(chosen)]


def discover_gpus() -> list[GPUInfo]:
    """The CUDA devices this process may use; empty without NVIDIA drivers."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.debug("NVML not available: %s", err)
        return []
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            devices.append(
                GPUInfo(
                    index,
                    name.decode() if isinstance(name, bytes) else str(name),
                    int(memory.total) // (1024 * 1024),
                    uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                )
            )
    finally:
        pynvml.nvmlShutdown()
    return _visible(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
