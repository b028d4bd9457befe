"""A notebook kernel in the Ray head's network namespace, as a session owner must run.

The kernel's sockets are Unix sockets (transport ``ipc``): the kernel's loopback is the
head namespace's, which a client outside it does not reach, while files are shared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

from .cluster import RayCluster

__all__ = ["HEAD_KERNEL", "TRANSPORT", "head_kernelspecs", "socket_prefix"]

HEAD_KERNEL = "ray-head"
TRANSPORT = "ipc"


def head_kernelspecs(cluster: RayCluster, folder: Path) -> KernelSpecManager:
    """Kernelspecs holding ``HEAD_KERNEL``: this Python's ipykernel in the head's namespace.

    Its environment is the kernel manager's (the caller adds ``cluster.env``): the token
    is never written to the kernelspec.
    """
    spec_dir = folder / "kernels" / HEAD_KERNEL
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {
        "argv": cluster.driver_argv(argv),
        "display_name": "Python 3 (Ray head node)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(folder / "kernels")])


def socket_prefix(folder: Path) -> str:
    """The kernel's socket paths' prefix (``ip`` of an ``ipc`` kernel): absolute, since the
    kernel and its client run in different folders."""
    return str(folder.absolute() / "kernel")
