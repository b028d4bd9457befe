"""The ``slurm`` launcher and ``--slurm`` against a real single-node Slurm.

The code under test runs where a user's notebook would: in a process that ``salloc``
started inside an allocation (`tests.slurm.inside`), so it sees the allocation's real
environment. A few checks need no allocation and run here directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.cluster_env import detect_slurm, expand_nodelist
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.control.agent_client import AgentClient
from jupyter_dist.control.launchers import launcher_class
from jupyter_dist.control.launchers.slurm import SlurmLauncher, srun_environment
from jupyter_dist.errors import AgentError
from tests.integration.rank_lines import with_start
from tests.multinode.cluster import missing_requirements as ssh_cluster_problems
from tests.multinode.cluster import ssh_cluster
from tests.system_needs import in_ci

from .cluster import SlurmCluster

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
#: one scenario's whole run: allocation, agents, ranks, teardown, on a busy machine
SCENARIO_TIMEOUT = 200  # below the per-test timeout, so this one reports what it saw


def inside_allocation(
    slurm: SlurmCluster, scenario: str, out: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``tests.slurm.inside SCENARIO`` under ``salloc`` on the whole node; its facts."""
    argv = ["salloc", "--nodes=1", "--exclusive", "--time=10", "--quiet"]
    argv += [f"--job-name=jd-{scenario}", sys.executable, "-m", "tests.slurm.inside"]
    argv += [scenario, "--out", str(out)]
    with subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**slurm.env(), **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=SCENARIO_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail(f"{scenario} did not finish in {SCENARIO_TIMEOUT} s:\n{output}")
    facts: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    facts["output"] = output
    facts["returncode"] = proc.returncode
    return facts


def show(facts: dict[str, Any]) -> str:
    return json.dumps(facts, indent=1)


@pytest.fixture(scope="module")
def launcher_facts(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("inside") / "launcher.json"
    return inside_allocation(slurm, "launcher", out)


def test_launcher_scenario_ran_cleanly(launcher_facts: dict[str, Any]) -> None:
    assert launcher_facts["returncode"] == 0, show(launcher_facts)
    assert "exception" not in launcher_facts, launcher_facts["exception"]


def test_detect_slurm_finds_this_node(launcher_facts: dict[str, Any], slurm: SlurmCluster) -> None:
    assert launcher_facts["detected"] == [slurm.node], show(launcher_facts)
    assert launcher_facts["detected_gpus"] is None


def test_agent_and_its_ranks_run_in_a_job_step(launcher_facts: dict[str, Any]) -> None:
    facts = launcher_facts
    assert "slurmstepd" in facts["agent_ancestors"], show(facts)
    assert "slurmstepd" in facts["rank_ancestors"], show(facts)
    job = facts["job"]
    assert any(
        s.startswith(f"{job}.") and "jupyter_dist-slurmtest" in s for s in facts["steps_running"]
    ), show(facts)


def test_rank_kernel_answers_directly_on_this_node(launcher_facts: dict[str, Any]) -> None:
    assert launcher_facts["tunnel_unchanged"] is True, show(launcher_facts)
    rank, step = launcher_facts["rank_says"].split()
    assert rank == "rank"  # the env given to the rank
    assert step.isdigit()  # the agent's step environment, inherited


def test_stop_leaves_nothing_behind(launcher_facts: dict[str, Any]) -> None:
    facts = launcher_facts
    assert facts["alive_after_stop"] == [], show(facts)
    assert facts["steps_after_stop"] == [], show(facts)
    assert facts["srun_returncode"] == 0, show(facts)


def test_killing_srun_ends_the_step(launcher_facts: dict[str, Any]) -> None:
    facts = launcher_facts
    assert facts["killed_alive"] == [], show(facts)
    assert facts["killed_steps_after"] == [], show(facts)
    assert facts["killed_noticed"] is True, show(facts)


def test_stop_signals_an_agent_deaf_to_eof(launcher_facts: dict[str, Any]) -> None:
    facts = launcher_facts
    assert facts["deaf_started"] is True, show(facts)  # the step ran it before the stop
    assert facts["deaf_stop_s"] < 30, show(facts)  # 2 s for EOF, then SIGTERM to srun
    assert facts["deaf_srun_returncode"] is not None, show(facts)
    assert facts["deaf_steps_after"] == [], show(facts)


def test_a_node_outside_the_allocation_is_named(launcher_facts: dict[str, Any]) -> None:
    message = launcher_facts["bad_node_error"]
    assert "node 'nosuchnode' is not part of allocation" in message, show(launcher_facts)
    assert "srun: error:" in message  # what srun said, then the hint


def test_no_job_is_left_running(launcher_facts: dict[str, Any], slurm: SlurmCluster) -> None:
    def left() -> list[Any]:
        job = [launcher_facts["job"]] if launcher_facts["job"] in slurm.jobs() else []
        return job + slurm.step_daemons()

    deadline = time.monotonic() + 60  # salloc has returned; the job may still be completing
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == []


def test_magic_all_reduce_inside_salloc_and_a_killed_rank_replaced(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The test cluster has one node, so a lost node has no other node of the allocation
    to be healed onto: a killed rank is replaced, in the agent's job step, and rank 0
    keeps its variables and its process."""
    facts = inside_allocation(slurm, "magic", tmp_path / "magic.json")
    assert facts["returncode"] == 0, show(facts)
    cell = facts["cell"]
    assert cell["ok"], show(facts)
    assert "[ranks 0-1] sum 3.0 step True" in cell["stdout"], show(facts)
    assert facts["kept"]["ok"], show(facts)
    pids = {r: x[0].split()[1] for r, x in with_start(facts["kept"]["stdout"], "pid").items()}
    assert sorted(pids) == [0, 1], show(facts)
    assert not facts["killed"]["ok"] and "rank 1" in str(facts["killed"]["error"]), show(facts)
    healed = facts["healed"]
    said = " ".join((healed["stdout"] + healed["stderr"]).split())
    assert healed["ok"], show(facts)
    replaced = "rank 1 replaced by a fresh rank kernel: rank 1 died (killed by signal SIGKILL"
    assert replaced in said, show(facts)
    # each rank: the all_reduce, the generation, what it kept, its pid, in a job step
    after = {r: x[0].split()[1:] for r, x in with_start(healed["stdout"], "after").items()}
    assert sorted(after) == [0, 1], show(facts)
    assert after[0] == ["3.0", "1", "30", pids[0], "True"], show(facts)
    assert after[1][:3] == ["3.0", "1", "None"] and after[1][4] == "True", show(facts)
    assert after[1][3] != pids[1], show(facts)  # a new process
    assert any("jupyter_dist-default" in s for s in facts["steps_running"]), show(facts)
    assert facts["shutdown"]["ok"], show(facts)
    assert facts["leftovers"] == [], show(facts)
    assert facts["steps_after_stop"] == [], show(facts)


@pytest.fixture(scope="module")
def ssh_to_this_node(
    slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """An ssh config in which the Slurm node's name leads to a test sshd on this machine."""
    problems = ssh_cluster_problems()
    if problems:
        reason = "ssh test cluster unavailable: " + "; ".join(problems)
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    with ssh_cluster(1, workdir=tmp_path_factory.mktemp("ssh")) as cluster:
        text = cluster.config_path.read_text()
        config = cluster.workdir / "slurm_node_config"
        config.write_text(text.replace(f"Host {cluster.hosts[0]}\n", f"Host {slurm.node}\n"))
        yield config


def test_a_rank_on_another_node_is_reached_over_ssh(
    slurm: SlurmCluster, ssh_to_this_node: Path, tmp_path: Path
) -> None:
    env = {"JD_TEST_SSH_CONFIG": str(ssh_to_this_node)}
    facts = inside_allocation(slurm, "tunnel", tmp_path / "tunnel.json", env)
    assert facts["returncode"] == 0, show(facts)
    assert facts["local_socket"] != facts["rank_socket"], show(facts)
    assert os.path.basename(os.path.dirname(facts["local_socket"])).startswith("jd-ssh-")
    assert facts["rank_says"].split()[0] == "tunnelled", show(facts)
    assert facts["forward_dir_left"] is False, show(facts)
    assert facts["steps_after_stop"] == [], show(facts)


# --- without an allocation --------------------------------------------------------------------


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SRUN_", "SALLOC_")):
            monkeypatch.delenv(name)
    yield


def test_outside_an_allocation_the_error_says_so(outside: None) -> None:
    launcher = SlurmLauncher(HostSpec("node7"))
    with pytest.raises(AgentError, match=r"--slurm needs to run inside a Slurm allocation"):
        asyncio.run(launcher.start("s", {}))
    assert not launcher.alive()
    asyncio.run(launcher.stop())


def test_an_ended_allocation_is_named(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch, outside: None
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("SLURM_JOB_ID", "987654")
    node = AgentClient(SlurmLauncher(HostSpec(slurm.node)), 0, on_exit=lambda *_: None)

    async def start() -> None:
        try:
            await node.start("s", {}, timeout=120)
        finally:
            await node.stop()

    with pytest.raises(AgentError, match=r"allocation 987654 has ended or is not yours"):
        asyncio.run(start())


def test_slurm_is_a_registered_launcher() -> None:
    assert launcher_class("slurm") is SlurmLauncher


def test_detect_slurm_outside_an_allocation(outside: None) -> None:
    assert detect_slurm(os.environ) is None


def test_step_shape_of_the_job_is_not_passed_to_srun() -> None:
    env = srun_environment(
        {"PATH": "/bin", "SLURM_GPUS_PER_TASK": "1", "SLURM_JOB_ID": "7"}, {"X": "1"}
    )
    assert env == {"PATH": "/bin", "SLURM_JOB_ID": "7", "X": "1"}


def test_scontrol_expands_host_ranges(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    names = expand_nodelist("gpu[01-03,07],cpu-a,b[9-10]")
    assert names == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu-a", "b9", "b10"]
    found = detect_slurm({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": "4"})
    assert found is not None
    assert found.hosts == (HostSpec("n1"), HostSpec("n2"))
    assert found.gpus_per_node == 4
