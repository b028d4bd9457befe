"""The ``--ray`` options: address resolution, strategy and runtime environment checks."""

from __future__ import annotations

import pytest

from jupyter_dist.common.ray_options import (
    DEFAULT_RAY_STRATEGY,
    address_origin,
    check_strategy,
    parse_runtime_env,
    resolve_ray_address,
)
from jupyter_dist.errors import SpecError


def test_address_flag_then_env_then_auto() -> None:
    env = {"RAY_ADDRESS": "10.0.0.1:6379"}
    assert resolve_ray_address("head:6380", env) == "head:6380"
    assert resolve_ray_address(None, env) == "10.0.0.1:6379"
    assert resolve_ray_address(None, {}) == "auto"
    assert resolve_ray_address(None, {"RAY_ADDRESS": "  "}) == "auto"
    # and where it came from, for the messages that name it
    assert address_origin("head:6380", env) == "--ray-address"
    assert address_origin(None, env) == "RAY_ADDRESS"
    assert address_origin(None, {}) == "auto"
    assert address_origin("auto", env) == "auto"  # auto asked for: found on this machine


@pytest.mark.parametrize("bad", ["head", "head:", ":6379", "head:0", "head:70000", "head:x"])
def test_bad_address_names_value(bad: str) -> None:
    with pytest.raises(SpecError, match=r"--ray-address.*HOST:PORT"):
        resolve_ray_address(bad, {})


def test_bad_env_address_names_variable() -> None:
    with pytest.raises(SpecError, match="RAY_ADDRESS 'nope'"):
        resolve_ray_address(None, {"RAY_ADDRESS": "nope"})


def test_ray_client_address_refused() -> None:
    with pytest.raises(SpecError, match="ray://"):
        resolve_ray_address("ray://head:10001", {})


def test_strategy() -> None:
    assert DEFAULT_RAY_STRATEGY == "STRICT_SPREAD"
    assert check_strategy("pack") == "PACK"
    with pytest.raises(SpecError, match="'ROUND': expected one of STRICT_SPREAD, PACK, SPREAD"):
        check_strategy("ROUND")


def test_runtime_env() -> None:
    assert parse_runtime_env('{"pip": ["x"]}') == {"pip": ["x"]}
    with pytest.raises(SpecError, match="not JSON"):
        parse_runtime_env("{pip")
    with pytest.raises(SpecError, match="a JSON list; expected a JSON object"):
        parse_runtime_env("[1]")
