"""The Ray actor that holds one node of a session: it runs ``jupyter_dist.node.dial_back``.

A session's Ray driver (``control.launchers.ray_driver``) makes one `RayNodeHost` actor per
bundle of the session's placement group. The actor holds the bundle's CPUs and GPUs for as
long as it lives, and starts the node's dial-back process with the interpreter it runs in
(Ray's worker, or its runtime environment's): that process inherits the GPUs Ray gave the
actor (``CUDA_VISIBLE_DEVICES``), dials the session's owner, and runs the node's agent.

The node's credentials are the first line of the dial-back process's stdin, which the
actor keeps open and never writes again: when the actor's process ends, killed by Ray or
not, that stdin ends, and the dial-back process closes its connection, its agents stop
their ranks (children in sessions of their own, which Ray would not kill), and it exits.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import sys
import tempfile
from typing import IO, Any

#: the node side's module the actor runs (``node.dial_back``)
DIAL_BACK_MODULE = "jupyter_dist.node.dial_back"
#: seconds the dial-back process keeps dialling while no listener answers
REDIAL_FOR_S = 30
#: lines of the dial-back process's stderr kept for the driver's messages
STDERR_LINES = 30


class RayNodeHost:
    """One node of a session on Ray: the dial-back process and the resources it runs with."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def start(self, listener: str, credentials: str, python: str | None = None) -> dict[str, Any]:
        """Start the dial-back process toward ``listener`` (``HOST:PORT``); what the node
        is: its address as Ray knows it, its hostname, Ray's node id, the GPUs Ray gave."""
        import ray

        if self.process is not None:
            raise RuntimeError("this node's dial-back process was started already")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (read until the actor ends)
        argv = [python or sys.executable, "-m", DIAL_BACK_MODULE, listener]
        argv += ["--credentials", "-", "--watch-stdin", "--retry", str(REDIAL_FOR_S)]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._stderr
        )
        assert self.process.stdin is not None
        self.process.stdin.write(credentials.encode() + b"\n")
        self.process.stdin.flush()  # and kept open: its end is this process's end
        context = ray.get_runtime_context()
        return {
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "hostname": socket.gethostname(),
            "node_id": context.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": self.process.pid,
            "actor_pid": os.getpid(),
        }

    def wait(self) -> dict[str, Any]:
        """Block until the dial-back process exits: its status and the end of its stderr."""
        if self.process is None:
            return {"code": None, "stderr": "it was never started"}
        code = self.process.wait()
        return {"code": code, "stderr": self.stderr_tail()}

    def stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        tail = collections.deque(self._stderr, maxlen=STDERR_LINES)
        return b"".join(tail).decode(errors="replace").strip()


__all__ = ["RayNodeHost"]
