"""The Ray fixture: a head and two worker nodes, each ``ray start`` in its own namespace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system_needs import require

from .cluster import START_TIMEOUT, RayCluster, missing_requirements, ray_cluster


@pytest.fixture(scope="session", autouse=True)
def _shell_first(shell_before_cluster: None) -> None:
    """The shell outlives ``ray_nodes``; see ``shell_before_cluster``."""


@pytest.fixture(scope="session")
def ray_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A Ray cluster with token authentication on; see ``cluster.ray_cluster``.

    Skipped with the reason where it cannot run (not root, no ``ip netns``, no ray); in CI
    that fails instead. Its start-up time is in the run's summary (tests/timing_report.py).
    """
    require("multi-node Ray cluster", missing_requirements())
    with ray_cluster(workdir=tmp_path_factory.mktemp("ray")) as running:
        yield running


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test on the cluster pays for its start (pytest-timeout counts fixtures):
    every test using it gets the start-up deadline on top of the usual limit."""
    for item in items:
        uses = "ray_nodes" in getattr(item, "fixturenames", ())
        if uses and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(START_TIMEOUT + 240))
