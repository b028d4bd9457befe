"""accelerate's cached state around a process group made again (`rank.framework_state`),
with stand-ins for accelerate's singletons: kept while it describes this rank, cleared
whole when it does not, and a clear line when accelerate has no way to reset it."""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar

import pytest

from jupyter_dist.rank import framework_state


def fake_accelerate(monkeypatch: pytest.MonkeyPatch, partial: dict[str, Any]) -> Any:
    state = types.ModuleType("accelerate.state")

    class Holder:
        _shared_state: ClassVar[dict[str, Any]] = {}

        @classmethod
        def _reset_state(cls, *_: Any) -> None:
            cls._shared_state.clear()

    class PartialState(Holder):
        _shared_state: ClassVar[dict[str, Any]] = dict(partial)

    class AcceleratorState(Holder):
        _shared_state: ClassVar[dict[str, Any]] = {**partial, "_mixed_precision": "no"}

        def __init__(self, mixed_precision: str = "no") -> None:
            if self._shared_state and self._shared_state["_mixed_precision"] != mixed_precision:
                raise ValueError("AcceleratorState has already been initialized and cannot")
            type(self)._shared_state.update(partial, _mixed_precision=mixed_precision)

    class GradientState(Holder):
        _shared_state: ClassVar[dict[str, Any]] = {"sync_gradients": True}

    for cls in (PartialState, AcceleratorState, GradientState):
        setattr(state, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, "accelerate.state", state)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(framework_state, "_fresh_pending", False)
    return state


def test_nothing_imported_nothing_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "accelerate.state", raising=False)
    assert framework_state.reset() == []


def test_kept_while_it_describes_the_rank_and_afresh_for_other_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = fake_accelerate(monkeypatch, {"num_processes": 2, "process_index": 1})
    assert framework_state.reset() == []
    assert state.PartialState._shared_state and state.GradientState._shared_state  # kept
    state.AcceleratorState()  # the same arguments: the state there serves
    assert "set aside" not in capsys.readouterr().err
    made = state.AcceleratorState(mixed_precision="bf16")  # a fresh launch would take it
    assert made._shared_state["_mixed_precision"] == "bf16"
    assert "set aside for this one's arguments" in capsys.readouterr().err
    with pytest.raises(ValueError, match="already been initialized"):
        state.AcceleratorState(mixed_precision="fp16")  # within one run, as accelerate says


def test_cleared_whole_when_it_describes_another_world(monkeypatch: pytest.MonkeyPatch) -> None:
    state = fake_accelerate(monkeypatch, {"num_processes": 4, "process_index": 1})
    assert framework_state.reset() == []
    for name in ("PartialState", "AcceleratorState", "GradientState"):
        assert getattr(state, name)._shared_state == {}, name


def test_an_accelerate_without_reset_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    state = fake_accelerate(monkeypatch, {"num_processes": 2, "process_index": 1})
    monkeypatch.setattr(state.GradientState, "_reset_state", None)
    (said,) = framework_state.reset()
    assert "no _reset_state" in said and "%dist restart" in said
