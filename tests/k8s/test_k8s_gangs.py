"""A session's pods as one gang on the emulated cluster: queued in Kueue's queue (the
emulator's queue controller admits a suspended Job only when all its pods fit), the wait
interrupted, admitted and run; under a Jupyter server, a queued start whose caller hangs
up undone; and, without a queue, a gang that is not all placed is released whole, naming
why. The cluster's machines offer GPUs of two kinds by name: one ``nvidia.com/gpu`` on
node-0, two MIG slices ``nvidia.com/mig-1g.10gb`` on node-1.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from jupyter_dist.common.ports import free_port
from jupyter_dist.control.launchers import k8s_manifests as m
from tests.conftest import CellOutput
from tests.integration.server_process import API, start_server, stop_server

from .cluster import K8sCluster
from .test_k8s_sessions import k8s_flags, nothing_left, session_objects

pytestmark = [pytest.mark.slow, pytest.mark.k8s, pytest.mark.timeout(300)]

MIG = "nvidia.com/mig-1g.10gb"


@pytest.fixture(scope="module")
def gpu_cluster(k8s_cluster_factory: Callable[..., K8sCluster]) -> Iterator[K8sCluster]:
    cluster = k8s_cluster_factory(nodes=2, node_resources={0: {"nvidia.com/gpu": 1}, 1: {MIG: 2}})
    with pytest.MonkeyPatch.context() as patch:  # the module's, undone after it
        patch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        yield cluster


def run_watching(
    shell: Any, cell: str, watch: Callable[[Callable[[], str], threading.Event], None]
) -> CellOutput:
    """Run ``cell``; meanwhile ``watch(printed, done)`` runs in a thread, ``printed()``
    being what the cell has printed so far and ``done`` set once the cell ended."""
    out, err = io.StringIO(), io.StringIO()
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(out.getvalue, done), daemon=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        watcher.start()
        try:
            result = shell.run_cell(cell, store_history=False)
        finally:
            done.set()
    watcher.join(timeout=60)
    return CellOutput(result, out.getvalue(), err.getvalue())


def wait_printed(printed: Callable[[], str], done: threading.Event, words: str) -> bool:
    """Whether the cell printed ``words`` before it ended (or 120 s passed)."""
    deadline = time.monotonic() + 120
    while words not in printed():
        if done.is_set() or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def blocker(cluster: K8sCluster, cpus: str) -> dict[str, Any]:
    """A running pod of someone else on node-1 holding ``cpus`` of its 4 CPUs (the
    kubelet leaves a pod made running alone)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "someone-elses", "labels": {"app": "other"}},
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {"name": "main", "image": "other:1", "resources": {"requests": {"cpu": cpus}}}
            ],
        },
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }
    made = cluster.create("pods", body)
    cluster.patch("pods", "someone-elses", {"status": body["status"]})
    return made


def test_a_queued_session_waits_for_room_for_all_its_pods_then_runs(
    gpu_cluster: K8sCluster, shell: Any, run: Callable[[str], CellOutput]
) -> None:
    """Two pods of 2 CPUs on two machines, one of which has 1 CPU free: the Job waits,
    suspended, with no pod; the cell says "queued in team". Interrupted, it deletes what
    it made. Started again, it runs once the other pod goes and Kueue admits both."""
    cluster = gpu_cluster
    blocker(cluster, "3")
    flags = k8s_flags("--nodes 2 --procs 1 --cpus 2 --k8s-queue team")
    cell = (
        f"%%distributed {flags} --session kq\n"
        "import torch.distributed as dist\nprint('ran', dist.get_world_size())"
    )
    seen: dict[str, Any] = {}

    def interrupt(printed: Callable[[], str], done: threading.Event) -> None:
        if wait_printed(printed, done, "queued in team"):
            (job,) = session_objects(cluster, "kq")["jobs"]
            seen["job"] = job
            seen["pods"] = cluster.list("pods", label_selector=f"{m.SESSION_LABEL}=kq")
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    try:
        stopped = run_watching(shell, cell, interrupt)
        text = stopped.stdout + stopped.stderr
        assert "job" in seen, text
        assert isinstance(stopped.error, KeyboardInterrupt), text
        job = seen["job"]
        assert job["spec"]["suspend"] is True, job["spec"]
        assert job["metadata"]["labels"][m.QUEUE_LABEL] == "team"
        assert m.QUEUE_LABEL not in job["spec"]["template"]["metadata"]["labels"]
        assert seen["pods"] == []  # a suspended Job has none
        nothing_left(cluster, "kq", timeout=60)

        def make_room(printed: Callable[[], str], done: threading.Event) -> None:
            if wait_printed(printed, done, "queued in team"):
                seen["queued_pods"] = cluster.list("pods", label_selector=f"{m.SESSION_LABEL}=kq")
                cluster.delete("pods", "someone-elses")

        out = run_watching(shell, cell, make_room)
        text = out.stdout + out.stderr
        assert out.result.success, text
        assert "queued in team: job default/jd-kq-" in text, text
        assert "waits, suspended, for Kueue to admit its 2 pod(s) at once" in text, text
        assert seen["queued_pods"] == []
        assert "admitted by queue team after" in text, text
        assert "ran 2" in text, text
    finally:
        if cluster.get_or_none("pods", "someone-elses") is not None:
            cluster.delete("pods", "someone-elses")
        run("%dist shutdown --session kq")
    nothing_left(cluster, "kq", timeout=60)


def test_a_gang_that_is_not_all_placed_is_released_naming_why(
    gpu_cluster: K8sCluster, shell: Any
) -> None:
    """Two pods of one MIG slice each, on machines of their own: only node-1 has slices,
    so pod 0 goes there and pod 1 fits nowhere. Within --k8s-gang-timeout (not the far
    longer --k8s-timeout) every pod is deleted, and the error says why."""
    cluster = gpu_cluster
    flags = k8s_flags(
        f"--nodes 2 --gpus 1 --k8s-gpu-resource {MIG} --k8s-gang-timeout 4 --k8s-timeout 300"
    )
    nodes: dict[str, str] = {}

    def note_nodes(printed: Callable[[], str], done: threading.Event) -> None:
        while not done.is_set():
            for pod in cluster.list("pods", label_selector=f"{m.SESSION_LABEL}=kgang"):
                if pod["spec"].get("nodeName"):
                    nodes[pod["metadata"]["name"]] = pod["spec"]["nodeName"]
            time.sleep(0.1)

    out = run_watching(shell, f"%%distributed {flags} --session kgang\nx = 1", note_nodes)
    text = " ".join((out.stdout + out.stderr + str(out.error)).split())
    assert not out.result.success, text
    assert "1 of the session's 2 pods were not on a machine within 4 s (--k8s-gang-timeout)" in (
        text
    ), text
    assert (
        "Unschedulable: 0/2 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb, "
        "1 node(s) didn't match pod anti-affinity rules." in text
    ), text
    assert "Released them all" in text and "give --k8s-queue NAME" in text, text
    # the pod that was placed went to the machine with MIG slices, and is gone too
    assert list(nodes.values()) == ["node-1"], nodes
    nothing_left(cluster, "kgang", timeout=60)


def test_a_queued_start_whose_caller_hangs_up_is_undone_by_the_server(
    gpu_cluster: K8sCluster, tmp_path: Path
) -> None:
    """A notebook's stop button ends its request to the server: the server stops the start
    it waited for (a Job no queue will admit: no machine has amd.com/gpu) and deletes it."""
    cluster = gpu_cluster
    server = start_server(
        tmp_path, tmp_path / "config", extra_env={"KUBECONFIG": str(cluster.kubeconfig)}
    )
    try:
        body = {
            "name": "kqs", "launcher": "k8s", "nodes": 1, "gpus": 1,
            "k8s": {
                "queue": "team", "gpu_resource": "amd.com/gpu", "image": "team/train:1",
                "callback": f"127.0.0.1:{free_port()}",
            },
        }  # fmt: skip
        where = urlsplit(server.url)
        caller = http.client.HTTPConnection(where.hostname or "", where.port, timeout=120)
        caller.request(
            "POST",
            f"{API}/sessions",
            json.dumps(body),
            {"Authorization": f"token {server.token}", "Content-Type": "application/json"},
        )
        (job,) = cluster.wait_for(
            "the queued session's Job", lambda: session_objects(cluster, "kqs")["jobs"] or None
        )
        assert job["spec"]["suspend"] is True
        caller.close()  # hangs up, as a cancelled request does
        nothing_left(cluster, "kqs", timeout=60)
        log = cluster.wait_for(
            "the server's word on it",
            lambda: (
                "stopped the start of 'kqs': its caller hung up"
                in (text := (tmp_path / "server.log").read_text())
                and text
            ),
        )
        assert "Traceback" not in log, log
        status, listed = server.call("GET", f"{API}/sessions")
        assert status == 200 and listed == [], listed
    finally:
        stop_server(server)


def test_a_queue_on_a_cluster_without_kueue_is_refused_before_anything_is_made(
    k8s_cluster_factory: Callable[..., K8sCluster],
    run: Callable[[str], CellOutput],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing would ever admit the Job where Kueue is not installed: the start fails at
    once (not after --k8s-queue-timeout), naming what is missing."""
    cluster = k8s_cluster_factory(nodes=1, kueue=False)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    out = run(
        f"%%distributed {k8s_flags('--nodes 1 --procs 1 --k8s-queue team')} --session kk\nx = 1"
    )
    text = " ".join((out.stdout + out.stderr).split())
    assert not out.result.success, text
    assert (
        f"--k8s-queue team: the cluster at {cluster.url} serves no kueue.x-k8s.io API: Kueue "
        "is not installed there" in text
    ), text
    assert session_objects(cluster, "kk") == {"jobs": [], "secrets": []}


def test_a_gang_waits_past_its_bound_while_an_autoscaler_adds_a_machine(
    gpu_cluster: K8sCluster, shell: Any
) -> None:
    """The pod that fits nowhere gets the cluster autoscaler's TriggeredScaleUp Event (the
    test plays the autoscaler): the gang is not released at --k8s-gang-timeout, the cell
    says why it waits on, and only --k8s-timeout ends the start."""
    cluster = gpu_cluster
    flags = k8s_flags(
        f"--nodes 2 --gpus 1 --k8s-gpu-resource {MIG} --k8s-gang-timeout 4 --k8s-timeout 8"
    )

    def autoscaler(printed: Callable[[], str], done: threading.Event) -> None:
        while not done.is_set():
            for pod in cluster.list("pods", label_selector=f"{m.SESSION_LABEL}=kscale"):
                if pod["metadata"]["labels"][m.COMPLETION_INDEX_LABEL] == "1":
                    name = pod["metadata"]["name"]
                    cluster.create(
                        "events",
                        {
                            "apiVersion": "v1",
                            "kind": "Event",
                            "metadata": {"name": f"{name}.scale-up"},
                            "involvedObject": {"kind": "Pod", "name": name, "namespace": "default"},
                            "reason": "TriggeredScaleUp",
                            "message": "pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]",
                            "type": "Normal",
                            "source": {"component": "cluster-autoscaler"},
                        },
                    )
                    return
            time.sleep(0.1)

    out = run_watching(shell, f"%%distributed {flags} --session kscale\nx = 1", autoscaler)
    text = " ".join((out.stdout + out.stderr + str(out.error)).split())
    assert not out.result.success, text
    assert (
        "node 1: TriggeredScaleUp: pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}] (an "
        "autoscaler adds a machine: waiting past --k8s-gang-timeout, up to --k8s-timeout)"
    ) in text, text
    assert "the session's pods were not all running within 8 s" in text, text
    assert "Released them all" not in text, text
    nothing_left(cluster, "kscale", timeout=60)
