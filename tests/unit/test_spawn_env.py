"""What ``torch.multiprocessing.spawn``'s children of a rank see, without processes."""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

from jupyter_dist.rank import spawn_env


@pytest.mark.parametrize("before", ["True", None])
def test_children_host_their_store_and_the_rank_keeps_its_value(
    monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    if before is None:
        monkeypatch.delenv(spawn_env.AGENT_STORE_VAR, raising=False)
    else:
        monkeypatch.setenv(spawn_env.AGENT_STORE_VAR, before)
    with spawn_env.children_host_their_store():
        assert os.environ[spawn_env.AGENT_STORE_VAR] == "False"
    assert os.environ.get(spawn_env.AGENT_STORE_VAR) == before


def test_spawn_and_start_processes_both_go_through_the_wrapper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    package: Any = importlib.import_module("torch.multiprocessing")
    module: Any = importlib.import_module("torch.multiprocessing.spawn")
    seen: list[tuple[str | None, bool]] = []

    class Context:
        def join(self) -> bool:
            return True

    def fake(fn: Any, args: Any, nprocs: int, join: bool, daemon: bool, method: str) -> Any:
        seen.append((os.environ.get(spawn_env.AGENT_STORE_VAR), join))
        return Context()

    monkeypatch.setattr(module, "start_processes", fake)
    monkeypatch.setattr(package, "start_processes", fake)
    monkeypatch.setenv(spawn_env.AGENT_STORE_VAR, "True")
    spawn_env.install()
    spawn_env.install()  # idempotent
    assert module.spawn(print, nprocs=2) is None  # joined, as torch's own
    assert isinstance(package.start_processes(print, join=False), Context)
    assert seen == [("False", False), ("False", False)]
    assert os.environ[spawn_env.AGENT_STORE_VAR] == "True"
