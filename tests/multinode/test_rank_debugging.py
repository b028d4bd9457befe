"""A breakpoint on a rank of another node: its debugger's prompts reach the notebook's input
box over the SSH connection that carries the rank's other channels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.stdin_frontend import stdin_frontend

from .test_ssh_sessions import flags

pytestmark = pytest.mark.slow


def test_a_breakpoint_on_rank_1_of_the_other_node(
    cluster: Any, kernel_name: str, tmp_path: Path
) -> None:
    with stdin_frontend(kernel_name, tmp_path) as nb:
        started = nb.run(
            f"%%distributed --session dbg {flags(cluster)} --procs 1\n"
            "import os, socket\nimport torch\nimport torch.distributed as dist\n"
            "rank = int(os.environ['RANK'])"
        )
        assert started.reply["status"] == "ok", started.text
        run = nb.run(
            "%%distributed --session dbg\n"
            "here = socket.gethostname()\n"
            "if rank == 1:\n    breakpoint()\n    seen = here\nelse:\n    seen = here\n"
            "total = torch.tensor([1.0])\ndist.all_reduce(total)\nprint('sum', total.item())",
            ["p here", "n", "p seen", "c"],
        )
        assert run.reply["status"] == "ok", run.text
        assert [p.text for p in run.prompts] == ["[rank 1] ipdb> "] * 4
        assert f"[rank 1] {cluster.hosts[1]!r}" in run.text
        assert "[ranks 0-1] sum 2.0" in run.text
        assert nb.run("%dist shutdown --session dbg").reply["status"] == "ok"
