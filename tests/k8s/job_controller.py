"""The Job controller and garbage collector of the emulated cluster (Indexed Jobs only).

Job controller, for each ``batch/v1`` Job with ``completionMode: Indexed`` that has not
finished: one pod per index not yet succeeded and with no live pod, named
``<job>-<index>-<5 random chars>`` from the pod template, labelled
``batch.kubernetes.io/job-name``, ``job-name``, ``batch.kubernetes.io/controller-uid``,
``controller-uid`` and ``batch.kubernetes.io/job-completion-index``, annotated with the
index, owned by the Job (``controller: true``), ``JOB_COMPLETION_INDEX`` in every
container's and init container's env (a fieldRef on that annotation, as Kubernetes writes
it), ``hostname`` ``<job>-<index>`` where the template names a ``subdomain``. A pod that
failed, or vanished before it succeeded, counts as a failure and its index gets a new pod
until ``failed`` passes ``backoffLimit`` (default 6): then the Job fails
(BackoffLimitExceeded) and its live pods are deleted; the same once
``activeDeadlineSeconds`` have passed since ``startTime`` (DeadlineExceeded). Status:
``active``, ``ready``, ``succeeded``, ``failed``, ``completedIndexes``, ``startTime``,
``completionTime`` and a Complete or Failed condition. A pod the API server refuses (a
namespace's Pod Security admission) is a FailedCreate Event on the Job, as Kubernetes
writes it, and is asked for again on the next round.
``ttlSecondsAfterFinished``: the finished Job is deleted that long after it finished.

An Indexed Job scaled (completions and parallelism patched together, Kubernetes' elastic
Indexed Job): pods for the new indexes, or the pods of indexes past ``completions``
deleted, which count as no failure.

A suspended Job (``spec.suspend``: made so for a queue, or set later) has no pods: its live
pods are deleted (no failure counted), ``startTime`` and ``active`` cleared, and a
``Suspended`` condition True (JobSuspended); when ``suspend`` turns false the condition
turns False (JobResumed), ``startTime`` starts afresh (so does the deadline) and the pods
are made.

Garbage collector: an object whose ownerReferences all name objects no longer served
(checked live by name and uid; owners of kinds not served here keep it) is deleted,
whatever propagationPolicy deleted the owner.

Not played: NonIndexed Jobs, ``parallelism`` below ``completions``, pod failure and
success policies, backoff delays, ``FailureTarget``/``SuccessCriteriaMet``.
"""

from __future__ import annotations

import copy
import datetime
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tests.k8s.kinds import kind_of
from tests.k8s.kube_client import ApiClient, ApiError

__all__ = ["INDEX_KEY", "JobController", "collect_garbage", "iso", "parse_iso"]

log = logging.getLogger("k8s.jobs")

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_NAME_KEY = "batch.kubernetes.io/job-name"
#: the kinds whose objects the garbage collector deletes, and whose uids count as owners
OWNED_KINDS = ("pods", "secrets", "configmaps", "services", "jobs")


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_iso(text: str) -> float:
    return (
        datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
        .replace(tzinfo=datetime.timezone.utc)
        .timestamp()
    )


def _condition(kind: str, status: str, reason: str, message: str, now: float) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastProbeTime": iso(now),
        "lastTransitionTime": iso(now),
    }


def _random_suffix() -> str:
    return "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


def _owner_uids(obj: Mapping[str, Any]) -> list[str]:
    return [
        ref["uid"] for ref in obj.get("metadata", {}).get("ownerReferences") or [] if "uid" in ref
    ]


def _ranges(indexes: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` as ``completedIndexes`` writes them."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


async def _owner_exists(client: ApiClient, ref: Mapping[str, Any], namespace: str | None) -> bool:
    """Whether the object ``ref`` names (same uid) is still served: asked live, as the real
    garbage collector does before it deletes, since the lists it works from are older."""
    try:
        kind = kind_of(ref.get("kind", ""))
    except ValueError:
        return True  # a kind not served here: never collect on its account
    try:
        owner = await client.get(kind.plural, ref["name"], namespace)
    except ApiError as e:
        if e.status == 404:
            return False
        raise
    return bool(owner.get("metadata", {}).get("uid") == ref.get("uid"))


async def collect_garbage(
    client: ApiClient, objects: Mapping[str, list[dict[str, Any]]]
) -> set[str]:
    """Delete every object whose owners are all gone; the uids deleted."""
    alive = {o["metadata"]["uid"] for items in objects.values() for o in items}
    deleted: set[str] = set()
    for resource, items in objects.items():
        for obj in items:
            owners = _owner_uids(obj)
            if owners and not any(uid in alive for uid in owners):
                meta = obj["metadata"]
                refs = meta.get("ownerReferences") or []
                if any([await _owner_exists(client, r, meta.get("namespace")) for r in refs]):
                    continue
                log.info(
                    "gc: delete %s %s/%s (owner gone)",
                    resource,
                    meta.get("namespace"),
                    meta["name"],
                )
                await client.delete(resource, meta["name"], meta.get("namespace"))
                deleted.add(meta["uid"])
    return deleted


class JobController:
    """Reconciles Indexed Jobs against their pods, once per ``reconcile`` call."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        #: per Job uid: pod uid -> index of the pods seen live, to notice vanished ones
        self._live: dict[str, dict[str, int]] = {}
        #: pod uids already counted as failures
        self._counted: set[str] = set()
        self._warned: set[str] = set()
        #: (Job uid, message) of the pods the API server refused, each said once
        self._refused: set[tuple[str, str]] = set()

    async def reconcile(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        now = time.time()
        for job in jobs:
            uid = job["metadata"]["uid"]
            owned = [p for p in pods if uid in _owner_uids(p)]
            if job.get("spec", {}).get("completionMode") != "Indexed":
                if uid not in self._warned:
                    self._warned.add(uid)
                    log.warning(
                        "job %s is not Indexed: the emulated controller ignores it",
                        job["metadata"]["name"],
                    )
                continue
            await self._reconcile_one(job, owned, now)
        gone = {j["metadata"]["uid"] for j in jobs}
        for uid in list(self._live):
            if uid not in gone:
                del self._live[uid]

    async def _reconcile_one(
        self, job: dict[str, Any], owned: list[dict[str, Any]], now: float
    ) -> None:
        meta, spec, status = job["metadata"], job.get("spec", {}), job.get("status") or {}
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        finished = [
            c
            for c in status.get("conditions") or []
            if c["type"] in ("Complete", "Failed") and c["status"] == "True"
        ]
        if finished:
            await self._after_finish(job, owned, finished[0], now)
            return
        seen = self._live.setdefault(uid, {})
        suspended = [c for c in status.get("conditions") or [] if c["type"] == "Suspended"]
        if spec.get("suspend"):
            await self._suspended(job, owned, seen, suspended, now)
            return
        if suspended and suspended[0]["status"] == "True":
            suspended = [_condition("Suspended", "False", "JobResumed", "Job resumed", now)]
            log.info("job %s/%s: resumed", namespace, name)
        completions = int(spec.get("completions", 1))
        owned = await self._scaled_down(name, namespace, owned, completions, seen)
        live = [p for p in owned if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        succeeded = {
            int(p["metadata"]["annotations"][INDEX_KEY])
            for p in owned
            if p.get("status", {}).get("phase") == "Succeeded"
        }
        failed = int(status.get("failed", 0))
        for pod in owned:
            if (
                pod.get("status", {}).get("phase") == "Failed"
                and pod["metadata"]["uid"] not in self._counted
            ):
                self._counted.add(pod["metadata"]["uid"])
                seen.pop(pod["metadata"]["uid"], None)  # counted: not again when it goes
                failed += 1
        present = {p["metadata"]["uid"] for p in owned}
        for pod_uid in [u for u in seen if u not in present]:
            log.info(
                "job %s: pod of index %d vanished before it succeeded", name, seen.pop(pod_uid)
            )
            failed += 1
        for pod in live:
            seen[pod["metadata"]["uid"]] = int(pod["metadata"]["annotations"][INDEX_KEY])
        start = status.get("startTime") or iso(now)
        condition: tuple[str, str, str] | None = None
        deadline = spec.get("activeDeadlineSeconds")
        if len(succeeded) >= completions:
            condition = ("Complete", "", "")
        elif failed > int(spec.get("backoffLimit", 6)):
            condition = (
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
        elif deadline is not None and now - parse_iso(start) > float(deadline):
            condition = (
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )
        if condition is not None and condition[0] == "Failed":
            for pod in live:
                log.info("job %s: %s, delete pod %s", name, condition[1], pod["metadata"]["name"])
                await self.client.delete("pods", pod["metadata"]["name"], namespace)
                seen.pop(pod["metadata"]["uid"], None)
            live = []
        elif condition is None:
            busy = {int(p["metadata"]["annotations"][INDEX_KEY]) for p in live}
            for index in range(completions):
                if index not in succeeded and index not in busy:
                    created = await self._create_pod(job, index)
                    if created is not None:
                        live.append(created)
                        seen[created["metadata"]["uid"]] = index
        new_status: dict[str, Any] = {
            "startTime": start,
            "active": len(live),
            "ready": sum(1 for p in live if p.get("status", {}).get("phase") == "Running"),
            "succeeded": len(succeeded),
            "failed": failed,
            "completedIndexes": _ranges(succeeded),
        }
        if suspended:
            new_status["conditions"] = suspended
        if condition is not None:
            kind, reason, message = condition
            new_status["conditions"] = [
                *suspended,
                _condition(kind, "True", reason, message, now),
            ]
            if kind == "Complete":
                new_status["completionTime"] = iso(now)
            log.info("job %s/%s: %s %s", namespace, name, kind, reason)
        if any(status.get(k) != v for k, v in new_status.items()):
            await self.client.patch("jobs", name, namespace, {"status": new_status}, status=True)

    async def _suspended(
        self,
        job: dict[str, Any],
        owned: list[dict[str, Any]],
        seen: dict[str, int],
        suspended: list[dict[str, Any]],
        now: float,
    ) -> None:
        """No pods while ``job`` is suspended: its live ones deleted, counted as no failure."""
        meta, status = job["metadata"], job.get("status") or {}
        for pod in owned:
            pod_meta = pod["metadata"]
            self._counted.add(pod_meta["uid"])
            seen.pop(pod_meta["uid"], None)
            phase = pod.get("status", {}).get("phase")
            if phase not in ("Succeeded", "Failed") and not pod_meta.get("deletionTimestamp"):
                log.info("job %s: suspended, delete pod %s", meta["name"], pod_meta["name"])
                await self.client.delete("pods", pod_meta["name"], meta["namespace"])
        if suspended and suspended[0]["status"] == "True" and not status.get("startTime"):
            return
        log.info("job %s/%s: suspended", meta["namespace"], meta["name"])
        await self.client.patch(
            "jobs",
            meta["name"],
            meta["namespace"],
            {
                "status": {
                    "startTime": None,
                    "active": 0,
                    "ready": 0,
                    "conditions": [
                        _condition("Suspended", "True", "JobSuspended", "Job suspended", now)
                    ],
                }
            },
            status=True,
        )

    async def _scaled_down(
        self,
        name: str,
        namespace: str,
        owned: list[dict[str, Any]],
        completions: int,
        seen: dict[str, int],
    ) -> list[dict[str, Any]]:
        """The Job's pods of indexes below ``completions``; those past it (the Job was
        scaled down) are deleted where still live and never count as failures."""
        kept = []
        for pod in owned:
            meta = pod["metadata"]
            index = int(meta["annotations"][INDEX_KEY])
            if index < completions:
                kept.append(pod)
                continue
            self._counted.add(meta["uid"])
            seen.pop(meta["uid"], None)
            phase = pod.get("status", {}).get("phase")
            if phase not in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                log.info("job %s: scaled to %d, delete pod %s", name, completions, meta["name"])
                await self.client.delete("pods", meta["name"], namespace)
        return kept

    async def _after_finish(
        self,
        job: dict[str, Any],
        owned: list[dict[str, Any]],
        condition: Mapping[str, Any],
        now: float,
    ) -> None:
        meta = job["metadata"]
        ttl = job.get("spec", {}).get("ttlSecondsAfterFinished")
        if ttl is not None and now - parse_iso(condition["lastTransitionTime"]) >= float(ttl):
            log.info(
                "job %s/%s: ttlSecondsAfterFinished %s passed, delete it",
                meta["namespace"],
                meta["name"],
                ttl,
            )
            await self.client.delete("jobs", meta["name"], meta["namespace"])

    async def _create_pod(self, job: dict[str, Any], index: int) -> dict[str, Any] | None:
        """The pod of ``index``; None when the API server refuses it (admission), which a
        FailedCreate Event on the Job says, as Kubernetes' Job controller writes it (once
        per message here; the real one counts repeats), and the next round tries again."""
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        pod_meta = template.get("metadata") or {}
        labels = {
            **(pod_meta.get("labels") or {}),
            JOB_NAME_KEY: meta["name"],
            "job-name": meta["name"],
            "batch.kubernetes.io/controller-uid": meta["uid"],
            "controller-uid": meta["uid"],
            INDEX_KEY: str(index),
        }
        annotations = {**(pod_meta.get("annotations") or {}), INDEX_KEY: str(index)}
        spec = template.get("spec") or {}
        # as Kubernetes does, in init containers too
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            container["env"] = [
                *(container.get("env") or []),
                {
                    "name": "JOB_COMPLETION_INDEX",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}
                    },
                },
            ]
        if spec.get("subdomain"):
            spec.setdefault("hostname", f"{meta['name']}-{index}")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{index}-{_random_suffix()}",
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }
        try:
            created: dict[str, Any] = await self.client.create("pods", pod, meta["namespace"])
        except ApiError as e:
            if e.status not in (403, 422):
                raise
            said = (meta["uid"], e.message)
            if said not in self._refused:
                self._refused.add(said)
                log.info("job %s: cannot create the pod of index %d: %s", meta["name"], index, e)
                await self.client.event(
                    job, "Warning", "FailedCreate", f"Error creating: {e.message}",
                    "job-controller",
                )  # fmt: skip
            return None
        log.info(
            "job %s: created pod %s for index %d", meta["name"], created["metadata"]["name"], index
        )
        return created
