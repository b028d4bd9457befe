"""Cluster managers' environments, and the version check of a node's agent."""

from __future__ import annotations

import pytest

from jupyter_dist.cluster_env import detect_skypilot
from jupyter_dist.errors import AgentError, SpecError
from jupyter_dist.hosts import HostSpec
from jupyter_dist.node_agent import AgentInfo, check_versions


def test_skypilot_nodes() -> None:
    found = detect_skypilot(
        {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    )
    assert found is not None
    assert found.hosts == (HostSpec("10.0.0.5"), HostSpec("10.0.0.6"))
    assert found.gpus_per_node == 8


def test_no_skypilot() -> None:
    assert detect_skypilot({}) is None


def test_bad_skypilot_gpu_count() -> None:
    with pytest.raises(SpecError, match="SKYPILOT_NUM_GPUS_PER_NODE='x'"):
        detect_skypilot({"SKYPILOT_NODE_IPS": "10.0.0.5", "SKYPILOT_NUM_GPUS_PER_NODE": "x"})


def info(jd: str, torch: str) -> AgentInfo:
    return AgentInfo("gpu7", 1, "/opt/py/bin/python", (), {"jupyter_dist": jd, "torch": torch})


def test_other_jupyter_dist_on_a_node_is_named() -> None:
    import torch

    with pytest.raises(
        AgentError, match=r"node 'gpu7': /opt/py/bin/python has jupyter_dist 0\.0\.1"
    ):
        check_versions(info("0.0.1", torch.__version__))


def test_other_torch_on_a_node_is_named() -> None:
    import jupyter_dist

    with pytest.raises(AgentError, match=r"has torch 1\.13\.0, this notebook has"):
        check_versions(info(jupyter_dist.__version__, "1.13.0"))
    check_versions(info(jupyter_dist.__version__, torch_local() + "+cu121"))


def torch_local() -> str:
    import torch

    return str(torch.__version__).split("+")[0]
