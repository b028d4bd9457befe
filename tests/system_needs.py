"""Suites that need parts of the system (sshd, Slurm, Chromium): skipped with the reason
on a machine that lacks them, but never silently in CI, where a missing need fails."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(what: str, problems: list[str]) -> None:
    """Skip (locally) or fail (in CI) when ``problems`` is not empty."""
    if problems:
        reason = f"{what} unavailable: " + "; ".join(problems)
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
