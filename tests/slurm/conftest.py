"""The Slurm fixture: a real single-node Slurm (munged, slurmctld, slurmd) on this machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system_needs import require

from .cluster import SlurmCluster, missing_requirements, slurm_cluster


def require_slurm_support() -> None:
    require("single-node Slurm", missing_requirements())


@pytest.fixture(scope="session", autouse=True)
def _shell_first(shell_before_cluster: None) -> None:
    """The shell outlives ``slurm``; see ``shell_before_cluster``."""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """This machine as the only node of a Slurm cluster; see ``cluster.slurm_cluster``."""
    require_slurm_support()
    with slurm_cluster(workdir=tmp_path_factory.mktemp("slurm")) as running:
        yield running
