"""Parsing and validation of what the magic is asked for."""

from __future__ import annotations

import pytest

from jupyter_dist.common.hosts import parse_hosts
from jupyter_dist.common.spec import (
    SessionSpec,
    ShapeRequest,
    check_same_shape,
    check_session_name,
    parse_framework,
    parse_names,
    parse_ranks,
    resolve_shape,
)
from jupyter_dist.errors import NoGPUError, ShapeMismatchError, SpecError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0,)), ("0,2-3", (0, 2, 3)), ("3,1,1", (1, 3)), (" 0 , 1-2 ", (0, 1, 2))],
)
def test_parse_ranks(text: str, expected: tuple[int, ...]) -> None:
    assert parse_ranks(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("a", "'a' is not a rank"), ("3-1", "runs backwards"), ("0,,1", "'' is not a rank")],
)
def test_parse_ranks_rejects_bad_text(text: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_ranks(text)


def test_parse_ranks_checks_world_size() -> None:
    with pytest.raises(SpecError, match=r"rank 5 does not exist; the session has ranks 0-3"):
        parse_ranks("0,5", world_size=4)


def test_parse_names() -> None:
    assert parse_names("a,b c") == ["a", "b", "c"]
    with pytest.raises(SpecError, match="'1x' is not a Python variable name"):
        parse_names("a,1x")


def test_session_names() -> None:
    assert check_session_name("exp-1.b") == "exp-1.b"
    with pytest.raises(SpecError, match="--session 'a b'"):
        check_session_name("a b")


def test_resolve_defaults_to_cpu_ranks_without_gpus() -> None:
    spec = resolve_shape("s", ShapeRequest(), local_gpus=0, host="h")
    assert (spec.device, spec.backend, spec.world_size) == ("cpu", "gloo", 2)


def test_resolve_defaults_to_every_gpu() -> None:
    spec = resolve_shape("s", ShapeRequest(), local_gpus=4, host="h")
    assert (spec.device, spec.backend, spec.procs_per_node) == ("cuda", "nccl", 4)


def test_gpus_without_devices_points_to_procs() -> None:
    with pytest.raises(NoGPUError) as info:
        resolve_shape("s", ShapeRequest(gpus=4), local_gpus=0, host="node-a")
    message = str(info.value)
    assert "--gpus 4" in message
    assert "'node-a' has 0 CUDA devices" in message
    assert "--procs 4" in message


def test_gpus_more_than_present() -> None:
    with pytest.raises(NoGPUError, match="has 2 CUDA devices"):
        resolve_shape("s", ShapeRequest(gpus=4), local_gpus=2, host="h")


@pytest.mark.parametrize(
    ("req", "fragment"),
    [
        (ShapeRequest(procs=0), "--procs 0: expected a whole number of at least 1"),
        (ShapeRequest(gpus=1, procs=2), "give one"),
        (ShapeRequest(backend="mpi"), "--backend 'mpi': expected one of gloo, nccl"),
        (ShapeRequest(procs=2, backend="nccl"), "NCCL needs GPUs"),
        (ShapeRequest(nodes=2), "--nodes 2"),
    ],
)
def test_bad_requests(req: ShapeRequest, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        resolve_shape("s", req, local_gpus=0, host="h")


def test_same_shape_accepts_empty_and_matching_requests() -> None:
    running = SessionSpec("s", 1, 2, "cpu", "gloo")
    check_same_shape(running, ShapeRequest())
    check_same_shape(running, ShapeRequest(procs=2, backend="gloo"))


def test_other_shape_says_how_to_change() -> None:
    running = SessionSpec("s", 1, 2, "cpu", "gloo")
    with pytest.raises(ShapeMismatchError) as info:
        check_same_shape(running, ShapeRequest(procs=4))
    message = str(info.value)
    assert "running 2 CPU ranks (gloo)" in message
    assert "--procs 4" in message
    assert "%dist shutdown --session s" in message


def test_describe_and_flags() -> None:
    spec = SessionSpec("s", 1, 4, "cuda", "nccl")
    assert spec.describe() == "4 GPUs (nccl)"
    assert spec.flags() == "--gpus 4 --backend nccl"


# -- --framework ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"), [("torch", "torch"), ("jax", "jax"), (" JAX ", "jax"), ("none", "none")]
)
def test_parse_framework(text: str, expected: str) -> None:
    assert parse_framework(text) == expected


@pytest.mark.parametrize("text", ["tensorflow", "", "torch,jax", "x" * 500])
def test_a_bad_framework_names_the_value_and_the_choices(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_framework(text)
    message = str(info.value)
    assert f"--framework {text[:37]!r}"[:-1] in message  # the value, cut when long
    assert "expected one of torch, jax, none" in message
    assert len(message) < 300


def test_the_framework_decides_what_is_initialised() -> None:
    default = resolve_shape("s", ShapeRequest(procs=2), local_gpus=0, host="h")
    assert (default.framework, default.init_process_group) == ("torch", True)
    jax = resolve_shape("s", ShapeRequest(procs=2, framework="jax"), local_gpus=0, host="h")
    assert (jax.framework, jax.init_process_group) == ("jax", False)
    assert jax.describe() == "2 CPU ranks (jax)"
    assert jax.flags() == "--procs 2 --backend gloo --framework jax"
    bare = resolve_shape("s", ShapeRequest(gpus=1, framework="none"), local_gpus=1, host="h")
    assert (bare.framework, bare.init_process_group) == ("none", False)
    assert bare.describe() == "1 GPU (no process group)"
    no_init = resolve_shape("s", ShapeRequest(init=False), local_gpus=0, host="h")
    assert (no_init.framework, no_init.init_process_group) == ("torch", False)
    remote = resolve_shape(
        "s", ShapeRequest(procs=1, framework="jax", hosts=parse_hosts("a,b")), 0, "h"
    )
    assert remote.framework == "jax" and not remote.init_process_group
    assert SessionSpec.from_json(remote.to_json()) == remote


def test_a_bad_framework_in_a_request_is_refused() -> None:
    with pytest.raises(SpecError, match=r"--framework 'tf': expected one of torch, jax, none"):
        resolve_shape("s", ShapeRequest(framework="tf"), local_gpus=0, host="h")


def test_an_older_peers_spec_is_a_torch_session() -> None:
    data = dict(SessionSpec("s").to_json())
    del data["framework"]
    assert SessionSpec.from_json(data).framework == "torch"


def test_another_framework_is_another_shape() -> None:
    running = SessionSpec("s", 1, 2, "cpu", "gloo")
    check_same_shape(running, ShapeRequest(framework="torch"))
    with pytest.raises(ShapeMismatchError, match="this cell asks for --framework jax"):
        check_same_shape(running, ShapeRequest(framework="jax"))
    jax = SessionSpec("s", 1, 2, "cpu", "gloo", False, framework="jax")
    check_same_shape(jax, ShapeRequest(framework="JAX"))
