"""A handle on the emulated Kubernetes cluster: start it as a subprocess, talk to it, stop it.

``start_cluster(workdir, ...)`` runs ``python -m tests.k8s.api_server`` (API server and
kubelet, see there) on a free port of 127.0.0.1 and returns a ``K8sCluster`` once it
answers: ``kubeconfig`` (path; its user is the notebook's service account), ``url``,
``namespace``, ``token``, plain-HTTP helpers (urllib, with the token) to ``get``, ``list``,
``create``, ``patch`` and ``delete`` any served resource, ``wait_for`` a condition,
``pod_processes()`` (pod name -> pid of each running pod process, from the kubelet's
``pods.json``) and ``log_text()`` (the server's and kubelet's log). ``stop()`` ends the
server, whose kubelet terminates every pod process, then kills any pod process group, or
process ever seen under a pod, still alive and returns what it had to kill (empty when the
kubelet cleaned up).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

from tests.k8s.kinds import path

__all__ = ["ApiCallError", "K8sCluster", "process_group_alive", "start_cluster"]

START_TIMEOUT = 60.0
T = TypeVar("T")


class ApiCallError(Exception):
    """A non-2xx answer from the emulated API server: ``status`` and the decoded ``body``."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body


@dataclasses.dataclass
class K8sCluster:
    """A running emulated cluster (see the module docstring)."""

    url: str
    kubeconfig: Path
    token: str
    workdir: Path
    process: subprocess.Popen[bytes]
    log_file: Path
    namespace: str = "default"

    def request(
        self,
        method: str,
        api_path: str,
        body: Any = None,
        token: str | None = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        """One API call; the decoded JSON (or text) answer, ApiCallError on a non-2xx status.
        ``token=""`` sends no Authorization header."""
        url = self.url + api_path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = {
            "Content-Type": "application/merge-patch+json"
            if method == "PATCH"
            else "application/json"
        }
        token = self.token if token is None else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                raw = response.read().decode()
                if not response.headers.get("Content-Type", "").startswith("application/json"):
                    return raw
                return json.loads(raw)
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                decoded: Any = json.loads(text)
            except ValueError:
                decoded = text
            raise ApiCallError(e.code, decoded) from None

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "GET", path(resource, name, namespace or self.namespace)
        )
        return result

    def get_or_none(
        self, resource: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self.get(resource, name, namespace)
        except ApiCallError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self,
        resource: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        namespace: str | None = None,
    ) -> builtins.list[dict[str, Any]]:
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        answer = self.request(
            "GET", path(resource, None, namespace or self.namespace), params=params
        )
        items: builtins.list[dict[str, Any]] = answer["items"]
        return items

    def create(
        self, resource: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", path(resource, None, namespace or self.namespace), body
        )
        return result

    def patch(
        self, resource: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> Any:
        return self.request("PATCH", path(resource, name, namespace or self.namespace), body)

    def delete(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        propagation: str | None = "Background",
    ) -> Any:
        body = {"propagationPolicy": propagation} if propagation else None
        return self.request("DELETE", path(resource, name, namespace or self.namespace), body)

    def pod_log(self, name: str, namespace: str | None = None) -> str:
        text: str = self.request("GET", path("pods", name, namespace or self.namespace) + "/log")
        return text

    def _record(self) -> dict[str, dict[str, Any]]:
        try:
            record: dict[str, dict[str, Any]] = json.loads((self.workdir / "pods.json").read_text())
        except (OSError, ValueError):
            return {}
        return record

    def pod_processes(self) -> dict[str, int]:
        """Pod name -> pid of every pod process the kubelet runs now (and that is alive)."""
        return {
            entry["name"]: entry["pid"]
            for entry in self._record().values()
            if entry["running"] and process_group_alive(entry["pid"])
        }

    def pod_descendants(self, name: str) -> builtins.list[int]:
        """Pids of every process the kubelet has seen under pod ``name``'s process."""
        return [
            pid
            for entry in self._record().values()
            if entry["name"] == name
            for pid, _started in entry.get("descendants", [])
        ]

    def all_pod_pids(self) -> builtins.list[int]:
        """Pids (= process group ids) of every pod process the kubelet ever started."""
        return [entry["pid"] for entry in self._record().values()]

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
        """Poll ``probe`` until it returns something other than None/False; on timeout fail
        with ``what`` and the last lines of the cluster's log."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value is not None and value is not False:
                return value
            if time.monotonic() > deadline:
                tail = "\n".join(self.log_text().splitlines()[-40:])
                raise AssertionError(
                    f"not within {timeout:.0f}s: {what}\n--- cluster log ---\n{tail}"
                )
            time.sleep(0.2)

    def stop(self) -> builtins.list[str]:
        """Stop the server (its kubelet ends its pods); kill what is left. What was left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        left = []
        for entry in self._record().values():
            where = f"{entry['namespace']}/{entry['name']}"
            if process_group_alive(entry["pid"]):
                left.append(f"{where} (process group {entry['pid']})")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(entry["pid"], signal.SIGKILL)
            for pid, started in entry.get("descendants", []):
                with contextlib.suppress(psutil.Error):
                    child = psutil.Process(pid)
                    if child.create_time() == started and child.status() != psutil.STATUS_ZOMBIE:
                        left.append(f"{where} (descendant {pid}: {' '.join(child.cmdline())})")
                        child.kill()
        return left


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` lives (zombies of the kubelet do not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pgid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            # the leader is a zombie; are others of its group alive?
            return any(_in_group(pid, pgid) for pid in _pids() if pid != pgid)
    return True


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _in_group(pid: int, pgid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


def start_cluster(
    workdir: Path,
    deny: Sequence[str] = (),
    nodes: int = 2,
    node_gpus: int = 0,
    node_cpus: int = 4,
    node_memory: str = "16Gi",
    node_resources: Mapping[int, Mapping[str, int]] | None = None,
    kueue: bool = True,
) -> K8sCluster:
    """Start an emulated cluster whose files live under ``workdir``; return once it serves.
    ``node_resources``: node index -> extended resources it offers besides ``node_gpus``
    of ``nvidia.com/gpu`` (``{1: {"nvidia.com/mig-1g.10gb": 7}}``); ``kueue``: whether
    Kueue runs there (the emulator's queue controller and its API group)."""
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = workdir / "kubeconfig"
    log_file = workdir / "cluster.log"
    argv = [
        sys.executable,
        "-m",
        "tests.k8s.api_server",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--workdir",
        str(workdir),
        "--nodes",
        str(nodes),
        "--node-gpus",
        str(node_gpus),
        "--node-cpus",
        str(node_cpus),
        "--node-memory",
        node_memory,
    ]
    for spec in deny:
        argv += ["--deny", spec]
    if not kueue:
        argv.append("--no-kueue")
    for node, offered in (node_resources or {}).items():
        argv += [
            a for name, n in offered.items() for a in ("--node-resource", f"{node}:{name}={n}")
        ]
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=os.getcwd(),
        )
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    line = b""
    while not line.startswith(b"READY"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([process.stdout], [], [], remaining)[0]:
            break
        line = process.stdout.readline()
        if not line:  # it exited
            break
    if not line.startswith(b"READY"):
        process.kill()
        process.wait()
        raise RuntimeError(
            f"the emulated cluster did not start ({argv}):\n{log_file.read_text(errors='replace')}"
        )
    process.stdout.close()
    config = json.loads(kubeconfig.read_text())
    return K8sCluster(
        url=line.decode().split()[1],
        kubeconfig=kubeconfig,
        token=config["users"][0]["user"]["token"],
        workdir=workdir,
        process=process,
        log_file=log_file,
    )
