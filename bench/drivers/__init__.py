"""One module per peer; `DRIVERS` maps the short names `run.py --peers` accepts to them."""

from __future__ import annotations

from drivers.base import Driver
from drivers.ipyparallel import IpyparallelDriver
from drivers.jupyter_dist import JupyterDistDriver
from drivers.nbdistributed import NbdistributedDriver
from drivers.torchrun import TorchrunDriver

DRIVERS: dict[str, type[Driver]] = {
    "jupyter_dist": JupyterDistDriver,
    "ipyparallel": IpyparallelDriver,
    "nbdistributed": NbdistributedDriver,
    "torchrun": TorchrunDriver,
}

__all__ = ["DRIVERS", "Driver"]
