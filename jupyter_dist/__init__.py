"""jupyter_dist: run notebook cells on persistent multi-GPU, multi-node PyTorch ranks.

In a notebook::

    %load_ext jupyter_dist
    %%distributed --procs 2
    import torch.distributed as dist
    ...

Inside a rank: `info`, `shard` and `DistributedSampler`. Heavy modules (torch, IPython)
load only when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jupyter_dist._version import __version__

if TYPE_CHECKING:
    from torch.utils.data.distributed import DistributedSampler

    from jupyter_dist.errors import (
        CellTimeout,
        DistError,
        NoGPUError,
        PullError,
        PushError,
        RanksFailed,
        SessionError,
        SpecError,
    )
    from jupyter_dist.rank.helpers import RankInfo, info, shard

__all__ = [
    "CellTimeout",
    "DistError",
    "DistributedSampler",
    "NoGPUError",
    "PullError",
    "PushError",
    "RankInfo",
    "RanksFailed",
    "SessionError",
    "SpecError",
    "__version__",
    "_jupyter_labextension_paths",
    "_jupyter_server_extension_points",
    "info",
    "load_ipython_extension",
    "log",
    "shard",
    "unload_ipython_extension",
]

_LAZY = {
    "info": "jupyter_dist.rank.helpers",
    "shard": "jupyter_dist.rank.helpers",
    "log": "jupyter_dist.rank.metrics",
    "RankInfo": "jupyter_dist.rank.helpers",
    "DistributedSampler": "torch.utils.data.distributed",
    "CellTimeout": "jupyter_dist.errors",
    "DistError": "jupyter_dist.errors",
    "NoGPUError": "jupyter_dist.errors",
    "PullError": "jupyter_dist.errors",
    "PushError": "jupyter_dist.errors",
    "RanksFailed": "jupyter_dist.errors",
    "SessionError": "jupyter_dist.errors",
    "SpecError": "jupyter_dist.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jupyter_dist' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The jupyter-server extension: sessions owned by the server."""
    from jupyter_dist.server.app import DistServerApp

    return [{"module": "jupyter_dist.server.app", "app": DistServerApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The JupyterLab sidebar, built into ``labextension/`` beside this file."""
    return [{"src": "labextension", "dest": "jupyter-dist-labextension"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_dist``: register ``%%distributed`` and ``%dist``."""
    from jupyter_dist.notebook.magics import DistMagics

    ipython.register_magics(DistMagics(ipython))


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext jupyter_dist``: stop this kernel's sessions."""
    from jupyter_dist.notebook.owners import session_owner

    session_owner().close()
