"""A real notebook kernel (ipykernel) in the Ray head's namespace, driven from the test.

A session's owner must run where a Ray driver can: beside a raylet on its own address,
so the notebook kernel runs in the head node's namespace (``RayCluster.driver_argv``) with
the cluster's environment. It listens on Unix sockets (``ipc``), which the test process
reaches across namespaces, and shows output as text (``JUPYTER_DIST_OUTPUT=text``).

    with notebook_kernel(cluster, tmp_path) as kernel:
        reply = kernel.run("%%distributed --ray --nodes 2 --procs 1\\nprint(1)")
        assert reply.ok, reply.text
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager

from tests.conftest import wait_until_ready

from .cluster import RayCluster
from .head_kernel import HEAD_KERNEL, TRANSPORT, head_kernelspecs, socket_prefix


@dataclasses.dataclass
class Reply:
    """What a cell showed: its status, its text (streams, results, the error)."""

    ok: bool
    text: str


class NetnsKernel:
    """A notebook kernel in the head's namespace, and a client of it."""

    def __init__(self, km: KernelManager) -> None:
        self.km = km
        self.kc = km.client()
        self.kc.start_channels()
        wait_until_ready(self.kc, 120, alive=km.is_alive)

    @property
    def pid(self) -> int:
        provisioner = self.km.provisioner
        assert provisioner is not None
        pid = getattr(provisioner, "pid", None)
        assert isinstance(pid, int)
        return pid

    def run(self, code: str, timeout: float = 240, stop_on_error: bool = True) -> Reply:
        """Run ``code`` as a cell; what it showed, once it ended. With ``stop_on_error``
        (as a notebook sends it) a failed cell makes the kernel abort what was sent before
        it has handled the failure, so the next cell may come too soon."""
        parts: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                parts.append(content.get("data", {}).get("text/plain", "") + "\n")
            elif kind == "error":
                parts.append("\n".join(content.get("traceback", [])) + "\n")
                parts.append(f"{content.get('ename')}: {content.get('evalue')}\n")

        reply = self.kc.execute_interactive(
            code, timeout=timeout, output_hook=hook, stop_on_error=stop_on_error
        )
        return Reply(reply["content"]["status"] == "ok", "".join(parts))

    def kill(self) -> None:
        """SIGKILL the kernel process (a notebook kernel that dies)."""
        os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=False)


@contextlib.contextmanager
def notebook_kernel(
    cluster: RayCluster, folder: Path, env: Mapping[str, str] | None = None
) -> Iterator[NetnsKernel]:
    """A started kernel in the head's namespace; shut down (or killed) on exit."""
    km = KernelManager(
        kernel_name=HEAD_KERNEL, kernel_spec_manager=head_kernelspecs(cluster, folder)
    )
    km.transport = TRANSPORT
    km.ip = socket_prefix(folder)
    kernel_env = cluster.driver_env(JUPYTER_DIST_OUTPUT="text", **dict(env or {}))
    km.start_kernel(env=kernel_env, cwd=str(folder))
    kernel: NetnsKernel | None = None
    try:
        kernel = NetnsKernel(km)
        yield kernel
    finally:
        if kernel is not None:
            if km.is_alive():  # a killed one would be waited for until the timeout
                with contextlib.suppress(Exception):
                    kernel.run("%dist shutdown --all", timeout=60)
            kernel.close()
        elif km.is_alive():
            km.shutdown_kernel(now=True)
