"""A lost node is healed, not fatal, across real sshd nodes: the session goes DEGRADED
(its survivors answer), and ``%dist heal`` starts the node again on its own host once it
answers, or on a spare while it does not; a live session grows to three nodes and back.
Every survivor keeps its variables, and an all_reduce over the new group is right."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.settings import NODE_DEADLINE_VAR
from tests.conftest import CellOutput, session_status

from .test_link_faults import set_link
from .test_ssh_sessions import flags

pytestmark = pytest.mark.slow
Run = Callable[[str], CellOutput]
SUM = (
    "import os, torch, torch.distributed as dist, jupyter_dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('sum', t.item(), 'generation', jupyter_dist.info().generation, "
    "'kept', globals().get('kept'))"
)


@pytest.fixture
def spare_config(cluster: Any, tmp_path: Path) -> Path:
    """The cluster's ssh config with ``spare0``: another name for node0's machine, a host
    that can take a lost node's place (as a spare machine would)."""
    text = cluster.config_path.read_text()
    block = text[text.index("Host node0\n") :]
    block = block[: block.find("\nHost ", 1) + 1] if "\nHost " in block[1:] else block
    path = tmp_path / "config"
    path.write_text(text + "\n" + block.replace("Host node0\n", "Host spare0\n", 1))
    return path


@pytest.fixture
def healing(run: Run, cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # a node silent for 10 s is lost (20 s by default): the same path, sooner; a healthy
    # node of a loaded machine may miss 6 s of heartbeats
    monkeypatch.setenv(NODE_DEADLINE_VAR, "10")
    yield "healing"
    set_link(cluster, 1, "up")
    run("%dist shutdown --session healing")


def wait_state(name: str, state: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while session_status(name)["state"] != state:
        assert time.monotonic() < deadline, session_status(name)
        time.sleep(0.1)


def test_a_cut_link_degrades_and_heals_onto_the_same_host_then_a_spare(
    run: Run, shell: Any, cluster: Any, healing: str, spare_config: Path
) -> None:
    name = healing
    start = f"%%distributed --session {name} {flags(cluster, spare_config)} --procs 1"
    assert run(f"{start}\nimport os\nkept = 40 + int(os.environ['RANK'])").ok
    set_link(cluster, 1, "down")
    wait_state(name, "degraded")
    refused = run(f"%%distributed --session {name}\nprint(1)")
    assert "is degraded: rank 1 was lost" in str(refused.error), refused.stdout
    assert shell.run_line_magic("dist", f"pull kept --session {name} --ranks 0") == [40]

    set_link(cluster, 1, "up")  # the node answers again: healed on its own host
    shell.run_line_magic("dist", f"heal --session {name}")
    back = run(f"%%distributed --session {name}\n{SUM}")
    assert "[rank 0] sum 3.0 generation 1 kept 40" in back.stdout, back.stdout
    assert "[rank 1] sum 3.0 generation 1 kept None" in back.stdout, back.stdout
    assert [n["host"] for n in session_status(name)["nodes"]] == ["node0", "node1"]

    set_link(cluster, 1, "down")  # lost again, and it stays down: a spare takes its place
    wait_state(name, "degraded")
    shell.run_line_magic("dist", f"heal --session {name} --spares spare0")
    moved = run(f"%%distributed --session {name}\n{SUM}")
    assert "[rank 0] sum 3.0 generation 2 kept 40" in moved.stdout, moved.stdout
    assert "[rank 1] sum 3.0 generation 2 kept None" in moved.stdout, moved.stdout
    assert [n["host"] for n in session_status(name)["nodes"]] == ["node0", "spare0"]


def test_resize_two_three_two_nodes(
    run: Run, shell: Any, cluster: Any, healing: str, spare_config: Path
) -> None:
    name = healing
    start = f"%%distributed --session {name} {flags(cluster, spare_config)} --procs 1"
    assert run(f"{start}\nimport os\nkept = 40 + int(os.environ['RANK'])").ok
    shell.run_line_magic("dist", f"resize --nodes 3 --spares spare0 --session {name}")
    grown = run(f"%%distributed --session {name}\n{SUM}")
    assert "[rank 0] sum 6.0 generation 1 kept 40" in grown.stdout, grown.stdout
    assert "[rank 1] sum 6.0 generation 1 kept 41" in grown.stdout, grown.stdout
    assert "[rank 2] sum 6.0 generation 1 kept None" in grown.stdout, grown.stdout
    shell.run_line_magic("dist", f"resize --nodes 2 --session {name}")
    shrunk = run(f"%%distributed --session {name}\n{SUM}")
    assert "[rank 0] sum 3.0 generation 2 kept 40" in shrunk.stdout, shrunk.stdout
    assert "[rank 1] sum 3.0 generation 2 kept 41" in shrunk.stdout, shrunk.stdout
    assert [n["host"] for n in session_status(name)["nodes"]] == ["node0", "node1"]


def test_heal_flag_starts_a_lost_node_again_before_the_next_cell(
    run: Run, cluster: Any, healing: str, spare_config: Path
) -> None:
    name = healing
    start = f"%%distributed --session {name} {flags(cluster, spare_config)} --procs 1 --heal"
    assert run(f"{start}\nimport os\nkept = 40 + int(os.environ['RANK'])").ok
    set_link(cluster, 1, "down")
    wait_state(name, "degraded")
    set_link(cluster, 1, "up")
    back = run(f"%%distributed --session {name}\n{SUM}")
    assert back.ok, back.stdout + back.stderr
    said = " ".join((back.stdout + back.stderr).split())
    assert "rank 1 replaced by a fresh rank kernel (node 1 started again): rank 1 was lost" in said
    assert "[rank 0] sum 3.0 generation 1 kept 40" in back.stdout, back.stdout
