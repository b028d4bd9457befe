"""The emulated Kubernetes cluster itself: API server, Job controller, scheduler, kubelet.

Real HTTP against the emulator subprocess, real pod processes, kr8s as the launcher uses it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import stat
import time
from pathlib import Path
from typing import Any

import kr8s
import kr8s.asyncio
import psutil
import pytest

from tests.async_run import in_loop
from tests.k8s.api_server import NOTEBOOK_USER
from tests.k8s.cluster import ApiCallError, K8sCluster, process_group_alive
from tests.k8s.conftest import StartCluster
from tests.k8s.job_controller import collect_garbage
from tests.k8s.kube_client import ApiClient

pytestmark = pytest.mark.k8s

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_NAME_KEY = "batch.kubernetes.io/job-name"

#: prints the address it leaves from and what the pod sees, then waits to be killed
SHOW_AND_WAIT = (
    "import os, socket, stat, sys, time\n"
    "path = sys.argv[1]\n"
    "probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); probe.connect(('127.0.0.1', 9))\n"
    "print(probe.getsockname()[0], os.environ['POD_IP'], os.environ['JOB_COMPLETION_INDEX'],"
    " os.environ['SESSION_KEY'],"
    " open(path).read(), oct(stat.S_IMODE(os.stat(path).st_mode)), *sys.argv[2:], flush=True)\n"
    "time.sleep(600)\n"
)


def job_body(
    name: str, code: str, completions: int = 2, resources: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """An Indexed Job of ``completions`` pods running ``python -c code``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "emulator-test"}},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            **spec,
            "template": {
                "metadata": {"labels": {"app": "emulator-test", "run": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "main",
                            "image": "ignored:latest",
                            "command": ["python", "-c", code],
                            "resources": resources or {},
                        }
                    ],
                },
            },
        },
    }


def pods_of(cluster: K8sCluster, job: str) -> list[dict[str, Any]]:
    return cluster.list("pods", label_selector=f"{JOB_NAME_KEY}={job}")


def running_pods(cluster: K8sCluster, job: str, n: int) -> list[dict[str, Any]] | None:
    pods = pods_of(cluster, job)
    ok = len(pods) == n and all(p["status"].get("phase") == "Running" for p in pods)
    return pods if ok else None


def job_condition(cluster: K8sCluster, job: str) -> dict[str, Any] | None:
    conditions = cluster.get("jobs", job).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["status"] == "True"), None)


#: an init container: the Secret's file, behind this pod's index, into a file of its own
HAND_OVER = (
    "import os, sys\n"
    "fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "os.write(fd, (os.environ['JOB_COMPLETION_INDEX'] + ':' + open(sys.argv[1]).read()).encode())\n"
)


def test_indexed_job_pods_run_with_their_env_secret_and_volume(k8s_cluster: K8sCluster) -> None:
    """Each pod's env (its index, its IP, a Secret's key), and its volumes: the Secret's,
    mounted in its init container, which writes into an emptyDir that the container, run
    after it, reads (``$(VAR)`` and the mount paths in argv as the kubelet gives them)."""
    cluster = k8s_cluster
    cluster.create(
        "secrets",
        {
            "metadata": {"name": "session-secret"},
            "stringData": {"key": "s3cr3t", "file.txt": "from-the-volume"},
        },
    )
    body = job_body("show", SHOW_AND_WAIT, completions=2)
    pod_spec = body["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    container["args"] = ["/handed/note", "--node=$(JOB_COMPLETION_INDEX)", "$$(KEPT)"]
    container["env"] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "SESSION_KEY",
            "valueFrom": {"secretKeyRef": {"name": "session-secret", "key": "key"}},
        },
    ]
    container["volumeMounts"] = [{"name": "handed", "mountPath": "/handed"}]
    pod_spec["initContainers"] = [
        {
            "name": "hand-over",
            "image": "ignored:latest",
            "command": ["python", "-c", HAND_OVER, "/etc/dist-secret/file.txt", "/handed/note"],
            "volumeMounts": [
                {"name": "secret", "mountPath": "/etc/dist-secret", "readOnly": True},
                {"name": "handed", "mountPath": "/handed"},
            ],
        }
    ]
    pod_spec["volumes"] = [
        {"name": "secret", "secret": {"secretName": "session-secret", "defaultMode": 0o600}},
        {"name": "handed", "emptyDir": {"medium": "Memory"}},
    ]
    pod_spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {JOB_NAME_KEY: "show"}},
                }
            ]
        }
    }
    job = cluster.create("jobs", body)
    assert job["metadata"]["uid"]

    pods = cluster.wait_for(
        "both pods of job show Running", lambda: running_pods(cluster, "show", 2)
    )
    by_index = {p["metadata"]["annotations"][INDEX_KEY]: p for p in pods}
    assert sorted(by_index) == ["0", "1"]
    for index, pod in by_index.items():
        meta = pod["metadata"]
        assert meta["name"].startswith(f"show-{index}-") and len(meta["name"]) == len("show-0-") + 5
        assert meta["labels"][JOB_NAME_KEY] == "show" and meta["labels"][INDEX_KEY] == index
        assert meta["labels"]["run"] == "show"  # the template's own labels stay
        [owner] = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "Job",
            "show",
            job["metadata"]["uid"],
            True,
        )
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and all(ip.startswith("127.0.") and ip != "127.0.0.1" for ip in ips)
    assert {p["spec"]["nodeName"] for p in pods} == {"node-0", "node-1"}  # anti-affinity spreads

    def shown(pod: dict[str, Any]) -> str | None:
        return cluster.pod_log(pod["metadata"]["name"]).strip() or None

    for index, pod in by_index.items():
        line = cluster.wait_for(
            f"pod {index} printed its environment", functools.partial(shown, pod)
        )
        assert line == (  # it leaves from its own address, as from a pod's eth0
            f"{pod['status']['podIP']} {pod['status']['podIP']} {index} s3cr3t"
            f" {index}:from-the-volume 0o600 --node={index} $(KEPT)"
        )
        [init] = cluster.get("pods", pod["metadata"]["name"])["status"]["initContainerStatuses"]
        assert init["name"] == "hand-over"
        assert (init["state"]["terminated"]["exitCode"], init["ready"]) == (0, False)

    processes = cluster.pod_processes()
    assert sorted(processes) == sorted(p["metadata"]["name"] for p in pods)
    assert cluster.get("jobs", "show")["status"]["active"] == 2

    cluster.delete("jobs", "show")
    cluster.wait_for("the job's pods collected", lambda: not pods_of(cluster, "show"))
    cluster.wait_for("the pod processes gone", lambda: not cluster.pod_processes())
    assert not [pid for pid in processes.values() if process_group_alive(pid)]
    assert cluster.get("secrets", "session-secret")  # owned by nobody: stays
    cluster.delete("secrets", "session-secret")


def test_job_completes_then_its_ttl_removes_it(k8s_cluster: K8sCluster) -> None:
    cluster = k8s_cluster
    cluster.create(
        "jobs", job_body("done", "print('ok')", completions=2, ttlSecondsAfterFinished=600)
    )
    condition = cluster.wait_for("job done Complete", lambda: job_condition(cluster, "done"))
    assert condition["type"] == "Complete"
    status = cluster.get("jobs", "done")["status"]
    assert (status["succeeded"], status["active"], status["completedIndexes"]) == (2, 0, "0-1")
    for pod in pods_of(cluster, "done"):
        assert pod["status"]["phase"] == "Succeeded"
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    cluster.patch("jobs", "done", {"spec": {"ttlSecondsAfterFinished": 1}})  # now past it
    cluster.wait_for(
        "job done deleted after its ttl", lambda: cluster.get_or_none("jobs", "done") is None
    )
    cluster.wait_for("its pods collected", lambda: not pods_of(cluster, "done"))


def test_failing_pod_fails_the_job(k8s_cluster: K8sCluster, tmp_path: Path) -> None:
    """A container that fails, or an init container (then the container never runs, and
    the end of the init container's log is its message, as its policy asks)."""
    cluster = k8s_cluster
    cluster.create("jobs", job_body("fails", "raise SystemExit(3)", completions=1))
    ran = tmp_path / "ran"
    body = job_body("initfails", f"open({str(ran)!r}, 'w')", completions=1)
    body["spec"]["template"]["spec"]["initContainers"] = [
        {
            "name": "keys",
            "image": "ignored:latest",
            "command": ["python", "-c", "import sys; sys.exit('no keys for node 0')"],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    cluster.create("jobs", body)
    condition = cluster.wait_for("job fails Failed", lambda: job_condition(cluster, "fails"))
    assert (condition["type"], condition["reason"]) == ("Failed", "BackoffLimitExceeded")
    [pod] = pods_of(cluster, "fails")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["exitCode"], terminated["reason"]) == (
        "Failed",
        3,
        "Error",
    )
    cluster.delete("jobs", "fails")
    condition = cluster.wait_for("initfails Failed", lambda: job_condition(cluster, "initfails"))
    assert (condition["type"], condition["reason"]) == ("Failed", "BackoffLimitExceeded")
    [pod] = pods_of(cluster, "initfails")
    [init] = pod["status"]["initContainerStatuses"]
    terminated = init["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["exitCode"]) == ("Failed", 1)
    assert terminated["message"] == "no keys for node 0", terminated
    [main] = pod["status"]["containerStatuses"]
    assert main["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert not ran.exists()
    cluster.delete("jobs", "initfails")


def test_a_failed_pod_is_replaced_by_one_of_its_index_and_counted_once(
    k8s_cluster: K8sCluster,
) -> None:
    """Within the backoff limit a pod that failed gets a new one of its index; deleting
    the failed one then is no second failure."""
    cluster = k8s_cluster
    sleeper = "import time; time.sleep(600)"
    cluster.create("jobs", job_body("again", sleeper, completions=1, backoffLimit=1))
    [first] = cluster.wait_for("job again Running", lambda: running_pods(cluster, "again", 1))
    os.killpg(cluster.pod_processes()[first["metadata"]["name"]], signal.SIGKILL)

    def replaced() -> list[dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in pods_of(cluster, "again")}
        new = [p for n, p in pods.items() if n != first["metadata"]["name"]]
        return new if new and new[0]["status"].get("phase") == "Running" else None

    [second] = cluster.wait_for("a new pod of index 0 running", replaced)
    assert second["metadata"]["labels"][INDEX_KEY] == "0"
    cluster.delete("pods", first["metadata"]["name"])
    cluster.wait_for("the failed pod gone", lambda: len(pods_of(cluster, "again")) == 1, timeout=30)
    time.sleep(1)  # a few of the controller's rounds
    status = cluster.get("jobs", "again")["status"]
    assert status["failed"] == 1 and job_condition(cluster, "again") is None, status
    cluster.delete("jobs", "again")
    cluster.wait_for("its pods collected", lambda: not pods_of(cluster, "again"))


def test_an_indexed_job_scales_and_a_pod_it_removes_is_no_failure(
    k8s_cluster: K8sCluster,
) -> None:
    """Completions change only with parallelism (an elastic Indexed Job); scaled up, the
    controller makes the new index's pod; scaled down, it deletes that pod, which does not
    count against a backoff limit of 0; scaled up again, index 1 gets a new pod."""
    cluster = k8s_cluster
    cluster.create("jobs", job_body("elastic", "import time; time.sleep(600)", completions=1))
    cluster.wait_for("job elastic Running", lambda: running_pods(cluster, "elastic", 1))
    with pytest.raises(ApiCallError, match=r"can only be modified in tandem with spec\.parallel"):
        cluster.patch("jobs", "elastic", {"spec": {"completions": 2}})

    def scale(n: int) -> None:
        cluster.patch("jobs", "elastic", {"spec": {"completions": n, "parallelism": n}})

    def index_1(not_named: str = "") -> dict[str, Any] | None:
        pods = running_pods(cluster, "elastic", 2) or []
        return next(
            (p for p in pods if p["metadata"]["labels"][INDEX_KEY] == "1"
             and p["metadata"]["name"] != not_named),
            None,
        )  # fmt: skip

    scale(2)
    second = cluster.wait_for("index 1's pod Running", index_1)["metadata"]["name"]
    scale(1)
    cluster.wait_for(
        f"pod {second} deleted and its processes gone",
        lambda: (
            not any(p["metadata"]["name"] == second for p in pods_of(cluster, "elastic"))
            and second not in cluster.pod_processes()
        ),
    )
    scale(2)
    cluster.wait_for("a new pod of index 1 Running", lambda: index_1(not_named=second))
    status = cluster.get("jobs", "elastic")["status"]
    assert status["failed"] == 0 and job_condition(cluster, "elastic") is None, status
    cluster.delete("jobs", "elastic")
    cluster.wait_for("its pods collected", lambda: not pods_of(cluster, "elastic"))


def test_a_queued_job_is_admitted_when_all_its_pods_fit_and_loses_them_when_suspended(
    k8s_cluster: K8sCluster,
) -> None:
    """The queue controller admits a suspended Job labelled with Kueue's queue only once
    every pod fits at once (two pods of 3 CPUs, while another pod holds 3 of a machine's
    4); the Job controller makes no pod for a suspended Job, and deletes its pods when it
    is suspended again (no failure counted). A suspended Job without the label stays so."""
    cluster = k8s_cluster
    sleep = "import time; time.sleep(600)"
    cpus3 = {"requests": {"cpu": "3"}}
    cluster.create("jobs", job_body("hog", sleep, completions=1, resources=cpus3))
    cluster.wait_for("job hog Running", lambda: running_pods(cluster, "hog", 1))
    queued = job_body("queued", sleep, resources=cpus3, suspend=True)
    queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team"
    cluster.create("jobs", queued)
    cluster.create("jobs", job_body("unqueued", sleep, completions=1, suspend=True))
    cluster.wait_for(
        "the queue controller finding no room for both pods",
        lambda: "queue: job default/queued 2 pod(s) do not fit at once" in cluster.log_text(),
    )
    cluster.wait_for(
        "job queued marked Suspended",
        lambda: (job_condition(cluster, "queued") or {}).get("type") == "Suspended",
    )
    assert cluster.get("jobs", "queued")["spec"]["suspend"] is True
    assert pods_of(cluster, "queued") == []
    cluster.delete("jobs", "hog")
    pods = cluster.wait_for(
        "job queued admitted and Running", lambda: running_pods(cluster, "queued", 2)
    )
    assert cluster.get("jobs", "queued")["spec"]["suspend"] is False
    events = cluster.list("events", field_selector="involvedObject.name=queued")
    assert [e["message"] for e in events if e["reason"] == "Started"] == [
        "Admitted by clusterQueue team"
    ]
    assert pods_of(cluster, "unqueued") == []
    cluster.patch("jobs", "queued", {"spec": {"suspend": True}})
    names = {p["metadata"]["name"] for p in pods}
    cluster.wait_for(
        "the suspended Job's pods deleted and their processes gone",
        lambda: not pods_of(cluster, "queued") and not names & set(cluster.pod_processes()),
    )
    status = cluster.wait_for(
        "job queued Suspended again",
        lambda: (
            (s := cluster.get("jobs", "queued")["status"]).get("active") == 0
            and (job_condition(cluster, "queued") or {}).get("reason") == "JobSuspended"
            and s
        ),
    )
    assert status.get("failed", 0) == 0 and "startTime" not in status, status
    for job in ("queued", "unqueued"):
        cluster.delete("jobs", job)


def test_active_deadline_fails_the_job_and_kills_its_pods(k8s_cluster: K8sCluster) -> None:
    cluster = k8s_cluster
    sleeper = "import time; time.sleep(600)"
    cluster.create("jobs", job_body("late", sleeper, activeDeadlineSeconds=600))
    cluster.wait_for("job late Running", lambda: running_pods(cluster, "late", 2))
    assert len(cluster.pod_processes()) == 2
    cluster.patch("jobs", "late", {"spec": {"activeDeadlineSeconds": 1}})  # now past it
    condition = cluster.wait_for("job late Failed", lambda: job_condition(cluster, "late"))
    assert (condition["type"], condition["reason"]) == ("Failed", "DeadlineExceeded")
    assert condition["message"] == "Job was active longer than specified deadline"
    cluster.wait_for("its pods deleted", lambda: not pods_of(cluster, "late"))
    cluster.wait_for("their processes gone", lambda: not cluster.pod_processes())
    cluster.delete("jobs", "late")


def test_gpu_ask_no_node_has_stays_pending_unschedulable(k8s_cluster: K8sCluster) -> None:
    cluster = k8s_cluster
    cluster.create(
        "jobs",
        job_body("gpu", "pass", completions=1, resources={"limits": {"nvidia.com/gpu": "1"}}),
    )
    expected = (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are"
        " available: 2 No preemption victims found for incoming pod."
    )

    def unschedulable() -> dict[str, Any] | None:
        pods = pods_of(cluster, "gpu")
        conditions = pods[0]["status"].get("conditions") or [] if pods else []
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    condition = cluster.wait_for("the GPU pod marked unschedulable", unschedulable)
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Unschedulable",
        expected,
    )
    [pod] = pods_of(cluster, "gpu")
    assert pod["status"]["phase"] == "Pending" and "nodeName" not in pod["spec"]
    events = cluster.list("events", field_selector=f"involvedObject.name={pod['metadata']['name']}")
    [event] = [e for e in events if e["reason"] == "FailedScheduling"]
    assert (event["type"], event["message"], event["involvedObject"]["uid"]) == (
        "Warning",
        expected,
        pod["metadata"]["uid"],
    )
    assert not cluster.pod_processes()
    cluster.delete("jobs", "gpu")
    cluster.wait_for("its pod collected", lambda: not pods_of(cluster, "gpu"))


def test_gpus_fill_nodes_and_the_rest_waits(k8s_cluster_factory: StartCluster) -> None:
    cluster = k8s_cluster_factory(node_gpus=2)
    assert cluster.get("nodes", "node-1")["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    cluster.create(
        "jobs",
        job_body(
            "big",
            "import time; time.sleep(600)",
            completions=3,
            resources={"limits": {"nvidia.com/gpu": "2"}},
        ),
    )

    def two_run_one_waits() -> list[dict[str, Any]] | None:
        pods = pods_of(cluster, "big")
        phases = sorted(p["status"].get("phase") for p in pods)
        waiting = [
            p
            for p in pods
            if p["status"].get("conditions")
            and p["status"]["conditions"][0].get("reason") == "Unschedulable"
        ]
        return pods if phases == ["Pending", "Running", "Running"] and waiting else None

    pods = cluster.wait_for("two pods running, one unschedulable", two_run_one_waits)
    assert sorted(p["spec"].get("nodeName", "") for p in pods) == ["", "node-0", "node-1"]
    cluster.delete("jobs", "big")
    cluster.wait_for("the processes gone", lambda: not cluster.pod_processes())


def test_denied_verbs_answer_403_as_the_api_server_words_it(
    k8s_cluster_factory: StartCluster,
) -> None:
    cluster = k8s_cluster_factory(deny=["create:jobs", "delete:secrets", "list:pods"])
    with pytest.raises(ApiCallError) as denied:
        cluster.create("jobs", job_body("nope", "pass"))
    assert denied.value.status == 403
    assert denied.value.body["kind"] == "Status" and denied.value.body["reason"] == "Forbidden"
    assert denied.value.body["message"] == (
        'jobs.batch is forbidden: User "system:serviceaccount:default:notebook" cannot create'
        ' resource "jobs" in API group "batch" in the namespace "default"'
    )
    cluster.create("secrets", {"metadata": {"name": "kept"}, "stringData": {"a": "b"}})
    with pytest.raises(ApiCallError) as denied:
        cluster.delete("secrets", "kept")
    assert denied.value.body["message"] == (
        'secrets "kept" is forbidden: User "system:serviceaccount:default:notebook" cannot delete'
        ' resource "secrets" in API group "" in the namespace "default"'
    )
    with pytest.raises(ApiCallError) as denied:
        cluster.list("pods")
    assert denied.value.status == 403
    assert cluster.get("secrets", "kept")["data"] == {"a": "Yg=="}  # stringData folded into data


def test_an_object_off_the_schema_is_refused_naming_the_field(k8s_cluster: K8sCluster) -> None:
    body = job_body("typo", "pass", ttlSecondAfterFinished=5)
    with pytest.raises(ApiCallError) as invalid:
        k8s_cluster.create("jobs", body)
    assert (invalid.value.status, invalid.value.body["reason"]) == (422, "Invalid")
    assert invalid.value.body["message"].startswith(
        'Job.batch "typo" is invalid: spec: Additional properties are not allowed'
        " ('ttlSecondAfterFinished' was unexpected)"
    )
    body = job_body("typo", "pass")
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "N", "value": 3}]
    with pytest.raises(ApiCallError) as invalid:
        k8s_cluster.create("jobs", body)
    assert (
        "spec.template.spec.containers[0].env[0].value: 3 is not of type"
        in (invalid.value.body["message"])
    )
    assert k8s_cluster.get_or_none("jobs", "typo") is None


def test_a_request_without_the_token_gets_401(k8s_cluster: K8sCluster) -> None:
    for token in ("", "not-the-token"):
        with pytest.raises(ApiCallError) as refused:
            k8s_cluster.request("GET", "/api/v1/namespaces/default/pods", token=token)
        assert refused.value.status == 401
        assert refused.value.body["reason"] == "Unauthorized"


@in_loop
async def test_kr8s_drives_the_cluster(
    k8s_cluster: K8sCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = k8s_cluster
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    from_env = await kr8s.asyncio.api()
    assert from_env.namespace == "default"
    api = await kr8s.asyncio.api(kubeconfig=str(cluster.kubeconfig))
    assert await api.whoami() == NOTEBOOK_USER
    secret = await kr8s.asyncio.objects.Secret(
        {"metadata": {"name": "kr8s-secret"}, "stringData": {"token": "t"}}, api=api
    )
    await secret.create()
    job = await kr8s.asyncio.objects.Job(job_body("kr8s", "import time; time.sleep(600)"), api=api)
    await job.create()
    assert job.metadata.uid

    async def labelled() -> list[Any]:
        return [pod async for pod in api.get("pods", label_selector={JOB_NAME_KEY: "kr8s"})]

    for _ in range(600):
        pods = await labelled()
        if len(pods) == 2 and all(p.status.get("phase") == "Running" for p in pods):
            break
        await asyncio.sleep(0.2)
    assert sorted(p.metadata.labels[INDEX_KEY] for p in pods) == ["0", "1"]
    assert not [p async for p in api.get("pods", label_selector={JOB_NAME_KEY: "other"})]
    await job.delete(propagation_policy="Foreground")
    await secret.delete()
    assert not await secret.exists()
    for _ in range(600):
        if not await labelled() and not cluster.pod_processes():
            break
        await asyncio.sleep(0.2)
    assert not await labelled() and not cluster.pod_processes()
    assert not await job.exists()
    assert stat.S_IMODE(os.stat(cluster.kubeconfig).st_mode) == 0o600


#: ignores SIGTERM, and so does a child it starts in a session of its own
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import signal, time;"
    " signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def test_deleted_pod_that_ignores_sigterm_is_killed_with_its_children(
    k8s_cluster: K8sCluster,
) -> None:
    cluster = k8s_cluster
    body = job_body("stubborn", STUBBORN, completions=1)
    body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    cluster.create("jobs", body)
    [pod] = cluster.wait_for("the pod Running", lambda: running_pods(cluster, "stubborn", 1))
    name = pod["metadata"]["name"]
    child = int(cluster.wait_for("the child's pid", lambda: cluster.pod_log(name).strip() or None))
    [pid] = cluster.pod_processes().values()
    cluster.delete("pods", name)
    cluster.wait_for("the pod process killed", lambda: not process_group_alive(pid), timeout=30)

    def child_gone() -> bool:
        try:
            return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    cluster.wait_for("its child in another session killed too", child_gone, timeout=30)
    assert "SIGKILL default/" + name in cluster.log_text()  # SIGTERM was not enough
    cluster.delete("jobs", "stubborn")


@in_loop
async def test_the_collector_asks_before_it_deletes_what_an_old_list_shows_unowned(
    k8s_cluster: K8sCluster,
) -> None:
    cluster = k8s_cluster
    job = cluster.create("jobs", job_body("owner", "import time; time.sleep(600)", completions=1))
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "owner", "uid": job["metadata"]["uid"]}
    secret = cluster.create(
        "secrets",
        {"metadata": {"name": "owned", "ownerReferences": [ref]}, "stringData": {"k": "v"}},
    )
    async with ApiClient(cluster.url, cluster.token) as client:
        # a list taken before the Job was made: its Secret looks orphaned
        assert await collect_garbage(client, {"jobs": [], "secrets": [secret]}) == set()
    assert cluster.get_or_none("secrets", "owned") is not None
    cluster.delete("jobs", "owner", propagation=None)
    cluster.wait_for(
        "the Secret collected with its Job", lambda: cluster.get_or_none("secrets", "owned") is None
    )
    cluster.wait_for("the pod process gone", lambda: not cluster.pod_processes())


#: a grandchild in a session of its own, whose parent exits once told (a file appears): it
#: leaves the pod's process group and tree, but not its container
ESCAPES = (
    "import os, subprocess, sys, time\n"
    'code = \'import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, "-c",'
    ' "import time; time.sleep(600)"], start_new_session=True); print(p.pid, flush=True)\\n'
    "while not os.path.exists(sys.argv[1]): time.sleep(0.1)'\n"
    "subprocess.run([sys.executable, '-c', code, sys.argv[1]])\n"
    "time.sleep(600)\n"
)


def test_a_process_that_left_its_pods_tree_goes_with_the_pod(
    k8s_cluster: K8sCluster, tmp_path: Path
) -> None:
    cluster = k8s_cluster
    go = tmp_path / "parent-may-exit"
    body = job_body("escapes", ESCAPES, completions=1)
    body["spec"]["template"]["spec"]["containers"][0]["args"] = [str(go)]
    cluster.create("jobs", body)
    [pod] = cluster.wait_for("the pod Running", lambda: running_pods(cluster, "escapes", 1))
    name = pod["metadata"]["name"]
    escaped = int(
        cluster.wait_for("the grandchild's pid", lambda: cluster.pod_log(name).strip() or None)
    )
    cluster.wait_for(
        "the kubelet saw the grandchild under the pod",
        lambda: escaped in cluster.pod_descendants(name),
    )
    go.touch()
    [pid] = cluster.pod_processes().values()

    def left_the_tree() -> bool:
        return escaped not in {c.pid for c in psutil.Process(pid).children(recursive=True)}

    cluster.wait_for("the grandchild outside the pod's process tree", left_the_tree)
    assert psutil.Process(escaped).is_running()
    cluster.delete("jobs", "escapes")
    cluster.wait_for("the pod's processes gone", lambda: not cluster.pod_processes())

    def escaped_gone() -> bool:
        try:
            return psutil.Process(escaped).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    cluster.wait_for("the escaped grandchild killed with its pod", escaped_gone)
