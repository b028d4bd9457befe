"""The queue controller of the emulated cluster: Kueue's admission of Jobs, all or nothing.

A Job labelled ``kueue.x-k8s.io/queue-name`` (on the Job's own metadata, where Kueue reads
it) and suspended waits in its queue. It is admitted, ``spec.suspend`` set false as Kueue
does once the Job's Workload is admitted, only when every pod it will make (``parallelism``
copies of its template) fits the nodes' free capacity at once (`scheduler.fits_all`: the
same filters the scheduler plays, resources by name, anti-affinity), beside the pods there
now and those Jobs already admitted have yet to make. Queued Jobs are taken oldest first
and one that does not fit holds those behind it in its queue (a StrictFIFO ClusterQueue).
An admission writes a ``Started`` Event on the Job ("Admitted by clusterQueue QUEUE"), and
each queued Job's state is logged when it changes.

Not played: LocalQueue, ClusterQueue, ResourceFlavor and Workload objects (the queue label
names a queue that always exists; the nodes' free capacity is its quota), preemption and
eviction, partial admission, ``waitForPodsReady``. A suspended Job without the label is
left alone (as Kueue leaves it): the Job controller makes no pods for it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tests.k8s.kube_client import ApiClient
from tests.k8s.scheduler import NodeShape, choose_node, fits_all

__all__ = ["QUEUE_LABEL", "QueueController"]

log = logging.getLogger("k8s.queue")

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not (
        pod.get("metadata") or {}
    ).get("deletionTimestamp")


def _owned_by(pod: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    uid = job["metadata"]["uid"]
    return any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or [])


def gang_of(job: Mapping[str, Any], count: int | None = None) -> list[dict[str, Any]]:
    """The pods ``job`` will make (``count`` of them, else its ``parallelism``), as the
    scheduler sees them: its template's labels and spec."""
    template = job["spec"].get("template") or {}
    meta = job["metadata"]
    n = int(job["spec"].get("parallelism", 1)) if count is None else count
    return [
        {
            "metadata": {
                "name": f"{meta['name']}-{i}-admission",
                "namespace": meta["namespace"],
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }
        for i in range(n)
    ]


class QueueController:
    """Admits queued Jobs whose pods all fit, once per ``reconcile`` call."""

    def __init__(self, client: ApiClient, nodes: Sequence[NodeShape]) -> None:
        self.client = client
        self.nodes = list(nodes)
        self._said: dict[str, str] = {}  # job uid -> the last state logged

    async def reconcile(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> bool:
        """Admit what fits now; whether any Job was admitted."""
        queued = sorted(
            (
                j
                for j in jobs
                if (j["metadata"].get("labels") or {}).get(QUEUE_LABEL)
                and j["spec"].get("suspend")
                and not _finished(j)
            ),
            key=lambda j: (j["metadata"].get("creationTimestamp", ""), j["metadata"]["name"]),
        )
        if not queued:
            return False
        live = [p for p in pods if _live(p)]
        placed: list[Mapping[str, Any]] = [p for p in live if (p.get("spec") or {}).get("nodeName")]
        waiting = [p for p in live if not (p.get("spec") or {}).get("nodeName")]
        for job in jobs:  # pods admitted Jobs have yet to make hold their room already
            if job["spec"].get("suspend") or _finished(job):
                continue
            made = sum(1 for p in live if _owned_by(p, job))
            missing = int(job["spec"].get("parallelism", 1)) - made
            if missing > 0:
                waiting += gang_of(job, missing)
        for pod in waiting:
            node, _ = choose_node(pod, self.nodes, placed)
            if node is not None:
                placed.append({**pod, "spec": {**pod.get("spec", {}), "nodeName": node}})
        blocked: set[str] = set()
        admitted = False
        for job in queued:
            meta = job["metadata"]
            queue = meta["labels"][QUEUE_LABEL]
            if queue in blocked:
                self._note(job, f"waits behind an older Job in queue {queue}")
                continue
            gang = gang_of(job)
            with_gang, why = fits_all(gang, self.nodes, placed)
            if with_gang is None:
                blocked.add(queue)
                self._note(job, f"{len(gang)} pod(s) do not fit at once: {why}")
                continue
            log.info(
                "queue %s: admit job %s/%s (%d pods fit)",
                queue,
                meta["namespace"],
                meta["name"],
                len(gang),
            )
            await self.client.patch(
                "jobs", meta["name"], meta["namespace"], {"spec": {"suspend": False}}
            )
            await self.client.event(
                job, "Normal", "Started", f"Admitted by clusterQueue {queue}", "kueue-admission"
            )
            self._said.pop(meta["uid"], None)
            placed = with_gang  # their room is taken now
            admitted = True
        return admitted

    def _note(self, job: Mapping[str, Any], state: str) -> None:
        meta = job["metadata"]
        if self._said.get(meta["uid"]) != state:
            self._said[meta["uid"]] = state
            log.info("queue: job %s/%s %s", meta["namespace"], meta["name"], state)
