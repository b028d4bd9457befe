"""The node side of the emulated cluster: scheduler, kubelet, Job controller and GC loop.

One asyncio task polls the API server every ``POLL_SECONDS`` with its own token (never
the emulator's memory) and plays, in turn: the garbage collector, the queue controller playing
Kueue (``queue_controller.py``: a queued Job admitted when all its pods fit), the Job
controller (``job_controller.py``), the scheduler (``scheduler.py``: binds a pod by patching
``spec.nodeName``, or marks it Unschedulable and writes a FailedScheduling Event) and the
kubelet: ``CONTAINER_CREATING_SECONDS`` after a pod was bound, its volumes are made and
its own loopback ``podIP`` (127.0.0.2, 127.0.0.3, ...) and ``hostIP`` of its node
(127.1.0.N) given; its init containers run as local processes (``pod_runner.py``) one
after another, the pod Pending with their statuses (``pod_status.py``); then its container,
the pod Running with Ready conditions and a running containerStatus. When that process
exits, Succeeded or Failed with the terminated state (exitCode; 128 + signal when killed);
an init container that fails fails the pod (restarts are not played). A failed
container's message is the end of its log where ``terminationMessagePolicy`` is
``FallbackToLogsOnError``; an init container's log is ``<pod log>.<container>.log``.
When a pod leaves the API (deleted, or collected with its Job), its container ends
(``containers.py``: SIGTERM, SIGKILL after ``terminationGracePeriodSeconds`` capped at
``MAX_GRACE_SECONDS``, everything of it as its cgroup would go); so does the rest of a
container whose main process exits.

Registers the fake nodes ``node-0``... (labels ``kubernetes.io/hostname``, allocatable
cpu, memory, ``nvidia.com/gpu`` and other extended resources) at start. Keeps
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
from tests.k8s.pod_runner import (
    ConfigError,
    PodSandbox,
    plan_container,
    prepare,
    run_order,
    start,
)
from tests.k8s.pod_status import container_status, fallback_message, pod_status
from tests.k8s.queue_controller import QueueController
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
        self,
        url: str,
        token: str,
        nodes: list[NodeShape],
        workdir: Path,
        api_port: int,
        kueue: bool = True,
    ) -> None:
        self.client = ApiClient(url, token)
        self.nodes = nodes
        self.node_ips = {n.name: f"127.1.0.{i + 1}" for i, n in enumerate(nodes)}
        self.workdir = workdir
        self.log_dir = workdir / "logs"
        self.sandboxes = workdir / "pods"
        self.api_port = api_port
        self.jobs = JobController(self.client)
        self.queues = QueueController(self.client, nodes) if kueue else None
        self.scheduler = Scheduler(self.client, nodes, self.node_ips)
        self.containers = Containers(workdir)
        self.started: set[str] = set()
        self._ips = _pod_ips()
        self._reported: dict[str, str] = {}  # pod uid -> the last config error written
        self._task: asyncio.Task[None] | None = None
        self._pod_network: Path | None = None
        self._bound_at: dict[str, float] = {}  # pod uid -> when this kubelet first saw it bound
        self._runs: dict[str, PodRun] = {}  # pod uid -> its sandbox and containers, while run

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
        admitted = self.queues is not None and await self.queues.reconcile(jobs, pods)
        if admitted:  # the admitted Jobs' pods now
            jobs = [
                j for j in await self.client.list("jobs") if j["metadata"]["uid"] not in deleted
            ]
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
        for uid in [u for u in self._runs if u not in present]:
            if uid not in self.containers.running:  # deleted between two containers
                shutil.rmtree(self._runs.pop(uid).sandbox.path, ignore_errors=True)
        for pod in pods:
            meta, phase = pod["metadata"], pod.get("status", {}).get("phase", "Pending")
            if (
                pod.get("spec", {}).get("nodeName")
                and phase == "Pending"
                and meta["uid"] not in self.started
                and meta["uid"] not in self.containers.running
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
        """The pod's next container: its first init container once its sandbox and
        volumes are made, the next after one ended well, its container after the last."""
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        run = self._runs.get(uid)
        if run is None:
            try:
                steps = run_order(pod)
                sandbox = await prepare(self.client, pod, self.sandboxes)
            except ConfigError as e:
                await self._report(pod, None, (spec.get("containers") or [{}])[0], e)
                return
            ips = {
                "podIP": next(self._ips),
                "hostIP": self.node_ips.get(spec["nodeName"], "127.1.0.1"),
            }
            run = self._runs[uid] = PodRun(sandbox, ips, steps)
        container, init = run.steps[run.next]
        now = iso(time.time())
        try:
            plan = await plan_container(
                self.client, pod, container, run.sandbox, run.ips, self.api_port, init
            )
        except ConfigError as e:
            await self._report(pod, run, container, e)
            return
        self._bound_at.pop(uid, None)
        if not init:
            self.started.add(uid)
        if self._pod_network is not None:
            preload = " ".join(p for p in (str(self._pod_network), plan.env.get("LD_PRELOAD")) if p)
            plan = dataclasses.replace(
                plan, env={**plan.env, "LD_PRELOAD": preload, POD_IP_VAR: run.ips["podIP"]}
            )
        try:
            process = start(plan, self._log_file(meta, container, init))
        except OSError as e:
            log.info(
                "kubelet: %s/%s failed to start %s: %s",
                meta["namespace"],
                meta["name"],
                plan.argv[0],
                e,
            )
            self.started.add(uid)
            self._runs.pop(uid, None)
            await self._set_terminated(pod, run, container, init, 128, "StartError", now, str(e))
            shutil.rmtree(plan.sandbox, ignore_errors=True)
            return
        grace = min(float(spec.get("terminationGracePeriodSeconds", 30)), MAX_GRACE_SECONDS)
        running = PodProcess(
            meta["namespace"], meta["name"], uid, process, plan.sandbox, grace, now,
            container=plan.container, init=init,
        )  # fmt: skip
        self.containers.add(running, run.ips["podIP"])
        log.info(
            "kubelet: started %s%s/%s on %s as pid %d at %s: %s",
            f"init container {plan.container} of " if init else "",
            meta["namespace"],
            meta["name"],
            spec["nodeName"],
            process.pid,
            run.ips["podIP"],
            plan.argv,
        )
        state = {"running": {"startedAt": now}}
        if init:
            waiting = {"waiting": {"reason": "PodInitializing"}}
            status = pod_status(
                "Pending", now, run.inits, run.next, state, run.main, waiting, run.ips
            )
        else:
            status = pod_status(
                "Running", now, run.inits, len(run.inits), None, container, state, run.ips,
                process.pid,
            )  # fmt: skip
        await self.client.patch(
            "pods", meta["name"], meta["namespace"], {"status": status}, status=True
        )
        if not init:
            await self.client.event(
                pod, "Normal", "Started", f"Started container {container.get('name', '')}",
                "kubelet",
            )  # fmt: skip

    def _log_file(self, meta: dict[str, Any], container: dict[str, Any], init: bool) -> Path:
        """The pod's log (its container's), or an init container's own."""
        tail = f".{container.get('name', '')}" if init else ""
        return self.log_dir / f"{meta['namespace']}_{meta['name']}{tail}.log"

    async def _report(
        self, pod: dict[str, Any], run: PodRun | None, container: dict[str, Any], e: ConfigError
    ) -> None:
        """A container that cannot be made yet waits, its reason in the pod's status."""
        meta = pod["metadata"]
        if self._reported.get(meta["uid"]) == e.message:
            return
        self._reported[meta["uid"]] = e.message
        log.info(
            "kubelet: %s/%s cannot start: %s %s", meta["namespace"], meta["name"], e.reason,
            e.message,
        )  # fmt: skip
        waiting = {"waiting": {"reason": e.reason, "message": e.message}}
        if run is not None and run.next < len(run.inits):
            initializing = {"waiting": {"reason": "PodInitializing"}}
            status = pod_status(
                "Pending", iso(time.time()), run.inits, run.next, waiting, run.main, initializing
            )
        else:
            status = {"containerStatuses": [container_status(container, waiting)]}
        await self.client.patch(
            "pods", meta["name"], meta["namespace"], {"status": status}, status=True
        )

    async def _set_terminated(
        self,
        pod: dict[str, Any],
        run: PodRun,
        container: dict[str, Any],
        init: bool,
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
        if init:
            status = pod_status(
                phase, now, run.inits, run.next, {"terminated": terminated}, run.main,
                {"waiting": {"reason": "PodInitializing"}},
            )  # fmt: skip
        else:
            status = pod_status(
                phase, now, run.inits, len(run.inits), None, container,
                {"terminated": terminated},
            )  # fmt: skip
        try:
            await self.client.patch(
                "pods", meta["name"], meta["namespace"], {"status": status}, status=True
            )
        except ApiError as e:
            if e.status != 404:  # deleted meanwhile: nobody to tell
                raise

    async def _exited(self, running: PodProcess, code: int) -> None:
        exit_code = 128 - code if code < 0 else code  # a signal -N is exit code 128+N
        reason = "Completed" if exit_code == 0 else "Error"
        what = f"init container {running.container} of " if running.init else ""
        log.info(
            "kubelet: %s%s/%s exited with %d (%s)", what, running.namespace, running.name,
            exit_code, reason,
        )  # fmt: skip
        self.containers.kill_group(running)
        run = self._runs.get(running.uid)
        if running.init and exit_code == 0 and run is not None:
            self.containers.forget(running, keep_sandbox=True)
            run.next += 1
            with contextlib.suppress(ApiError):  # a pod deleted meanwhile starts no more
                await self._start(await self.client.get("pods", running.name, running.namespace))
            return
        self.containers.forget(running)
        self._runs.pop(running.uid, None)
        self.started.add(running.uid)
        with contextlib.suppress(ApiError):
            pod = await self.client.get("pods", running.name, running.namespace)
            if run is None:  # not ours to tell in detail
                run = PodRun(PodSandbox(running.sandbox, {}), {}, run_order(pod))
            container = run.steps[run.next][0]
            log_file = self._log_file(pod["metadata"], container, running.init)
            message = fallback_message(container, log_file) if exit_code else ""
            await self._set_terminated(
                pod, run, container, running.init, exit_code, reason, running.started, message
            )


@dataclasses.dataclass
class PodRun:
    """A pod this kubelet runs: its sandbox and volumes, its addresses, its containers in
    order (init containers first) and which of them is next or running."""

    sandbox: PodSandbox
    ips: dict[str, str]
    steps: list[tuple[dict[str, Any], bool]]
    next: int = 0

    @property
    def inits(self) -> list[dict[str, Any]]:
        return [c for c, init in self.steps if init]

    @property
    def main(self) -> dict[str, Any]:
        return self.steps[-1][0]
