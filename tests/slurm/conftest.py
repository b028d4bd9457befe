"""The Slurm fixture: a real single-node Slurm (munged, slurmctld, slurmd) on this machine."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .cluster import SlurmCluster, missing_requirements, slurm_cluster


def in_ci() -> bool:
    """CI must never skip the Slurm tests silently: there, a missing need fails."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_slurm_support() -> None:
    """Skip (locally) or fail (in CI) when this machine cannot run a test Slurm."""
    problems = missing_requirements()
    if problems:
        reason = "single-node Slurm unavailable: " + "; ".join(problems)
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """This machine as the only node of a Slurm cluster; see ``cluster.slurm_cluster``."""
    require_slurm_support()
    with slurm_cluster(workdir=tmp_path_factory.mktemp("slurm")) as running:
        yield running
