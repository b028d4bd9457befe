"""The containers of the emulated kubelet: each pod's process, its end, and the record.

A container here is a local process in a session of its own (``pod_runner.start``) with
``pod_network.c`` preloaded, so it leaves from its pod IP and sees that address on ``lo``
(what gloo and a route probe look at), as in a pod's own network namespace. It ends as a
container would: SIGTERM to its process group, SIGKILL after its grace period (capped at
``MAX_GRACE_SECONDS``); then everything of it goes, as its cgroup would: the group, what was
under the process, and every process ever seen under it even if it left the group and its
parent since. ``<workdir>/pods.json`` records every pod process started (namespace, name,
uid, pid, pod IP, whether it runs, the processes seen under it) for the test fixture.

Not played: cgroups (limits, accounting), namespaces other than the loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["MAX_GRACE_SECONDS", "POD_IP_VAR", "Containers", "PodProcess", "build_pod_network"]

log = logging.getLogger("k8s.kubelet")

MAX_GRACE_SECONDS = 5.0
#: where ``pod_network.c`` reads the pod's IP
POD_IP_VAR = "K8S_EMULATOR_POD_IP"


@dataclasses.dataclass
class PodProcess:
    """A pod's container process, from start until the kubelet is done with it."""

    namespace: str
    name: str
    uid: str
    process: subprocess.Popen[bytes]
    sandbox: Path
    grace: float
    started: str
    kill_at: float | None = None
    descendants: list[psutil.Process] = dataclasses.field(default_factory=list)
    container: str = ""
    init: bool = False  # an init container: the pod's next container follows its end


def build_pod_network(workdir: Path) -> Path | None:
    """Compile ``pod_network.c`` (the pod's own loopback address, see there) into
    ``workdir``; None, with a warning, where no C compiler is at hand."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    out = workdir / "pod_network.so"
    if compiler is None:
        log.warning("no C compiler: pods leave from 127.0.0.1, not from their pod IP")
        return None
    source = Path(__file__).with_name("pod_network.c")
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(source), "-ldl"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        log.warning("cannot build %s (%s): pods leave from 127.0.0.1", source, done.stderr.strip())
        return None
    return out


class Containers:
    """The pod processes of one kubelet, by pod uid, and their record in ``pods.json``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: dict[str, PodProcess] = {}
        self.record: dict[str, dict[str, Any]] = {}

    def add(self, pod: PodProcess, pod_ip: str) -> None:
        """A pod's container process started (the one after its init containers, if any:
        the record keeps what was seen under those)."""
        self.running[pod.uid] = pod
        seen = self.record.get(pod.uid, {}).get("descendants", [])
        self.record[pod.uid] = {
            "namespace": pod.namespace,
            "name": pod.name,
            "pid": pod.process.pid,
            "pod_ip": pod_ip,
            "running": True,
            "container": pod.container,
            "descendants": seen,
        }
        self.write_record()  # before the API says Running: whoever sees that finds the pid

    async def end_all(self) -> None:
        """Terminate every pod process, and kill what outlives the grace period."""
        for pod in list(self.running.values()):
            self.terminate(pod, grace=MAX_GRACE_SECONDS)
        deadline = time.monotonic() + MAX_GRACE_SECONDS + 1
        while self.running and time.monotonic() < deadline:
            self.reap_killed()
            await asyncio.sleep(0.1)
        for pod in list(self.running.values()):
            self.kill(pod)
        self.reap_killed()
        self.write_record()

    def terminate(self, pod: PodProcess, grace: float) -> None:
        with contextlib.suppress(psutil.Error):
            pod.descendants = psutil.Process(pod.process.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pod.process.pid, signal.SIGTERM)
        pod.kill_at = time.monotonic() + grace

    def kill_group(self, pod: PodProcess) -> None:
        """Everything of the container, as its cgroup would go: the process group, what was
        under the process at SIGTERM, and every process ever seen under it (even if it
        left the group and its parent since)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pod.process.pid, signal.SIGKILL)
        for child in pod.descendants:
            with contextlib.suppress(psutil.Error):
                child.kill()
        for pid, started in self.record[pod.uid].get("descendants", []):
            with contextlib.suppress(psutil.Error):
                seen = psutil.Process(pid)
                if seen.create_time() == started:
                    seen.kill()

    def kill(self, pod: PodProcess) -> None:
        log.info("kubelet: SIGKILL %s/%s (pid %d)", pod.namespace, pod.name, pod.process.pid)
        with contextlib.suppress(psutil.Error):
            pod.descendants += psutil.Process(pod.process.pid).children(recursive=True)
        self.kill_group(pod)
        with contextlib.suppress(subprocess.TimeoutExpired):
            pod.process.wait(timeout=2)

    def reap_killed(self) -> None:
        """Pods being terminated: forget those whose process ended, SIGKILL the overdue."""
        for pod in list(self.running.values()):
            if pod.kill_at is None:
                continue
            if pod.process.poll() is None and time.monotonic() >= pod.kill_at:
                self.kill(pod)
            if pod.process.poll() is not None:
                log.info(
                    "kubelet: %s/%s ended (%s)", pod.namespace, pod.name, pod.process.returncode
                )
                self.kill_group(pod)
                self.forget(pod)

    def forget(self, pod: PodProcess, keep_sandbox: bool = False) -> None:
        """The process is gone; so is the pod's sandbox unless the pod goes on (an init
        container ended well: the volumes stay for the next container)."""
        self.running.pop(pod.uid, None)
        self.record[pod.uid]["running"] = False
        if not keep_sandbox:
            shutil.rmtree(pod.sandbox, ignore_errors=True)
        self.write_record()

    def note_descendants(self) -> None:
        """Remember every process under each running pod (pid, start time), so that what
        escaped a pod's process group can still be found and killed at the end."""
        for pod in self.running.values():
            with contextlib.suppress(psutil.Error):
                known = {tuple(d) for d in self.record[pod.uid].get("descendants", [])}
                for child in psutil.Process(pod.process.pid).children(recursive=True):
                    known.add((child.pid, child.create_time()))
                self.record[pod.uid]["descendants"] = sorted(known)

    def write_record(self) -> None:
        tmp = self.workdir / "pods.json.tmp"
        tmp.write_text(json.dumps(self.record, indent=1))
        tmp.replace(self.workdir / "pods.json")
