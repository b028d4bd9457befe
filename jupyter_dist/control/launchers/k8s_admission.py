"""A Kubernetes session's pods as one gang: a queued Job waits for Kueue to admit it, and
a Job whose pods are not all on machines soon enough is released whole.

With ``--k8s-queue NAME`` the session's Job is made suspended, with Kueue's queue label
(`k8s_manifests`); Kueue admits a Job only when all its pods fit at once, and then sets
``suspend`` false, after which the Job's controller makes the pods. `wait_admitted` waits
for that, saying "queued in NAME" and for how long, bounded by ``--k8s-queue-timeout``.
A cluster whose discovery lists no Kueue API (`check_kueue`) is refused before anything
is made: nothing there would ever admit the Job.

Without a queue nothing stops the scheduler from placing some pods of a session and not
the others, which then hold their GPUs waiting for pods that may never come. `GangWatch`
gives the gang ``--k8s-gang-timeout`` from the Job's making (or admission) for every pod
to be bound to a machine; past it the start fails naming each pod still waiting and the
scheduler's reason (its PodScheduled condition), and the placement deletes the Job, its
pods and its Secret, so none of them holds a machine. A waiting pod for which the
cluster's autoscaler is adding a machine (its ``TriggeredScaleUp`` Event, the cluster
autoscaler's, or Karpenter's ``Nominated``) is waited for past that bound, within
``--k8s-timeout``: a new machine takes minutes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from jupyter_dist.control.launchers.k8s_api import KubeClient
from jupyter_dist.errors import AgentError, SpecError

#: Kueue's API group: a cluster that serves it runs Kueue
KUEUE_GROUP = "kueue.x-k8s.io"
#: a pod's Events saying an autoscaler adds a machine for it: the cluster autoscaler's,
#: Karpenter's
SCALE_UP_REASONS = ("TriggeredScaleUp", "Nominated")
#: seconds between two reads of the waiting pods' Events
EVENTS_S = 2.0
#: seconds between looks at a queued Job
POLL_S = 0.5
#: a queued session says how long it has waited after these many seconds, then every
#: `REMIND_EVERY_S`
REMIND_AT_S = (10.0, 30.0, 60.0, 120.0)
REMIND_EVERY_S = 300.0


def waited_text(seconds: float) -> str:
    """``12 s``, ``3 min``, ``1 h 5 min``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _next_reminder(waited: float) -> float:
    later = [t for t in REMIND_AT_S if t > waited]
    return later[0] if later else waited + REMIND_EVERY_S


def job_failure(job: Mapping[str, Any]) -> str | None:
    """A Job's Failed condition as ``reason: message``, or None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason') or 'Failed'}: {cond.get('message') or ''}".strip(": ")
    return None


async def check_kueue(client: KubeClient, queue: str) -> None:
    """Refuse ``--k8s-queue`` on a cluster whose discovery lists no Kueue API (one that
    does not say is given the benefit of the doubt)."""
    groups = await client.api_groups()
    if groups is not None and KUEUE_GROUP not in groups:
        raise SpecError(
            f"--k8s-queue {queue}: the cluster at {client.url} serves no {KUEUE_GROUP} API: "
            "Kueue is not installed there, and nothing would ever admit the session's Job. "
            f"Install Kueue, with a LocalQueue {queue} in namespace {client.namespace}, or "
            "leave --k8s-queue out"
        )


async def wait_admitted(
    client: KubeClient,
    name: str,
    labels: Mapping[str, str],
    queue: str,
    nodes: int,
    bound: float,
    progress: Callable[[str], None],
) -> None:
    """Until Kueue admits job ``name`` of ``queue`` (its ``suspend`` is false), at most
    ``bound`` seconds; says "queued in QUEUE" at once and how long it has waited now and
    then (`REMIND_AT_S`). The Job is listed by its ``labels`` (the session's Role may
    list Jobs, not get them)."""
    where = f"job {client.namespace}/{name}"
    began = time.monotonic()
    next_say = 0.0
    while True:
        jobs = await client.items("Job", labels)
        job = next((j for j in jobs if (j.get("metadata") or {}).get("name") == name), None)
        waited = time.monotonic() - began
        if job is None:
            raise AgentError(f"Kubernetes: {where} was deleted while queued in {queue}")
        failed = job_failure(job)
        if failed:
            raise AgentError(f"Kubernetes: {where} failed while queued in {queue} ({failed})")
        if not (job.get("spec") or {}).get("suspend"):
            progress(f"{where}: admitted by queue {queue} after {waited_text(waited)}")
            return
        if waited > bound:
            raise AgentError(
                f"Kubernetes: {where} was still queued in {queue} after {bound:.0f} s "
                f"(--k8s-queue-timeout): Kueue did not admit its {nodes} pod(s); deleted the "
                f"job and its secret. Its Workload says why it waits (kubectl get workloads "
                f"-n {client.namespace}); Kueue must run in the cluster, with a LocalQueue "
                f"{queue} in namespace {client.namespace}"
            )
        if waited >= next_say:
            said = f"queued in {queue}"
            if waited >= 1:
                said += f" for {waited_text(waited)}"
            said += f": {where} waits, suspended, for Kueue to admit its {nodes} pod(s) at once"
            if waited >= REMIND_AT_S[-1]:
                said += (
                    f" (is Kueue running, with a LocalQueue {queue} in namespace "
                    f"{client.namespace}? kubectl get workloads -n {client.namespace} says why)"
                )
            progress(said)
            next_say = _next_reminder(waited)
        await asyncio.sleep(POLL_S)


def _not_scheduled(pod: Mapping[str, Any] | None) -> str:
    """Why a pod is not on a machine: the scheduler's PodScheduled condition."""
    if pod is None:
        return "no pod yet (the Job's controller has made none)"
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason') or 'not scheduled'}: {cond.get('message') or ''}".strip(
                ": "
            )
    return "not scheduled yet"


async def _scaling_up(client: KubeClient, waiting: Mapping[int, Mapping[str, Any] | None]) -> str:
    """What an autoscaler said it adds for a waiting pod (``""``: none said so, or the
    account may not list Events)."""
    names = {
        str(pod["metadata"]["name"]): index for index, pod in waiting.items() if pod is not None
    }
    if not names:
        return ""
    said: list[str] = []
    for reason in SCALE_UP_REASONS:
        try:
            found = await client.call("GET", "Event", params={"fieldSelector": f"reason={reason}"})
        except AgentError:
            return ""
        for event in (found or {}).get("items") or []:
            index = names.get(str((event.get("involvedObject") or {}).get("name")))
            if index is not None:
                said.append(f"node {index}: {reason}: {str(event.get('message') or '')[:200]}")
    if not said:
        return ""
    return (
        "; ".join(sorted(set(said)))
        + " (an autoscaler adds a machine: waiting past --k8s-gang-timeout, up to "
        "--k8s-timeout)"
    )


def _pod_name(pod: Mapping[str, Any] | None) -> str:
    return f" (pod {pod['metadata']['name']})" if pod else ""


class GangWatch:
    """Whether every pod of a session is bound to a machine within ``bound`` seconds from
    now (the Job made, or admitted by its queue)."""

    def __init__(self, namespace: str, job: str, nodes: int, bound: float) -> None:
        self.namespace = namespace
        self.job = job
        self.nodes = nodes
        self.bound = bound
        self.began = time.monotonic()
        self.placed = False
        self._scaling = ""  # what an autoscaler said it adds, once the bound passed
        self._read = -EVENTS_S

    def waiting(
        self, by_index: Mapping[int, Mapping[str, Any]]
    ) -> dict[int, Mapping[str, Any] | None]:
        """The nodes whose pod is not on a machine (None: no pod yet); once there are
        none, the gang is placed for good."""
        waiting = {
            index: by_index.get(index)
            for index in range(self.nodes)
            if not ((by_index.get(index) or {}).get("spec") or {}).get("nodeName")
        }
        if not waiting:
            self.placed = True
        return waiting

    async def check(self, client: KubeClient, by_index: Mapping[int, Mapping[str, Any]]) -> str:
        """Raise, naming each pod not on a machine and why, once the bound has passed
        with any of them unbound, unless an autoscaler is adding a machine for one (then
        what it said, for the progress); nothing once all have been bound."""
        waiting = self.waiting(by_index)
        if self.placed or time.monotonic() - self.began <= self.bound:
            return ""
        if time.monotonic() - self._read >= EVENTS_S:
            self._read = time.monotonic()
            self._scaling = await _scaling_up(client, waiting)
        if self._scaling:
            return self._scaling
        raise AgentError(self.text(waiting))

    def text(self, waiting: Mapping[int, Mapping[str, Any] | None]) -> str:
        said = "; ".join(
            f"node {i}{_pod_name(pod)}: {_not_scheduled(pod)}" for i, pod in sorted(waiting.items())
        )
        return (
            f"Kubernetes: {len(waiting)} of the session's {self.nodes} pods were not on a "
            f"machine within {self.bound:.0f} s (--k8s-gang-timeout): {said.rstrip('.')}. "
            f"Released them all (deleted job {self.namespace}/{self.job}, its pods and its "
            "secret), so that none holds a machine waiting for the others. Ask for what the "
            "cluster has free (fewer --nodes or --gpus, another --k8s-gpu-resource or "
            "--node-selector), or give --k8s-queue NAME: Kueue admits the pods all at once, "
            "when they fit"
        )


__all__ = [
    "KUEUE_GROUP",
    "SCALE_UP_REASONS",
    "GangWatch",
    "check_kueue",
    "job_failure",
    "wait_admitted",
    "waited_text",
]
