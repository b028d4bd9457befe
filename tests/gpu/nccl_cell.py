"""The NCCL cell the GPU tests run: an all_reduce over every rank, pulled back."""

from __future__ import annotations

from typing import Any

#: every rank: ``total`` (an all_reduce of rank+1 on the GPU) and ``backend``
ALL_REDUCE = (
    "import os, torch, torch.distributed as dist\n"
    "t = torch.ones(1024, device='cuda') * (dist.get_rank() + 1)\n"
    "dist.all_reduce(t)\n"
    "total = t[0].item()\n"
    "backend = dist.get_backend()\n"
)


def run_and_pull(shell: Any, session: str, flags: str, code: str, *names: str) -> list[Any]:
    """Run ``code`` then `ALL_REDUCE` in a new session, pull ``names``, ``total`` and
    ``backend`` from every rank, and shut the session down whatever happened."""
    result = shell.run_cell(f"%%distributed --session {session} {flags}\n{code}{ALL_REDUCE}")
    try:
        assert result.success, result.error_in_exec
        return [
            shell.run_line_magic("dist", f"pull {name} --session {session}")
            for name in (*names, "total", "backend")
        ]
    finally:
        shell.run_line_magic("dist", f"shutdown --session {session}")
