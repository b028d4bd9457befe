"""Cluster managers' environments, and the version check of a node's agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dist.common.cluster_env import detect_skypilot, detect_slurm, slurm_gpus_per_node
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.control.agent_client import AgentInfo, check_versions
from jupyter_dist.errors import AgentError, SpecError


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


def test_slurm_nodes_and_gpus_on_node() -> None:
    found = detect_slurm(
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu1,gpu2", "SLURM_GPUS_ON_NODE": "4"}
    )
    assert found is not None
    assert found.source == "Slurm"
    assert found.hosts == (HostSpec("gpu1"), HostSpec("gpu2"))
    assert found.gpus_per_node == 4


def test_slurm_old_nodelist_name_and_no_gpus() -> None:
    found = detect_slurm({"SLURM_NODELIST": "cpu7"})
    assert found is not None
    assert found.hosts == (HostSpec("cpu7"),)
    assert found.gpus_per_node is None


@pytest.mark.parametrize(
    ("value", "gpus"),
    [("4", 4), ("a100:4", 4), ("gpu:a100:2", 2), ("a100:2,v100:2", 4), ("0", None)],
)
def test_slurm_gpus_per_node_forms(value: str, gpus: int | None) -> None:
    assert slurm_gpus_per_node({"SLURM_GPUS_PER_NODE": value}) == gpus


def test_slurm_gpus_on_node_wins_over_per_node() -> None:
    env = {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "a100:8"}
    assert slurm_gpus_per_node(env) == 2


def test_bad_slurm_gpu_count_names_the_variable() -> None:
    with pytest.raises(SpecError, match=r"SLURM_GPUS_PER_NODE='a100:x'.*like a100:4"):
        slurm_gpus_per_node({"SLURM_GPUS_PER_NODE": "a100:x"})


def test_no_slurm() -> None:
    assert detect_slurm({}) is None
    assert detect_slurm({"SLURM_JOB_NODELIST": ""}) is None


def test_slurm_ranges_without_scontrol_say_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol there
    with pytest.raises(SpecError, match=r"SLURM_JOB_NODELIST='n\[1-2\]'.*scontrol is not on"):
        detect_slurm({"SLURM_JOB_NODELIST": "n[1-2]"})
