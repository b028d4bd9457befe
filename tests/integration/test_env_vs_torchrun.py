"""Each rank's environment matches what a real torchrun gives the same topology."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NAMES = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
]  # fmt: skip
# values that differ by run, not by topology
PER_RUN = {"MASTER_PORT", "TORCHELASTIC_RUN_ID"}


def torchrun_env(tmp_path: Path, nproc: int) -> list[dict[str, Any]]:
    script = tmp_path / "dump.py"
    script.write_text(
        "import json, os, sys\n"
        f"names = {NAMES!r}\n"
        "out = {n: os.environ.get(n) for n in names}\n"
        "out['NODE_RANK'] = os.environ.get('NODE_RANK')\n"
        "open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
         str(script), str(tmp_path / "env")],
        check=True, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    return [json.loads((tmp_path / f"env{r}").read_text()) for r in range(nproc)]


@pytest.mark.slow
def test_env_matches_torchrun(shell: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = torchrun_env(tmp_path, 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = shell.run_cell(
        "%%distributed --session envcheck --procs 2\nimport os\nenv = dict(os.environ)"
    )
    assert result.success
    try:
        ours = shell.run_line_magic("dist", "pull env --session envcheck")
    finally:
        shell.run_line_magic("dist", "shutdown --session envcheck")
    for rank, (theirs, mine) in enumerate(zip(expected, ours, strict=True)):
        for name in NAMES:
            assert name in mine, f"rank {rank}: {name} missing"
            if name in PER_RUN:
                assert mine[name], name
            else:
                assert mine[name] == theirs[name], (rank, name, mine[name], theirs[name])
        # torchrun leaves NODE_RANK unset on one node; we add it (= GROUP_RANK)
        assert mine["NODE_RANK"] == mine["GROUP_RANK"]
    assert ours[0]["MASTER_PORT"] == ours[1]["MASTER_PORT"]
    assert ours[0]["TORCHELASTIC_RUN_ID"] == ours[1]["TORCHELASTIC_RUN_ID"]
