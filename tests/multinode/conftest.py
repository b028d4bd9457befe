"""The multi-node fixture: real sshd servers, one per network namespace, on this machine."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .cluster import Cluster, missing_requirements, ssh_cluster


def in_ci() -> bool:
    """CI must never skip the multi-node tests silently: there, a missing need fails."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_cluster_support() -> None:
    """Skip (locally) or fail (in CI) when this machine cannot run an ssh test cluster."""
    problems = missing_requirements()
    if problems:
        reason = "multi-node ssh cluster unavailable: " + "; ".join(problems)
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two nodes, ``node0`` and ``node1``, each running sshd; see ``cluster.ssh_cluster``."""
    require_cluster_support()
    with ssh_cluster(2, workdir=tmp_path_factory.mktemp("cluster")) as running:
        yield running
