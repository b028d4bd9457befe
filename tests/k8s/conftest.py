"""Fixtures of the emulated Kubernetes cluster (``tests/k8s/api_server.py`` and its kubelet).

* ``k8s_cluster_factory``: ``start(deny=(), nodes=2, node_gpus=0, node_cpus=4,
  node_memory="16Gi", node_resources=None, kueue=True) -> K8sCluster`` starts a fresh
  cluster with those options (a denied verb list such as ``["create:jobs"]``, a GPU count
  per node, other extended resources by node index: ``{1: {"nvidia.com/mig-1g.10gb":
  7}}``, ``kueue=False`` for a cluster without Kueue); every cluster it started is stopped
  at the end of the module.
* ``k8s_cluster``: one default cluster (2 nodes, 4 CPUs, no GPUs) shared by the module.

Teardown stops the server (its kubelet terminates every pod process), then kills any pod
process group still alive and fails the test run's teardown naming them. A failing test's
report gets the cluster's log (API requests that changed state, controller and kubelet
actions). ``KUBECONFIG`` is left alone: pass ``cluster.kubeconfig`` where it is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence

import pytest

from tests.k8s.cluster import K8sCluster, start_cluster

StartCluster = Callable[..., K8sCluster]

_RUNNING: list[K8sCluster] = []


@pytest.fixture(scope="module")
def k8s_cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartCluster]:
    started: list[K8sCluster] = []

    def start(
        deny: Sequence[str] = (),
        nodes: int = 2,
        node_gpus: int = 0,
        node_cpus: int = 4,
        node_memory: str = "16Gi",
        node_resources: Mapping[int, Mapping[str, int]] | None = None,
        kueue: bool = True,
    ) -> K8sCluster:
        cluster = start_cluster(
            tmp_path_factory.mktemp("k8s"),
            deny=deny,
            nodes=nodes,
            node_gpus=node_gpus,
            node_cpus=node_cpus,
            node_memory=node_memory,
            node_resources=node_resources,
            kueue=kueue,
        )
        started.append(cluster)
        _RUNNING.append(cluster)
        return cluster

    try:
        yield start
    finally:
        left: list[str] = []
        for cluster in reversed(started):
            left += cluster.stop()
            _RUNNING.remove(cluster)
        assert not left, f"pod processes outlived the emulated cluster (killed now): {left}"


@pytest.fixture(scope="module")
def k8s_cluster(k8s_cluster_factory: StartCluster) -> K8sCluster:
    return k8s_cluster_factory()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for cluster in _RUNNING:
            tail = "\n".join(cluster.log_text().splitlines()[-80:])
            report.sections.append((f"emulated k8s cluster {cluster.url}", tail))
    return report
