"""Sessions as pods (``%%distributed --k8s``) against the emulated cluster: the API emulator
and the fixture playing scheduler, kubelet, Job controller and garbage collector
(``conftest.py``). Each pod's agent is a real local process dialling back; ranks are real
kernels; gloo runs across the two "pods" on their own loopback addresses.

Scenarios: start, cells and state, gloo across pods, a killed rank replaced, a lost node's
pod replaced by a heal (a new pod of its index, fresh keys), stop (Job, Secret and pods
deleted), a notebook SIGKILLed (its pods exit by themselves; the notebook's pod owns what
was made, and deleting it takes them), unschedulable, a missing RBAC verb, the same name
re-run, two sessions at once, a namespace that enforces the restricted Pod Security
Standard.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import psutil
import pytest
from jupyter_client.manager import KernelManager

from jupyter_dist.common import pod_template as pt
from jupyter_dist.common.ports import free_port
from jupyter_dist.control.launchers import k8s_manifests as m
from jupyter_dist.settings import INTERRUPT_ACK_VAR, K8S_POD_VAR, OUTPUT_VAR
from tests.conftest import CellOutput, ready_client, session_status
from tests.fault_flows import ddp_goes_on_bitwise, hang_is_freed, resize_two_three_two
from tests.integration.rank_lines import with_start

from .cluster import K8sCluster
from .pod_security import ENFORCE_LABEL

pytestmark = [pytest.mark.slow, pytest.mark.k8s, pytest.mark.timeout(600)]

#: per rank: MASTER_ADDR, pid, an all_reduce of rank+1 over the session
WHERE = (
    "import os, torch, torch.distributed as dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('where', os.environ['MASTER_ADDR'], os.getpid(), int(t.item()))\n"
)


def where(text: str) -> dict[int, list[str]]:
    return {r: lines[0].split()[1:] for r, lines in with_start(text, "where ").items() if lines}


def session_objects(cluster: K8sCluster, session: str) -> dict[str, list[dict[str, Any]]]:
    selector = f"{m.MANAGED_BY}={m.MANAGER},{m.SESSION_LABEL}={session}"
    return {kind: cluster.list(kind, label_selector=selector) for kind in ("jobs", "secrets")}


def pods_of(cluster: K8sCluster, job: str) -> dict[int, dict[str, Any]]:
    pods = cluster.list("pods", label_selector=f"{m.JOB_NAME_LABEL}={job}")
    return {int(p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL]): p for p in pods}


def descends_from(pid: int, ancestor: int) -> bool:
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.NoSuchProcess:
        return False


def secret_keys(cluster: K8sCluster, name: str) -> dict[int, bytes]:
    """Each node's host key in the session's Secret (its public half)."""
    data = base64.b64decode(cluster.get("secrets", name)["data"][m.SECRET_KEY])
    return {
        c["node"]: asyncssh.import_private_key(c["host_key"]).export_public_key()
        for c in json.loads(data)
    }


def keys_are_handed_over_and_gone(
    cluster: K8sCluster, job: dict[str, Any], pods: dict[int, dict[str, Any]]
) -> None:
    """No key in any container's environment: only our init container mounts the Secret
    (every node's keys) and hands each pod's node its own, in a file of a memory-backed
    emptyDir that the node read and removed before it started anything; no process of a
    pod (the node, its agent, its ranks) has a key in its environment or arguments."""
    spec = job["spec"]["template"]["spec"]
    for container in [*spec["initContainers"], *spec["containers"]]:
        assert "envFrom" not in container and not any(
            "valueFrom" in var and var["name"] != "JOB_COMPLETION_INDEX"
            for var in container.get("env", [])
        ), container
    mounting = [
        c["name"]
        for c in [*spec["initContainers"], *spec["containers"]]
        if any(v["name"] == pt.CREDENTIALS_VOLUME for v in c.get("volumeMounts", []))
    ]
    assert mounting == [pt.KEYS_CONTAINER]
    running = cluster.pod_processes()
    for index, pod in pods.items():
        name = pod["metadata"]["name"]
        [init] = pod["status"]["initContainerStatuses"]
        assert (init["name"], init["state"]["terminated"]["exitCode"]) == (pt.KEYS_CONTAINER, 0)
        (handed,) = (cluster.workdir / "pods").glob(f"{name}-*/volumes/{pt.NODE_KEY_VOLUME}")
        assert not any(handed.iterdir()), f"pod {name} left {list(handed.iterdir())}"
        pids = [running[name], *cluster.pod_descendants(name)]
        assert len(pids) > 2, pids  # the node, its agent, its ranks
        for pid in pids:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                seen = Path(f"/proc/{pid}/environ").read_bytes()
                seen += Path(f"/proc/{pid}/cmdline").read_bytes()
                assert b"PRIVATE KEY" not in seen and b"host_key" not in seen, (index, pid)


def wait_state(name: str, state: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while session_status(name)["state"] != state:
        assert time.monotonic() < deadline, session_status(name)
        time.sleep(0.1)


def nothing_left(cluster: K8sCluster, session: str, timeout: float = 90) -> None:
    """The session's Job, Secret, pods and pod processes are all gone within ``timeout``."""

    def gone() -> bool:
        made = session_objects(cluster, session)
        objects = cluster.list("pods", label_selector=f"{m.SESSION_LABEL}={session}")
        pods = [n for n in cluster.pod_processes() if n.startswith(f"jd-{session}-")]
        return not made["jobs"] and not made["secrets"] and not objects and not pods

    cluster.wait_for(f"nothing of session {session} left", gone, timeout)


@pytest.fixture(scope="module")
def k8s_env(k8s_cluster_factory: Callable[..., K8sCluster]) -> Iterator[K8sCluster]:
    """The module's cluster of three machines (a session grows to a third), as the
    notebook's kubeconfig (``KUBECONFIG``)."""
    cluster = k8s_cluster_factory(nodes=3)
    with pytest.MonkeyPatch.context() as patch:  # the module's, undone after it
        patch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        yield cluster


def k8s_flags(extra: str = "") -> str:
    return f"--k8s --k8s-callback 127.0.0.1:{free_port()} --image team/train:1 {extra}".strip()


def test_a_session_runs_as_pods_with_state_and_gloo_and_stop_deletes_everything(
    k8s_env: K8sCluster, run: Callable[[str], CellOutput]
) -> None:
    cluster = k8s_env
    out = run(f"%%distributed {k8s_flags('--nodes 2 --procs 2')} --session kone\n{WHERE}")
    try:
        assert out.result.success, out.stdout + out.stderr
        text = out.stdout
        # start-up told the pods' story, and where each node went
        assert re.search(r"job default/jd-kone-\w+: 2 pod\(s\) of image team/train:1", text), text
        assert "pods: 2 Running" in text, text
        made = session_objects(cluster, "kone")
        (job,) = made["jobs"]
        (secret,) = made["secrets"]
        name = job["metadata"]["name"]
        assert secret["metadata"]["name"] == name
        # the Secret goes with the Job; the keys are in the Secret only
        assert [r["kind"] for r in secret["metadata"]["ownerReferences"]] == ["Job"]
        keys = base64.b64decode(secret["data"][m.SECRET_KEY]).decode()
        assert "PRIVATE KEY" not in str(job) and "PRIVATE KEY" in keys
        pods = pods_of(cluster, name)
        assert sorted(pods) == [0, 1]
        for index, pod in pods.items():
            assert re.search(rf"node {index}: pod {pod['metadata']['name']} on node-\d", text)
        # gloo across both pods; MASTER_ADDR is node 0's pod IP, not a name
        seen = where(text)
        assert sorted(seen) == [0, 1, 2, 3], text
        assert {w[2] for w in seen.values()} == {"10"}
        assert {w[0] for w in seen.values()} == {pods[0]["status"]["podIP"]}
        # each node's ranks run under its own pod's process
        running = cluster.pod_processes()
        for rank, words in seen.items():
            pod = pods[rank // 2]["metadata"]["name"]
            assert descends_from(int(words[1]), running[pod]), (rank, pod, running)
        keys_are_handed_over_and_gone(cluster, job, pods)
        # the next cell runs in the same ranks
        nxt = run("%%distributed --session kone\nprint('again', os.getpid())")
        assert nxt.result.success, nxt.stdout
        again = {
            r: int(lines[0].split()[1]) for r, lines in with_start(nxt.stdout, "again ").items()
        }
        assert again == {r: int(w[1]) for r, w in seen.items()}
        # a rank SIGKILLed mid-cell is replaced alone, in its pod, by the next cell; the
        # others keep their processes and variables, and all join a new group
        run("%%distributed --session kone\nkept = dist.get_rank()")
        killed = run(
            "%%distributed --session kone\nimport signal, time\n"
            "if dist.get_rank() == 3:\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(1)"
        )
        assert not killed.result.success
        healed = run(f"%%distributed --session kone\n{WHERE}\nprint('kept', globals().get('kept'))")
        assert healed.result.success, healed.stdout + healed.stderr
        assert "rank 3 replaced by a fresh rank kernel" in " ".join(healed.stdout.split())
        after = where(healed.stdout)
        assert {w[2] for w in after.values()} == {"10"}
        assert {r: int(w[1]) for r, w in after.items() if r < 3} == {
            r: int(w[1]) for r, w in seen.items() if r < 3
        }
        assert int(after[3][1]) != int(seen[3][1])
        assert descends_from(int(after[3][1]), cluster.pod_processes()[pods[1]["metadata"]["name"]])
        assert with_start(healed.stdout, "kept") == {
            0: ["kept 0"],
            1: ["kept 1"],
            2: ["kept 2"],
            3: ["kept None"],
        }
        # node 1's machine is lost: every process of its pod dies at once (the pod Failed,
        # the Job's controller makes another with the old keys); the session is degraded
        # until a heal gives node 1 fresh keys and a new pod of index 1, started after them
        keys = secret_keys(cluster, name)
        lost = pods[1]["metadata"]["name"]
        os.killpg(cluster.pod_processes()[lost], signal.SIGKILL)
        wait_state("kone", "degraded")
        index_1 = f"{m.JOB_NAME_LABEL}={name},{m.COMPLETION_INDEX_LABEL}=1"
        cluster.wait_for(
            "the Job's controller made a pod in the lost one's place",
            lambda: any(
                p["metadata"]["name"] != lost for p in cluster.list("pods", label_selector=index_1)
            ),
        )
        made_meanwhile = {n for n in cluster.pod_processes() if n.startswith(f"{name}-1-")}
        node = run("%dist heal --session kone")
        said = " ".join((node.stdout + node.stderr).split())
        assert node.result.success, said
        assert "ranks 2-3 replaced by fresh rank kernels (node 1 started again)" in said, said
        assert "generation 2" in said and f"deleted pod {lost} (Failed" in said, said
        assert said.count("node 1: deleted pod ") == 2, said  # the controller's one too
        now = pods_of(cluster, name)
        assert now[0]["metadata"]["name"] == pods[0]["metadata"]["name"]
        new = now[1]["metadata"]["name"]
        assert new != lost and new not in made_meanwhile, (new, lost, made_meanwhile)
        assert re.search(rf"node 1: pod {new} on node-\d, IP [\d.]+", said), said
        renewed = secret_keys(cluster, name)
        assert renewed[0] == keys[0] and renewed[1] != keys[1]
        sums = run(
            f"%%distributed --session kone\n{WHERE}\nimport jupyter_dist\n"
            "print('kept', globals().get('kept'), jupyter_dist.info().generation)"
        )
        assert sums.result.success, sums.stdout + sums.stderr
        again = where(sums.stdout)
        assert {w[2] for w in again.values()} == {"10"}, sums.stdout
        assert {w[0] for w in again.values()} == {pods[0]["status"]["podIP"]}
        assert {r: w[1] for r, w in again.items() if r < 2} == {
            r: w[1] for r, w in after.items() if r < 2
        }
        for rank in (2, 3):
            assert descends_from(int(again[rank][1]), cluster.pod_processes()[new])
        assert with_start(sums.stdout, "kept") == {
            0: ["kept 0 2"],
            1: ["kept 1 2"],
            2: ["kept None 2"],
            3: ["kept None 2"],
        }
    finally:
        stop = run("%dist shutdown --session kone")
    assert stop.result.success, stop.stdout + stop.stderr
    nothing_left(cluster, "kone")


def test_the_same_name_runs_again_and_a_session_beside_it_outlives_a_hang_a_loss_and_a_resize(
    k8s_env: K8sCluster,
    run: Callable[[str], CellOutput],
    shell: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Two sessions side by side, one stopped and started again under its name; the
    other then goes through the faults that cost only what they touched: a one-rank
    barrier hang stopped (the rank freed), a DDP loop that lost rank 1, healed and synced,
    bitwise as an unbroken run, and a resize to a third pod and back (`tests.fault_flows`)."""
    cluster = k8s_env
    # a rank that does not take an interrupt is looked at after 3 s (10 by default)
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "3")
    names = []
    for _ in range(2):  # start, stop, start again under the same name
        out = run(f"%%distributed {k8s_flags('--nodes 1 --procs 1')} --session ktwo\nx = 1")
        assert out.result.success, out.stdout + out.stderr
        names.append(session_objects(cluster, "ktwo")["jobs"][0]["metadata"]["name"])
        if len(names) == 1:
            assert run("%dist shutdown --session ktwo").result.success
            nothing_left(cluster, "ktwo")
    assert names[0] != names[1]
    try:
        other = run(f"%%distributed {k8s_flags('--nodes 2 --procs 1')} --session kthree\n{WHERE}")
        assert other.result.success, other.stdout + other.stderr
        assert {w[2] for w in where(other.stdout).values()} == {"3"}
        again = run("%%distributed --session ktwo\nprint('x is', x)")
        assert "x is 1" in again.stdout, again.stdout
        assert run("%dist shutdown --session ktwo").result.success
        nothing_left(cluster, "ktwo")
        # the other session is untouched
        assert len(session_objects(cluster, "kthree")["jobs"]) == 1
        still = run("%%distributed --session kthree\nprint('still', dist.get_world_size())")
        assert "still 2" in still.stdout, still.stdout

        def cell(code: str) -> tuple[bool, str]:
            out = run(code)
            return bool(out.result.success), f"{out.stdout}{out.stderr}{out.error or ''}"

        def stop() -> None:  # the stop button of an embedded session
            shell.run_line_magic("dist", "interrupt --session kthree")

        hang_is_freed(cell, "kthree", stop, tmp_path / "hang")
        ddp_goes_on_bitwise(cell, "kthree")
        (job,) = session_objects(cluster, "kthree")["jobs"]
        job_name = job["metadata"]["name"]
        machines = {p["spec"]["nodeName"] for p in pods_of(cluster, job_name).values()}
        grew, shrank = resize_two_three_two(cell, "kthree")
        # the Job was scaled (an elastic Indexed Job): a pod of index 2 on the third
        # machine, which the controller deleted again; no pod failure counted
        third = re.findall(rf"node 2: pod ({job_name}-2-\w+) on (node-\d)", grew)
        assert third and third[0][1] not in machines, (machines, grew)
        assert f"its controller deletes {third[0][0]}" in shrank, shrank
        cluster.wait_for(
            "the Job back at 2 pods, index 2's gone",
            lambda: sorted(pods_of(cluster, job_name)) == [0, 1],
        )
        spec, status = (cluster.get("jobs", job_name)[k] for k in ("spec", "status"))
        assert (spec["completions"], spec["parallelism"]) == (2, 2), spec
        assert status.get("failed", 0) == 0, status
    finally:
        run("%dist shutdown --session ktwo")
        run("%dist shutdown --session kthree")
    nothing_left(cluster, "kthree")


def test_a_pod_that_cannot_be_scheduled_fails_the_start_with_the_schedulers_reason(
    k8s_env: K8sCluster, run: Callable[[str], CellOutput]
) -> None:
    cluster = k8s_env  # its machines have no GPUs
    began = time.monotonic()
    out = run(
        f"%%distributed {k8s_flags('--nodes 2 --gpus 1 --k8s-timeout 6')} --session kgpu\nx = 1"
    )
    text = out.stdout + out.stderr
    assert not out.result.success
    assert "were not all running within 6 s" in text, text
    assert "Insufficient nvidia.com/gpu" in text, text
    assert "Unschedulable" in text, text  # the progress said so while it waited
    assert time.monotonic() - began < 120
    nothing_left(cluster, "kgpu", timeout=60)


def test_a_missing_verb_is_named_and_nothing_is_left(
    k8s_cluster_factory: Callable[..., K8sCluster],
    run: Callable[[str], CellOutput],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = k8s_cluster_factory(deny=["create:jobs"])
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    out = run(f"%%distributed {k8s_flags('--nodes 2 --procs 1')} --session kdeny\nx = 1")
    text = out.stdout + out.stderr
    assert not out.result.success
    assert "Kubernetes refused to create jobs.batch" in text, text
    assert "needs the verb 'create' on 'jobs' (API group 'batch')" in text, text
    assert "cannot create resource" in text, text  # the API server's own words
    # the Secret made before the refusal was deleted
    nothing_left(cluster, "kdeny", timeout=60)


def test_outside_the_cluster_without_a_callback_is_refused_saying_what_to_do(
    k8s_env: K8sCluster, run: Callable[[str], CellOutput]
) -> None:
    out = run("%%distributed --k8s --nodes 1 --procs 1 --image a/b:1 --session kout\nx = 1")
    text = out.stdout + out.stderr
    assert not out.result.success
    assert "does not run in the cluster" in text and "--k8s-callback HOST:PORT" in text, text
    nothing_left(k8s_env, "kout", timeout=30)


# -- a notebook in a pod, killed -----------------------------------------------------------
NOTEBOOK_POD = "notebook-alice"


@pytest.fixture
def notebook_pod(k8s_env: K8sCluster) -> Iterator[dict[str, Any]]:
    """The pod the notebook runs in, as the API knows it (its process is this test's
    kernel: the kubelet leaves a pod that is already running alone)."""
    pod = k8s_env.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": NOTEBOOK_POD, "labels": {"app": "jupyterhub"}},
            "spec": {
                "nodeName": "node-0",
                "containers": [{"name": "notebook", "image": "team/notebook:7"}],
            },
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        },
    )
    k8s_env.patch("pods", NOTEBOOK_POD, {"status": {"phase": "Running", "podIP": "127.0.0.1"}})
    yield pod
    if k8s_env.get_or_none("pods", NOTEBOOK_POD) is not None:
        k8s_env.delete("pods", NOTEBOOK_POD)


def test_a_killed_notebook_leaves_pods_that_exit_and_its_pod_owns_what_was_made(
    k8s_env: K8sCluster, notebook_pod: dict[str, Any], kernel_name: str, tmp_path: Path
) -> None:
    cluster = k8s_env
    km = KernelManager(kernel_name=kernel_name)
    env = {
        **os.environ,
        OUTPUT_VAR: "text",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",  # in a pod, as Kubernetes says
        K8S_POD_VAR: NOTEBOOK_POD,
    }
    km.start_kernel(cwd=str(tmp_path), env=env)
    try:
        kc = ready_client(km, timeout=120)
        texts: list[str] = []

        def execute(code: str) -> dict[str, Any]:
            def hook(msg: dict[str, Any]) -> None:
                if msg["msg_type"] == "stream":
                    texts.append(msg["content"]["text"])
                elif msg["msg_type"] == "error":
                    texts.append("\n".join(msg["content"]["traceback"]))

            reply = kc.execute_interactive(code, output_hook=hook, timeout=300)
            return reply["content"]  # type: ignore[no-any-return]

        assert execute("%load_ext jupyter_dist")["status"] == "ok"
        # no --image, no --k8s-callback: the notebook pod's image and IP
        reply = execute(
            "%%distributed --k8s --nodes 2 --procs 1 --k8s-grace 2 --session knb\n"
            "import os; print('up', os.environ['MASTER_ADDR'])"
        )
        assert reply["status"] == "ok", "".join(texts)
        assert "dial back to 127.0.0.1:" in "".join(texts)
        made = session_objects(cluster, "knb")
        (job,) = made["jobs"]
        uid = notebook_pod["metadata"]["uid"]
        for obj in (job, *made["secrets"]):
            owners = {(r["kind"], r["uid"]) for r in obj["metadata"]["ownerReferences"]}
            assert ("Pod", uid) in owners, obj["metadata"]
        assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "team/notebook:7"
        name = job["metadata"]["name"]
        pods = cluster.pod_processes()
        mine = {n: pid for n, pid in pods.items() if n.startswith(name)}
        assert len(mine) == 2, pods
        kc.stop_channels()
    finally:
        os.kill(km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
        km.cleanup_resources()
    # the pods lose their link and exit by themselves after their grace (2 s)
    cluster.wait_for(
        "the dead notebook's pods exited by themselves",
        lambda: not any(n.startswith(name) for n in cluster.pod_processes()),
        timeout=90,
    )
    cluster.wait_for(
        "the exited pods' phase says so",
        lambda: (
            {p["status"]["phase"] for p in pods_of(cluster, name).values()}
            <= {"Succeeded", "Failed"}
        ),
        timeout=60,
    )
    assert session_objects(cluster, "knb")["jobs"], "the Job is there until its owner goes"
    # the notebook's pod goes: what it owns goes with it
    cluster.delete("pods", NOTEBOOK_POD)
    nothing_left(cluster, "knb", timeout=60)


def test_a_restricted_namespace_runs_the_pods_and_refuses_a_template_that_breaks_it_at_once(
    k8s_env: K8sCluster, run: Callable[[str], CellOutput], tmp_path: Path
) -> None:
    """The pods pass the restricted Pod Security Standard as made (the emulator's admission
    refuses any that does not, `pod_security.py`); a template that makes them fail it (a
    privileged container) fails the start at once, naming the namespace's policy and the
    violation, read from the Job's FailedCreate Event, and nothing is left."""
    cluster = k8s_env
    locked = {"metadata": {"name": "locked", "labels": {ENFORCE_LABEL: "restricted"}}}
    cluster.request("POST", "/api/v1/namespaces", {"kind": "Namespace", **locked})
    flags = k8s_flags("--nodes 1 --procs 2 --namespace locked --k8s-timeout 60")
    out = run(f"%%distributed {flags} --session klocked\nprint('ran', 6 * 7)")
    text = out.stdout + out.stderr
    try:
        assert out.result.success, text
        assert sorted(with_start(text, "ran ")) == [0, 1], text
        selector = f"{m.SESSION_LABEL}=klocked"
        (job,) = cluster.list("jobs", label_selector=selector, namespace="locked")
        assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    finally:
        run("%dist shutdown --session klocked")
    template = tmp_path / "privileged.yaml"
    template.write_text("spec:\n  containers:\n  - securityContext: {privileged: true}\n")
    out = run(f"%%distributed {flags} --pod-template {template} --session kpriv\nx = 1")
    text = out.stdout + out.stderr
    assert not out.result.success
    assert (
        "namespace locked enforces the Pod Security Standard 'restricted' "
        "(label pod-security.kubernetes.io/enforce)"
    ) in text, text
    assert 'privileged (container "node" must not set securityContext.privileged=true)' in text
    assert "were not all running within" not in text, text  # said at once, not at the timeout

    def gone() -> bool:
        made = [
            o
            for kind in ("jobs", "secrets", "pods")
            for session in ("klocked", "kpriv")
            for o in cluster.list(kind, f"{m.SESSION_LABEL}={session}", namespace="locked")
        ]
        return not made

    cluster.wait_for("nothing of the sessions in namespace locked left", gone, 60)
