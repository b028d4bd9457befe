"""The agent's temporary environment for its imports (`node.agent._environment`)."""

from __future__ import annotations

import os

import pytest

from jupyter_dist.node.agent import _environment


def test_values_hold_for_the_block_then_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JD_TEST_QUIET", raising=False)
    with _environment({"JD_TEST_QUIET": "1"}):
        assert os.environ["JD_TEST_QUIET"] == "1"
    assert "JD_TEST_QUIET" not in os.environ


def test_a_variable_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JD_TEST_QUIET", "0")
    with _environment({"JD_TEST_QUIET": "1"}):
        assert os.environ["JD_TEST_QUIET"] == "0"
    assert os.environ["JD_TEST_QUIET"] == "0"


def test_the_environment_is_restored_when_the_block_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("JD_TEST_QUIET", raising=False)
    with pytest.raises(RuntimeError), _environment({"JD_TEST_QUIET": "1"}):
        raise RuntimeError("an import failed")
    assert "JD_TEST_QUIET" not in os.environ
