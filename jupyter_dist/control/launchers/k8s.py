"""The ``k8s`` launcher: a session's nodes as pods of one Kubernetes Job, dialling back.

``%%distributed --k8s --nodes 2 --gpus 4`` makes one Secret and one Indexed ``batch/v1``
Job (`k8s_manifests`); node N is the pod of completion index N. Its one process,
``jupyter_dist.node.dial_back``, connects to this side's `DialBackListener` over SSH
(encrypted, both ends proven by the session's fresh keys: the Secret holds every node's,
and each pod's init container hands its node its own, in a file the node removes once
read) and runs the node's agent exactly as on SSH nodes. ``MASTER_ADDR`` is node 0's
pod IP as the API reports it: an address, never a DNS name that may not resolve yet.

Where the pods dial: ``--k8s-callback HOST:PORT``, else (in a pod) this pod's IP. A
notebook outside the cluster is refused with what to do. Start-up relays the pods'
phases. The pods are one gang (`k8s_admission`): with ``--k8s-queue`` the Job waits,
suspended, for Kueue to admit all of them ("queued in NAME"); pods not all on machines
within ``--k8s-gang-timeout`` fail the start, with the scheduler's reason, and are all
released. A pod that cannot start (its image, its config) fails it at once. Whatever
fails, an interrupt included, what the start made is deleted.

A pod the API server refuses to make (the namespace's Pod Security admission, read from
the Job's FailedCreate Events, `k8s_refusals`) fails a start, a heal or a resize at once,
naming the namespace's policy and what the pod violates.

A lost node (its pod deleted, evicted, Failed, its machine gone) is healed with a new pod of
the same completion index (`K8sPlacement.replace_node`): the Job tolerates lost pods and its
controller makes the new one; the node gets fresh keys first, so the lost pod can never
dial in again, and every pod of that index holding the old ones is deleted. A resize
(`K8sPlacement.resize`) scales the Job (an elastic Indexed Job: completions and parallelism
together), the new nodes' keys in the Secret first.

Nothing outlives the session, in layers: `K8sPlacement.release` deletes the Job and the
Secret; the notebook's pod owns both (ownerReferences), so they go when it goes; a
notebook process that dies leaves its pods without a listener, and they exit after
``--k8s``'s grace (`K8sSpec.grace`); a hung session ends at the Job's deadline; a later
server removes a dead owner's leftovers by label (`k8s_sweep`).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jupyter_dist.common.k8s_options import K8sSpec, check_callback, read_pod_template
from jupyter_dist.common.payloads import ClusterHold
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers import k8s_manifests as manifests
from jupyter_dist.control.launchers.base import Launcher, Placement
from jupyter_dist.control.launchers.dial_back import DialBackLauncher, DialBackListener
from jupyter_dist.control.launchers.k8s_admission import (
    GangWatch,
    check_kueue,
    job_failure,
    wait_admitted,
)
from jupyter_dist.control.launchers.k8s_api import KubeClient
from jupyter_dist.control.launchers.k8s_refusals import CreateRefusals
from jupyter_dist.errors import AgentError, SpecError
from jupyter_dist.settings import K8S_POD_VAR

log = logging.getLogger(__name__)
#: seconds between looks at the session's pods while they start
POLL_S = 0.5
#: seconds `K8sPlacement.release` may take
RELEASE_S = 60.0
#: a container waiting for one of these will not start by waiting longer
FATAL_WAITING = ("InvalidImageName",)
#: nor one that has waited for one of these for `STUCK_S` (the kubelet retries them: an
#: image pull may fail once, a Secret may be read before the API has it everywhere)
STUCK_WAITING = (
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)
STUCK_S = 15.0
#: the variable Kubernetes sets in every pod (and nowhere else)
IN_CLUSTER_VAR = "KUBERNETES_SERVICE_HOST"


def pod_index(pod: Mapping[str, Any]) -> int | None:
    """A Job pod's completion index (its label, else its annotation)."""
    meta = pod.get("metadata") or {}
    for where in (meta.get("labels") or {}, meta.get("annotations") or {}):
        value = where.get(manifests.COMPLETION_INDEX_LABEL)
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def pod_state(pod: Mapping[str, Any]) -> tuple[str, str]:
    """A pod's phase and, where it is not plainly running, why: the scheduler's message,
    an init container's waiting reason or failure (the one that hands the node its
    credentials, a template's), the container's waiting or terminated reason."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            why = f"{cond.get('reason') or 'not scheduled'}: {cond.get('message') or ''}"
            return phase, why.strip(": ")
    for cs in status.get("initContainerStatuses") or []:
        state, name = cs.get("state") or {}, cs.get("name")
        if "waiting" in state:
            w = state["waiting"] or {}
            reason = str(w.get("reason") or "waiting")
            if reason != "PodInitializing":
                message = f": {w['message']}" if w.get("message") else ""
                return phase, f"{reason}: init container {name}{message}"
        elif "terminated" in state and (state["terminated"] or {}).get("exitCode"):
            t = state["terminated"] or {}
            return phase, (
                f"{t.get('reason') or 'terminated'}, exit code {t.get('exitCode')} (init "
                f"container {name}){': ' + t['message'].strip() if t.get('message') else ''}"
            )
        elif "running" in state and phase == "Pending":
            return phase, f"Initializing: init container {name} runs"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state:
            w = state["waiting"] or {}
            reason = str(w.get("reason") or "waiting")
            return phase, f"{reason}: {w.get('message') or ''}".strip(": ")
        if "terminated" in state:
            t = state["terminated"] or {}
            return phase, (
                f"{t.get('reason') or 'terminated'}, exit code {t.get('exitCode')}"
                f"{': ' + t['message'] if t.get('message') else ''}"
            )
    return phase, ""


class K8sPlacement(Placement):
    """One session on a Kubernetes cluster: its Secret, its Job and pods, its listener."""

    def __init__(self, spec: SessionSpec, env: Mapping[str, str]) -> None:
        self.spec = spec
        self.k8s = spec.k8s or K8sSpec()
        self.env = dict(env)
        self.client: KubeClient | None = None
        self.listener: DialBackListener | None = None
        self.owner = manifests.Owner(getpass.getuser(), socket.gethostname(), os.getpid())
        self.name = manifests.object_name(spec.name)
        #: each node's pod, once running: ``name``, ``ip``, ``node`` (the machine)
        self.pods: list[dict[str, str]] = []
        self._made: list[tuple[str, str]] = []  # (kind, name) to delete, in order
        self._labels: dict[str, str] = {}  # the session's, on its Job and Secret

    # -- place ---------------------------------------------------------------------------
    async def place(self, progress: Callable[[str], None], timeout: float) -> None:
        try:
            await self._place(progress, self.k8s.timeout or timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release())
            raise

    async def _place(self, progress: Callable[[str], None], timeout: float) -> None:
        template = (
            await asyncio.to_thread(read_pod_template, self.k8s.pod_template)
            if self.k8s.pod_template
            else None
        )
        self.client = client = await KubeClient.connect(
            self.env.get("KUBECONFIG"), self.k8s.context, self.k8s.namespace
        )
        progress(f"Kubernetes {client.url}, namespace {client.namespace}: connecting")
        own_pod = await self._own_pod(client, progress)
        if own_pod is not None:
            own_ns = own_pod.get("metadata", {}).get("namespace")
            if own_ns == client.namespace:
                self.owner = manifests.Owner(
                    self.owner.user, self.owner.host, self.owner.pid, own_pod
                )
            else:
                progress(
                    f"this notebook's pod is in namespace {own_ns}, the session's in "
                    f"{client.namespace}: its objects cannot be owned by the pod (they are "
                    "still deleted when the session stops)"
                )
        image = self.k8s.image or _template_image(template) or _image_of(own_pod)
        if not image:
            raise SpecError(
                "--k8s: no --image given, none in the pod template, and this notebook does not "
                "run in a pod whose image could be used; give --image with jupyter_dist "
                "installed"
            )
        listen_host, listen_port, advertise = self._callback(own_pod)
        labels = self._labels = manifests.session_labels(self.spec.name, self.owner)
        if self.k8s.queue:
            await check_kueue(client, self.k8s.queue)
        await self._remove_leftovers(client, labels, progress)

        self.listener = DialBackListener(
            self.spec.nodes, host=listen_host, port=listen_port, advertise=advertise,
            connect_timeout=timeout,
        )  # fmt: skip
        await self.listener.start()
        callback = self.listener.address
        credentials = [self.listener.credentials(n) for n in range(self.spec.nodes)]
        ns = client.namespace
        try:
            secret = manifests.secret_manifest(self.name, ns, labels, self.owner, credentials)
        except ValueError as err:
            raise SpecError(f"--k8s --nodes {self.spec.nodes}: {err}") from None
        gpus = max(self.spec.counts) if self.spec.device == "cuda" else 0
        job = manifests.job_manifest(
            self.name, ns, labels, self.owner, self.k8s,
            nodes=self.spec.nodes, gpus=gpus, image=image, callback=callback,
            python=self.spec.python or "python", template=template,
        )  # fmt: skip
        await client.call("POST", "Secret", body=secret)
        self._made.append(("Secret", self.name))
        made = await client.call("POST", "Job", body=job)
        self._made.insert(0, ("Job", self.name))
        uid = ((made or {}).get("metadata") or {}).get("uid")
        if uid:  # the Secret goes with the Job (a TTL, a kubectl delete job)
            refs = [*manifests.owner_references(self.owner)]
            refs.append(
                {"apiVersion": "batch/v1", "kind": "Job", "name": self.name, "uid": uid,
                 "blockOwnerDeletion": False}
            )  # fmt: skip
            await client.call(
                "PATCH", "Secret", self.name, body={"metadata": {"ownerReferences": refs}}
            )
        gpu_words = f", {gpus} {self.k8s.gpu_resource} each" if gpus else ""
        progress(
            f"job {ns}/{self.name}: {self.spec.nodes} pod(s) of image {image}{gpu_words}; "
            f"they dial back to {callback}"
        )
        if self.k8s.queue:
            await wait_admitted(
                client, self.name, labels, self.k8s.queue, self.spec.nodes,
                self.k8s.queue_timeout, progress,
            )  # fmt: skip
        await self._wait_running(client, progress, timeout)

    async def _own_pod(
        self, client: KubeClient, progress: Callable[[str], None]
    ) -> dict[str, Any] | None:
        """This notebook's pod, in-cluster (None outside, or when it cannot be read)."""
        if not self.env.get(IN_CLUSTER_VAR) and not os.environ.get(IN_CLUSTER_VAR):
            return None
        name = self.env.get(K8S_POD_VAR) or os.environ.get(K8S_POD_VAR) or socket.gethostname()
        namespace = _own_namespace() or client.namespace
        try:
            return await client.call("GET", "Pod", name, namespace=namespace, missing_ok=True)
        except AgentError as err:
            progress(f"cannot read this notebook's pod {namespace}/{name}: {err}")
            return None

    def _callback(self, own_pod: Mapping[str, Any] | None) -> tuple[str, int, str]:
        """Where to listen (host, port) and the address the pods are told to dial: with
        ``--k8s-callback HOST:PORT``, PORT on HOST when HOST is an address of this machine
        (or a name of one); when it is not (a NAT's, a Service's, which forwards to an
        address of this machine this side cannot know), on every interface of HOST's
        family (`DialBackListener`, `Door.bind`); in-cluster, a free port on the pod's IP."""
        if self.k8s.callback:
            host, port = check_callback(self.k8s.callback)
            return host, port, host
        ip = ((own_pod or {}).get("status") or {}).get("podIP")
        if ip:
            return str(ip), 0, str(ip)
        raise SpecError(
            "--k8s: the pods must dial back to this notebook, and it does not run in the "
            "cluster (no pod of its own was found). Run the notebook in the cluster (for "
            "example a JupyterHub on it), or give --k8s-callback HOST:PORT, an address of "
            "this machine the pods can reach (a free port there)"
        )

    async def _remove_leftovers(
        self, client: KubeClient, labels: Mapping[str, str], progress: Callable[[str], None]
    ) -> None:
        """What an earlier start of this session by this same process left (a start that
        was cut off) goes before the new one is made."""
        for kind in ("Job", "Secret"):
            for item in await client.items(kind, labels):
                name = str(item.get("metadata", {}).get("name"))
                if await client.delete(kind, name):
                    progress(f"removed {kind.lower()} {name}, left by an earlier start")

    async def _wait_running(
        self, client: KubeClient, progress: Callable[[str], None], timeout: float
    ) -> None:
        """Until every node's pod runs with an IP; the scheduler's or the container's
        reason when one cannot. The pods must all be on machines within the gang's bound
        (`GangWatch`)."""
        began = time.monotonic()
        gang = GangWatch(client.namespace, self.name, self.spec.nodes, self.k8s.gang_timeout)
        said_scaling = ""
        said = ""
        reasons: dict[int, str] = {}
        stuck_since: dict[int, float] = {}
        refusals = self._refusals(client)
        while True:
            pods = await client.items("Pod", {manifests.JOB_NAME_LABEL: self.name})
            by_index: dict[int, dict[str, Any]] = {}
            for pod in pods:
                index = pod_index(pod)
                if index is not None and not pod.get("metadata", {}).get("deletionTimestamp"):
                    by_index[index] = pod
            counts: dict[str, int] = {}
            reasons = {}
            for index in range(self.spec.nodes):
                mine = by_index.get(index)
                phase, why = pod_state(mine) if mine else ("not created", "")
                counts[phase] = counts.get(phase, 0) + 1
                if why:
                    reasons[index] = why
                if mine is not None:
                    _check_starting(index, mine, stuck_since)
            missing = [i for i in range(self.spec.nodes) if i not in by_index]
            refused = await refusals.check(client) if missing else ""
            if refused:
                reasons[missing[0]] = refused
            line = ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items()))
            detail = "; ".join(f"node {i}: {w}" for i, w in sorted(reasons.items()))
            now = f"pods: {line}" + (f" ({detail})" if detail else "")
            if now != said:
                progress(now)
                said = now
            scaling = await gang.check(client, by_index)
            if scaling and scaling != said_scaling:
                progress(scaling)
                said_scaling = scaling
            ready = [by_index.get(i) for i in range(self.spec.nodes)]
            if all(
                p is not None
                and (p.get("status") or {}).get("phase") == "Running"
                and (p.get("status") or {}).get("podIP")
                for p in ready
            ):
                self.pods = [_pod_info(p) for p in ready if p is not None]
                for index, info in enumerate(self.pods):
                    progress(f"node {index}: pod {info['name']} on {info['node']}, IP {info['ip']}")
                return
            if time.monotonic() - began > timeout:
                why = f": {detail}" if detail else f" ({line})"
                hint = (
                    ""
                    if gang.placed or self.k8s.queue
                    else "; --k8s-queue NAME would wait for room for all of them, in Kueue's queue"
                )
                raise AgentError(
                    f"Kubernetes: the session's pods were not all running within "
                    f"{timeout:.0f} s{why}; deleted job {client.namespace}/{self.name} and "
                    f"its secret{hint}"
                )
            await asyncio.sleep(POLL_S)

    # -- a lost node ---------------------------------------------------------------------
    async def replace_node(
        self, node: int, progress: Callable[[str], None], timeout: float
    ) -> None:
        """A new pod of completion index ``node`` in the place of the lost one, made by the
        Job's controller (the Job tolerates lost pods, `k8s_manifests`). First the node
        gets fresh keys, in the listener and the Secret: the lost pod, should it dial
        again, is refused. Then every pod of that index there now is deleted (the lost
        one, and one the controller made meanwhile, which read the old keys): at once when
        it was already terminating (its machine does not answer). Then it waits for a pod
        made after that to run, saying what it waits for."""
        client, listener = self.client, self.listener
        if client is None or listener is None or len(self.pods) != self.spec.nodes:
            raise AgentError("Kubernetes: the session's pods are not running")
        timeout = self.k8s.timeout or timeout
        where = f"{client.namespace}/{self.name}"
        await self._check_job(client)
        for pod in await self._index_pods(client, node):
            if (pod.get("status") or {}).get("phase") == "Succeeded":
                raise AgentError(
                    f"Kubernetes: node {node}'s pod {pod['metadata']['name']} ended "
                    "(Succeeded: it lost this notebook for longer than --k8s-grace), and job "
                    f"{where} does not run a completed index again; `%dist restart` starts "
                    "the session's pods afresh"
                )
        listener.renew(node)
        credentials = [listener.credentials(n) for n in range(self.spec.nodes)]
        await client.call("PATCH", "Secret", self.name, body=manifests.secret_patch(credentials))
        progress(f"node {node}: fresh keys in secret {where}: its lost pod cannot dial in again")
        old: dict[str, float] = {}  # pod name -> when it was deleted
        for pod in await self._index_pods(client, node):
            name = pod["metadata"]["name"]
            terminating = bool(pod["metadata"].get("deletionTimestamp"))
            await client.delete("Pod", name, grace=0 if terminating else None)
            old[name] = time.monotonic()
            phase, why = pod_state(pod)
            state = "terminating" if terminating else phase + (f": {why}" if why else "")
            progress(f"node {node}: deleted pod {name} ({state})")
        pod = await self._wait_replacement(client, node, old, progress, timeout)
        self.pods[node] = info = _pod_info(pod)
        progress(f"node {node}: pod {info['name']} on {info['node']}, IP {info['ip']}")

    # -- a live session resized -------------------------------------------------------------
    resizable = True

    async def resize(
        self, spec: SessionSpec, progress: Callable[[str], None], timeout: float
    ) -> None:
        """The Job scaled to ``spec.nodes`` pods (an Indexed Job's completions and
        parallelism change together, Kubernetes' elastic Indexed Job). More: the new
        nodes' keys go into the Secret first, then the Job's controller makes a pod for
        each new index, waited for (``--k8s-timeout``, else ``timeout``) as a heal waits;
        undone when one does not run. Fewer: the controller deletes the pods of the
        indexes past ``spec.nodes`` (not counted as failures), whose keys are forgotten."""
        client, listener, old = self.client, self.listener, self.spec.nodes
        if client is None or listener is None or len(self.pods) != old:
            raise AgentError("Kubernetes: the session's pods are not running")
        if self.k8s.queue and spec.nodes != old:
            raise SpecError(
                f"Kubernetes: the session's {old} pods were admitted by queue {self.k8s.queue} "
                "as one workload, which Kueue does not resize; stop the session and start it "
                f"with --nodes {spec.nodes}"
            )
        timeout = self.k8s.timeout or timeout
        where = f"{client.namespace}/{self.name}"
        await self._check_job(client)
        if spec.nodes > old:
            # pods of these indexes from before (a shrink's, still terminating) are not theirs
            before = {
                node: {
                    p["metadata"]["name"]: time.monotonic()
                    for p in await self._index_pods(client, node)
                }
                for node in range(old, spec.nodes)
            }
            listener.resize(spec.nodes)
            try:
                await self._patch_secret(client, listener, spec.nodes)
                await self._patch_job(client, spec.nodes)
                progress(f"job {where}: {spec.nodes} pods, {spec.nodes - old} more")
                for node in range(old, spec.nodes):
                    pod = await self._wait_replacement(
                        client, node, before[node], progress, timeout, why="ran as new node {node}"
                    )
                    self.pods.append(info := _pod_info(pod))
                    progress(f"node {node}: pod {info['name']} on {info['node']}, IP {info['ip']}")
            except BaseException:
                del self.pods[old:]
                with contextlib.suppress(Exception):
                    await self._patch_job(client, old)
                listener.resize(old)
                with contextlib.suppress(Exception):
                    await self._patch_secret(client, listener, old)
                raise
        elif spec.nodes < old:
            await self._patch_job(client, spec.nodes)
            listener.resize(spec.nodes)  # a removed pod dialling again is refused
            await self._patch_secret(client, listener, spec.nodes)
            gone = [p["name"] for p in self.pods[spec.nodes :]]
            del self.pods[spec.nodes :]
            progress(f"job {where}: {spec.nodes} pods; its controller deletes {', '.join(gone)}")
        self.spec = spec

    async def _patch_secret(
        self, client: KubeClient, listener: DialBackListener, nodes: int
    ) -> None:
        credentials = [listener.credentials(n) for n in range(nodes)]
        await client.call("PATCH", "Secret", self.name, body=manifests.secret_patch(credentials))

    async def _patch_job(self, client: KubeClient, nodes: int) -> None:
        await client.call("PATCH", "Job", self.name, body=manifests.job_size_patch(nodes))

    async def _index_pods(self, client: KubeClient, node: int) -> list[dict[str, Any]]:
        return await client.items(
            "Pod",
            {manifests.JOB_NAME_LABEL: self.name, manifests.COMPLETION_INDEX_LABEL: str(node)},
        )

    async def _check_job(self, client: KubeClient) -> None:
        """The session's Job is there and has not failed (its controller makes pods)."""
        jobs = await client.items("Job", self._labels)
        job = next((j for j in jobs if j.get("metadata", {}).get("name") == self.name), None)
        where = f"job {client.namespace}/{self.name}"
        if job is None:
            raise AgentError(
                f"Kubernetes: {where} is gone (deleted?), and its pods with it; "
                "`%dist restart` starts the session's pods afresh"
            )
        failed = job_failure(job)
        if failed:
            raise AgentError(
                f"Kubernetes: {where} failed ({failed}), and its pods with it; `%dist restart` "
                "starts the session's pods afresh"
            )
        if (job.get("spec") or {}).get("suspend"):
            by = (
                f"by queue {self.k8s.queue}: Kueue evicts a workload for one of higher priority"
                if self.k8s.queue
                else "its spec.suspend was set"
            )
            raise AgentError(
                f"Kubernetes: {where} was suspended ({by}), and its pods deleted with it; "
                "`%dist restart` starts the session's pods afresh"
            )

    async def _wait_replacement(
        self,
        client: KubeClient,
        node: int,
        old: dict[str, float],
        progress: Callable[[str], None],
        timeout: float,
        why: str = "took lost node {node}'s place",
    ) -> dict[str, Any]:
        """Until a pod of index ``node`` other than ``old`` runs with an IP; an old one
        still terminating after `STUCK_S` is deleted at once. ``why`` the pod is awaited,
        for the error (``{node}`` in it is the node)."""
        began = time.monotonic()
        said = ""
        stuck_since: dict[int, float] = {}
        refusals = self._refusals(client)
        while True:
            mine: dict[str, Any] | None = None
            for pod in await self._index_pods(client, node):
                meta = pod["metadata"]
                name = meta["name"]
                if name in old:
                    if time.monotonic() - old[name] > STUCK_S and meta.get("deletionTimestamp"):
                        progress(
                            f"node {node}: pod {name} is still terminating after {STUCK_S:.0f} "
                            "s (its machine does not answer?): deleting it at once"
                        )
                        await client.delete("Pod", name, grace=0)
                        old[name] = float("inf")  # asked once
                elif not meta.get("deletionTimestamp"):
                    mine = pod
            if mine is None:
                now = f"node {node}: waiting for the Job's controller to make a pod of index {node}"
                await self._check_job(client)
                refused = await refusals.check(client)
                now += f" ({refused})" if refused else ""
            else:
                _check_starting(node, mine, stuck_since)
                phase, why = pod_state(mine)
                status = mine.get("status") or {}
                if phase == "Running" and status.get("podIP"):
                    return mine
                now = f"node {node}: pod {mine['metadata']['name']} {phase}" + (
                    f" ({why})" if why else ""
                )
            if now != said:
                progress(now)
                said = now
            if time.monotonic() - began > timeout:
                raise AgentError(
                    f"Kubernetes: no pod {why.format(node=node)} within {timeout:.0f} s: "
                    f"{now.removeprefix(f'node {node}: ')}"
                )
            await asyncio.sleep(POLL_S)

    def _refusals(self, client: KubeClient) -> CreateRefusals:
        """What the API server said when it refused the Job's pods (`k8s_refusals`)."""
        return CreateRefusals(client.namespace, self.name, self.k8s.pod_template is not None)

    # -- nodes ---------------------------------------------------------------------------
    def launcher(self, spec: SessionSpec, node: int) -> Launcher:
        if self.listener is None or len(self.pods) != self.spec.nodes:
            raise AgentError("Kubernetes: the session's pods are not running yet")
        return K8sLauncher(self, node)

    async def pod_news(self, node: int) -> str | None:
        """How node ``node``'s pod stands now, as the API says: why it ended, if it did."""
        if self.client is None or node >= len(self.pods):
            return None
        try:
            pod = await self.client.call("GET", "Pod", self.pods[node]["name"], missing_ok=True)
        except AgentError as err:
            return str(err)
        if pod is None:
            return f"pod {self.pods[node]['name']} was deleted"
        phase, why = pod_state(pod)
        return f"pod {self.pods[node]['name']} is {phase}{': ' + why if why else ''}"

    def hold(self) -> ClusterHold:
        url = self.client.url if self.client is not None else ""
        return {
            "kind": "k8s",
            "address": url,
            "owner": self.owner.text,
            "namespace": self.client.namespace if self.client else (self.k8s.namespace or ""),
            "context": self.k8s.context,
        }

    # -- release -------------------------------------------------------------------------
    async def release(self) -> None:
        made, self._made = self._made, []
        client = self.client
        if client is not None and made:
            try:
                await asyncio.wait_for(self._delete(client, made), RELEASE_S)
            except (asyncio.TimeoutError, AgentError) as err:
                log.warning(
                    "k8s: deleting %s: %s; the owner's labels find them (a later server "
                    "removes them), and the Job's deadline ends them",
                    ", ".join(f"{k.lower()} {n}" for k, n in made), err,
                )  # fmt: skip
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        if client is not None:
            await client.close()

    @staticmethod
    async def _delete(client: KubeClient, made: list[tuple[str, str]]) -> None:
        for kind, name in made:
            await client.delete(kind, name)
            log.info("k8s: deleted %s %s/%s", kind.lower(), client.namespace, name)


def _check_starting(index: int, pod: Mapping[str, Any], stuck_since: dict[int, float]) -> None:
    """Raise when node ``index``'s starting pod will not run: it ended, its container
    cannot start, or has waited for a retried reason (`STUCK_WAITING`) for `STUCK_S`."""
    name = pod["metadata"]["name"]
    phase, why = pod_state(pod)
    if phase in ("Failed", "Succeeded"):
        raise AgentError(
            f"Kubernetes: node {index}'s pod {name} ended before it connected: {why or phase}"
        )
    reason = why.split(":")[0]
    if reason in STUCK_WAITING:
        stuck_since.setdefault(index, time.monotonic())
    else:
        stuck_since.pop(index, None)
    stuck = time.monotonic() - stuck_since.get(index, time.monotonic()) > STUCK_S
    if reason in FATAL_WAITING or stuck:
        raise AgentError(f"Kubernetes: node {index}'s pod {name} cannot start: {why}")


def _own_namespace() -> str | None:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        return f.read(256).strip() or None
    return None


def _image_of(pod: Mapping[str, Any] | None) -> str | None:
    """The image of the notebook's container: the pod's first (JupyterHub's ``notebook``)."""
    containers = ((pod or {}).get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == "notebook":
            return str(container.get("image") or "") or None
    return str(containers[0].get("image") or "") or None if containers else None


def _template_image(template: Mapping[str, Any] | None) -> str | None:
    """The image of a pod template's container, if it names one."""
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    image = containers[0].get("image") if containers and isinstance(containers[0], dict) else None
    return image if isinstance(image, str) and image else None


def _pod_info(pod: Mapping[str, Any]) -> dict[str, str]:
    status = pod.get("status") or {}
    return {
        "name": str(pod["metadata"]["name"]),
        "ip": str(status.get("podIP")),
        "node": str((pod.get("spec") or {}).get("nodeName") or status.get("hostIP") or "?"),
    }


class K8sLauncher(DialBackLauncher):
    """Node ``node`` of a session on Kubernetes: the agent its pod's dial-back runs."""

    kind: ClassVar[str] = "k8s"
    link_name = "the connection the node's pod dialled in on"

    def __init__(self, placement: K8sPlacement, node: int) -> None:
        assert placement.listener is not None
        super().__init__(placement.listener, node)
        self.held = placement
        self.pod = placement.pods[node]

    @classmethod
    def placement(cls, spec: SessionSpec, env: Mapping[str, str]) -> K8sPlacement:
        if spec.k8s is None:
            raise SpecError("launcher 'k8s': the session has no Kubernetes options")
        return K8sPlacement(spec, env)

    @property
    def host(self) -> str:
        return self.pod["ip"]

    @property
    def label(self) -> str | None:
        """The pod's name: what ``kubectl`` shows."""
        return self.pod["name"]

    def peer_address(self) -> str | None:
        """Node 0's pod IP is the rendezvous: an address the other pods reach at once,
        where a pod's DNS name may not resolve yet."""
        return self.pod["ip"]

    async def describe_exit(self) -> str:
        how = await super().describe_exit()
        news = await self.held.pod_news(self.node)
        return f"{how}; {news}" if news else how

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "kind": self.kind,
            "namespace": self.held.client.namespace if self.held.client else None,
            "job": self.held.name,
            "pod": self.pod["name"],
            "ip": self.pod["ip"],
        }


__all__ = ["K8sLauncher", "K8sPlacement", "pod_index", "pod_state"]
