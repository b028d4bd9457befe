"""JAX code that names its own coordinator, as JAX's docs do, in a ``--framework jax``
session: ``jax.distributed.initialize('localhost:PORT', 2, rank)`` starts the coordinator
on that port, as in a plain process, and the same cell runs again in the same ranks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_dist.common.ports import free_port

pytestmark = pytest.mark.slow

NAME = "jaxnamed"


@pytest.fixture(scope="module")
def jax_session(shell: Any) -> Iterator[str]:
    pytest.importorskip("jax")
    result = shell.run_cell(f"%%distributed --session {NAME} --procs 2 --framework jax\npass")
    assert result.success, result.error_in_exec
    yield NAME
    shell.run_line_magic("dist", f"shutdown --session {NAME}")


def test_initialize_with_its_own_coordinator_runs_twice(run: Any, jax_session: str) -> None:
    port = free_port("127.0.0.1")
    body = (
        "import os, jax\n"
        f"jax.distributed.initialize('localhost:{port}', 2, int(os.environ['RANK']))\n"
        "print('jax', jax.process_count(), jax.process_index() == int(os.environ['RANK']))\n"
    )
    for _ in range(2):  # a notebook's second run, in the same ranks
        out = run(f"%%distributed --session {jax_session} --timeout 120\n{body}")
        assert out.ok, out.stdout + out.stderr
        assert "[ranks 0-1] jax 2 True" in out.stdout, out.stdout
