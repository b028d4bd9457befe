"""The multi-node fixture: real sshd servers, one per network namespace, on this machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system_needs import require

from .cluster import Cluster, missing_requirements, ssh_cluster


def require_cluster_support() -> None:
    require("multi-node ssh cluster", missing_requirements())


@pytest.fixture(scope="session", autouse=True)
def _shell_first(shell_before_cluster: None) -> None:
    """The shell outlives ``cluster``; see ``shell_before_cluster``."""


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two nodes, ``node0`` and ``node1``, each running sshd; see ``cluster.ssh_cluster``."""
    require_cluster_support()
    with ssh_cluster(2, workdir=tmp_path_factory.mktemp("cluster")) as running:
        yield running
