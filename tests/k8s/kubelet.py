"""The node side of the emulated cluster: scheduler, kubelet, Job controller and GC loop.

One asyncio task polls the API server every ``POLL_SECONDS`` with its own token (never
the emulator's memory) and plays, in turn: the garbage collector and the Job controller
(``job_controller.py``), the scheduler (``scheduler.py``: binds a pod by patching
``spec.nodeName``, or marks it Unschedulable and writes a FailedScheduling Event) and the
kubelet: a bound pod's container starts as a local process (``pod_runner.py``), its status
becomes Running (``CONTAINER_CREATING_SECONDS`` after it was bound) with its own loopback
``podIP`` (127.0.0.2, 127.0.0.3, ...), ``hostIP`` of its node (127.1.0.N), Ready
conditions and a running containerStatus; when the process
exits, Succeeded or Failed with the terminated state (exitCode; 128 + signal when killed).
When a pod leaves the API (deleted, or collected with its Job), its container ends
(``containers.py``: SIGTERM, SIGKILL after ``terminationGracePeriodSeconds`` capped at
``MAX_GRACE_SECONDS``, everything of it as its cgroup would go); so does the rest of a
container whose main process exits.

Registers the fake nodes ``node-0``... (labels ``kubernetes.io/hostname``, allocatable
cpu, memory, ``nvidia.com/gpu``) at start. Keeps
``<workdir>/pods.json`` up to date (every pod process it started: namespace, name, uid,
pid, whether running) for the test fixture, and a log line per action on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from tests.k8s.containers import (
    MAX_GRACE_SECONDS,
    POD_IP_VAR,
    Containers,
    PodProcess,
    build_pod_network,
)
from tests.k8s.job_controller import JobController, collect_garbage, iso
from tests.k8s.kube_client import ApiClient, ApiError
from tests.k8s.pod_runner import ConfigError, plan_launch, start
from tests.k8s.scheduler import NodeShape, Scheduler

__all__ = ["MAX_GRACE_SECONDS", "POLL_SECONDS", "Kubelet", "NodeShape"]

log = logging.getLogger("k8s.kubelet")

POLL_SECONDS = 0.2
#: how long a bound pod is ContainerCreating before its process starts (a real node's
#: sandbox and image): what a pod reads at start (its Secret) may be created meanwhile
CONTAINER_CREATING_SECONDS = 1.0


def _pod_ips() -> Any:
    """127.0.0.2, 127.0.0.3, ... 127.0.1.1, ...: one loopback address per pod, never reused."""
    n = 2
    while True:
        if n % 256 not in (0, 255):
            yield f"127.0.{n // 256}.{n % 256}"
        n += 1


class Kubelet:
    """Enter to register nodes and start the loop; exit to stop it and end every pod process."""

    def __init__(
        self, url: str, token: str, nodes: list[NodeShape], workdir: Path, api_port: int
    ) -> None:
        self.client = ApiClient(url, token)
        self.nodes = nodes
        self.node_ips = {n.name: f"127.1.0.{i + 1}" for i, n in enumerate(nodes)}
        self.workdir = workdir
        self.log_dir = workdir / "logs"
        self.sandboxes = workdir / "pods"
        self.api_port = api_port
        self.jobs = JobController(self.client)
        self.scheduler = Scheduler(self.client, nodes, self.node_ips)
        self.containers = Containers(workdir)
        self.started: set[str] = set()
        self._ips = _pod_ips()
        self._reported: dict[str, str] = {}  # pod uid -> the last config error written
        self._task: asyncio.Task[None] | None = None
        self._pod_network: Path | None = None
        self._bound_at: dict[str, float] = {}  # pod uid -> when this kubelet first saw it bound

    async def __aenter__(self) -> Kubelet:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.sandboxes.mkdir(parents=True, exist_ok=True)
        await self.client.__aenter__()
        self._pod_network = build_pod_network(self.workdir)
        for node in self.nodes:
            await self.client.create("nodes", self._node_object(node), None)
        self.containers.write_record()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.containers.end_all()
        await self.client.__aexit__()

    def _node_object(self, node: NodeShape) -> dict[str, Any]:
        return {
            "metadata": {
                "name": node.name,
                "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                },
            },
            "status": {
                "capacity": node.allocatable(),
                "allocatable": node.allocatable(),
                "addresses": [
                    {"type": "InternalIP", "address": self.node_ips[node.name]},
                    {"type": "Hostname", "address": node.name},
                ],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        }

    async def _loop(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("control loop tick failed; next tick in %ss", POLL_SECONDS)
            await asyncio.sleep(POLL_SECONDS)

    async def _tick(self) -> None:
        objects = {
            r: await self.client.list(r)
            for r in ("jobs", "pods", "secrets", "configmaps", "services")
        }
        deleted = await collect_garbage(self.client, objects)
        jobs = [j for j in objects["jobs"] if j["metadata"]["uid"] not in deleted]
        pods = [p for p in objects["pods"] if p["metadata"]["uid"] not in deleted]
        await self.jobs.reconcile(jobs, pods)
        pods = await self.client.list("pods")
        await self.scheduler.schedule(pods)
        await self._run(pods)

    async def _run(self, pods: list[dict[str, Any]]) -> None:
        present = {p["metadata"]["uid"] for p in pods}
        for uid, gone in list(self.containers.running.items()):
            if uid not in present and gone.kill_at is None:
                log.info(
                    "kubelet: pod %s/%s deleted: SIGTERM its process group",
                    gone.namespace,
                    gone.name,
                )
                self.containers.terminate(gone, gone.grace)
        self.containers.reap_killed()
        for pod in pods:
            meta, phase = pod["metadata"], pod.get("status", {}).get("phase", "Pending")
            if (
                pod.get("spec", {}).get("nodeName")
                and phase == "Pending"
                and meta["uid"] not in self.started
            ):
                # the pod's sandbox and image take a while on a real node
                seen = self._bound_at.setdefault(meta["uid"], time.monotonic())
                if time.monotonic() - seen >= CONTAINER_CREATING_SECONDS:
                    await self._start(pod)
        for running in list(self.containers.running.values()):
            code = running.process.poll()
            if code is not None and running.kill_at is None:
                await self._exited(running, code)
        self.containers.note_descendants()
        self.containers.write_record()

    async def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ips = {"podIP": next(self._ips), "hostIP": self.node_ips.get(spec["nodeName"], "127.1.0.1")}
        container = (spec.get("containers") or [{}])[0]
        now = iso(time.time())
        try:
            plan = await plan_launch(self.client, pod, self.sandboxes, ips, self.api_port)
        except ConfigError as e:
            if self._reported.get(meta["uid"]) != e.message:
                self._reported[meta["uid"]] = e.message
                log.info(
                    "kubelet: %s/%s cannot start: %s %s",
                    meta["namespace"],
                    meta["name"],
                    e.reason,
                    e.message,
                )
                await self.client.patch(
                    "pods",
                    meta["name"],
                    meta["namespace"],
                    {
                        "status": {
                            "containerStatuses": [
                                {
                                    "name": container.get("name", ""),
                                    "ready": False,
                                    "restartCount": 0,
                                    "image": container.get("image", ""),
                                    "state": {
                                        "waiting": {"reason": e.reason, "message": e.message}
                                    },
                                }
                            ],
                        }
                    },
                    status=True,
                )
            return
        self.started.add(meta["uid"])
        self._bound_at.pop(meta["uid"], None)
        log_file = self.log_dir / f"{meta['namespace']}_{meta['name']}.log"
        if self._pod_network is not None:
            preload = " ".join(p for p in (str(self._pod_network), plan.env.get("LD_PRELOAD")) if p)
            plan = dataclasses.replace(
                plan, env={**plan.env, "LD_PRELOAD": preload, POD_IP_VAR: ips["podIP"]}
            )
        try:
            process = start(plan, log_file)
        except OSError as e:
            log.info(
                "kubelet: %s/%s failed to start %s: %s",
                meta["namespace"],
                meta["name"],
                plan.argv[0],
                e,
            )
            await self._set_terminated(pod, container, 128, "StartError", now, str(e))
            shutil.rmtree(plan.sandbox, ignore_errors=True)
            return
        grace = min(float(spec.get("terminationGracePeriodSeconds", 30)), MAX_GRACE_SECONDS)
        running = PodProcess(
            meta["namespace"], meta["name"], meta["uid"], process, plan.sandbox, grace, now
        )
        self.containers.add(running, ips["podIP"])
        log.info(
            "kubelet: started %s/%s on %s as pid %d at %s: %s",
            meta["namespace"],
            meta["name"],
            spec["nodeName"],
            process.pid,
            ips["podIP"],
            plan.argv,
        )
        await self.client.patch(
            "pods",
            meta["name"],
            meta["namespace"],
            {
                "status": {
                    "phase": "Running",
                    "podIP": ips["podIP"],
                    "podIPs": [{"ip": ips["podIP"]}],
                    "hostIP": ips["hostIP"],
                    "hostIPs": [{"ip": ips["hostIP"]}],
                    "startTime": now,
                    "conditions": [
                        {"type": t, "status": "True", "lastTransitionTime": now}
                        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                    ],
                    "containerStatuses": [
                        {
                            "name": container.get("name", ""),
                            "ready": True,
                            "started": True,
                            "restartCount": 0,
                            "image": container.get("image", ""),
                            "imageID": "",
                            "containerID": f"emulated://{process.pid}",
                            "state": {"running": {"startedAt": now}},
                        }
                    ],
                }
            },
            status=True,
        )
        await self.client.event(
            pod, "Normal", "Started", f"Started container {container.get('name', '')}", "kubelet"
        )

    async def _set_terminated(
        self,
        pod: dict[str, Any],
        container: dict[str, Any],
        code: int,
        reason: str,
        started: str,
        message: str = "",
    ) -> None:
        meta, now = pod["metadata"], iso(time.time())
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": now,
            "containerID": "",
        }
        if message:
            terminated["message"] = message
        phase = "Succeeded" if code == 0 else "Failed"
        try:
            await self.client.patch(
                "pods",
                meta["name"],
                meta["namespace"],
                {
                    "status": {
                        "phase": phase,
                        "conditions": [
                            {
                                "type": t,
                                "status": "False" if t in ("Ready", "ContainersReady") else "True",
                                "reason": "PodCompleted",
                                "lastTransitionTime": now,
                            }
                            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                        ],
                        "containerStatuses": [
                            {
                                "name": container.get("name", ""),
                                "ready": False,
                                "started": False,
                                "restartCount": 0,
                                "image": container.get("image", ""),
                                "state": {"terminated": terminated},
                            }
                        ],
                    }
                },
                status=True,
            )
        except ApiError as e:
            if e.status != 404:  # deleted meanwhile: nobody to tell
                raise

    async def _exited(self, running: PodProcess, code: int) -> None:
        exit_code = 128 - code if code < 0 else code  # a signal -N is exit code 128+N
        reason = "Completed" if exit_code == 0 else "Error"
        log.info(
            "kubelet: %s/%s exited with %d (%s)", running.namespace, running.name, exit_code, reason
        )
        self.containers.kill_group(running)
        self.containers.forget(running)
        with contextlib.suppress(ApiError):
            pod = await self.client.get("pods", running.name, running.namespace)
            container = (pod.get("spec", {}).get("containers") or [{}])[0]
            await self._set_terminated(pod, container, exit_code, reason, running.started)
