"""The ``--ray`` options: address resolution, strategy and runtime environment checks; no
address a program could take for an option or that holds a NUL, no quantity past its bound
(named short, with the range)."""

from __future__ import annotations

import pytest

from jupyter_dist.common.ray_options import (
    DEFAULT_RAY_STRATEGY,
    MAX_BUNDLE_UNITS,
    RAY_ADDRESS_ENV,
    RaySpec,
    address_origin,
    check_strategy,
    parse_resources,
    parse_runtime_env,
    resolve_ray_address,
)
from jupyter_dist.errors import SpecError
from jupyter_dist.notebook.magics import DistMagics, _ray_spec


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


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("-oProxyCommand=x:6379", "starts with '-', which a program would read as one of its"),
        ("head\0:6379", "it holds a NUL character"),
        ("he ad:6379", "it holds the character ' '"),
        ("head:63\n79", "it holds the character '\\n'"),
        ("a/b:6379", "'a/b' is not a host name or address"),
        ("-head:6379", "starts with '-'"),
        ("head:\u0661\u0662", "expected HOST:PORT with a port 1-65535"),  # Arabic-Indic digits
        ("head:" + "1" * 5000, "(5005 characters): expected HOST:PORT"),
        ("h" * 5000 + ":6379", "of at most 300 characters"),
        ("::1:6379", "'::1' is not a host name or address"),
    ],
)
def test_an_address_that_is_not_a_host_and_port_is_refused_naming_it(
    bad: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as caught:
        RaySpec(address=bad)
    message = str(caught.value)
    assert message.startswith("--ray-address ") and fragment in message, message
    assert len(message) < 400, message
    with pytest.raises(SpecError, match=f"^{RAY_ADDRESS_ENV} "):
        resolve_ray_address(None, {RAY_ADDRESS_ENV: bad})


def test_addresses_of_every_kind_of_host_pass() -> None:
    for good in ("head:6379", "10.0.0.1:6379", "[::1]:6379", "head-1.example.org:6380", "auto"):
        assert RaySpec(address=good).address == good
        assert resolve_ray_address(None, {RAY_ADDRESS_ENV: f" {good} "}) == good


def test_quantities_are_bounded_and_a_huge_one_is_named_short_with_the_range() -> None:
    huge = int("9" * 4000)
    for field, flag, low in (("cpus", "--ray-cpus", 1), ("gpus", "--ray-gpus", 0)):
        with pytest.raises(SpecError) as caught:
            RaySpec(**{field: huge})
        assert str(caught.value) == (
            f"{flag} '99999999...9999' (4000 digits): expected {low} to {MAX_BUNDLE_UNITS}"
        )
    with pytest.raises(SpecError, match=r"^--ray-timeout 1e\+300: expected seconds, more than 0"):
        RaySpec(timeout=1e300)
    # typed in a cell: the text is checked before it is converted
    magics = DistMagics(None)
    with pytest.raises(SpecError) as caught:
        _ray_spec(magics._cell_args("--ray-cpus " + "9" * 5000))
    assert str(caught.value) == (
        f"--ray-cpus '99999999...9999' (5000 digits): expected 1 to {MAX_BUNDLE_UNITS}"
    )
    with pytest.raises(SpecError, match=r"^--ray-timeout '1e999': expected seconds, more than"):
        _ray_spec(magics._cell_args("--ray-timeout 1e999"))
    with pytest.raises(SpecError, match=r"^--ray-gpus 'two': expected a whole number, 0 to 4096"):
        _ray_spec(magics._cell_args("--ray-gpus two"))
    spec = _ray_spec(magics._cell_args("--ray-cpus 4 --ray-gpus 0 --ray-timeout 90"))
    assert spec is not None and (spec.cpus, spec.gpus, spec.timeout) == (4, 0, 90.0)


def test_custom_resources_and_an_accelerator_type_as_ray_takes_them() -> None:
    assert parse_resources("TPU=4, my_res=0.5,accelerator_type=A100") == {
        "TPU": 4.0,
        "my_res": 0.5,
        "accelerator_type:A100": 0.001,  # Ray's accelerator_type="A100"
    }
    assert parse_resources('{"TPU": 1, "accelerator_type": "H100"}') == {
        "TPU": 1.0,
        "accelerator_type:H100": 0.001,
    }
    assert parse_resources("accelerator_type:A100=1") == {"accelerator_type:A100": 1.0}
    assert parse_resources("  ") == {}
    # typed in a cell: it implies --ray, and every bundle holds them
    spec = _ray_spec(DistMagics(None)._cell_args("--ray-resources TPU=2"))
    assert spec is not None and spec.resources_dict() == {"TPU": 2.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("CPU=2", "--ray-resources 'CPU=2': 'CPU' is set by --ray-cpus (each bundle's CPUs)"),
        ("gpu=1", "--ray-resources 'gpu=1': 'gpu' is set by --ray-gpus (each bundle's GPUs)"),
        ("TPU", "--ray-resources 'TPU': 'TPU' has no '='; expected NAME=AMOUNT,..."),
        ("TPU=0", "--ray-resources 'TPU=0': TPU='0': expected an amount above 0 and at most"),
        ("TPU=-1", "--ray-resources 'TPU=-1': TPU='-1': expected an amount above 0"),
        ("TPU=nan", "--ray-resources 'TPU=nan': TPU='nan': expected an amount above 0"),
        ("TPU=1e400", "--ray-resources 'TPU=1e400': TPU='1e400': expected an amount above 0"),
        ("TPU=2.5", "--ray-resources 'TPU=2.5': TPU='2.5': an amount above 1 must be whole"),
        ("x=0.00001", "--ray-resources 'x=0.00001': x='0.00001': expected a multiple of 0.0001"),
        ("a b=1", "--ray-resources 'a b=1': 'a b' is not a resource name"),
        ("-x=1", "--ray-resources '-x=1': '-x' is not a resource name"),
        ("x=1,x=2", "--ray-resources 'x=1,x=2': 'x' is given twice"),
        ("accelerator_type=", "--ray-resources 'accelerator_type=': accelerator_type='': expected"),
        ('{"x": true}', "--ray-resources '{\"x\": true}': x=True: expected an amount above 0"),
        ('{"x": 1', "--ray-resources '{\"x\": 1': not JSON (Expecting ',' delimiter"),
        (
            ",".join(f"r{i}=1" for i in range(40)),
            "--ray-resources 'r0=1,r1=1,r2=1,r3=1,r4=1,r5=1,'... (229 characters): 40 resources; "
            "expected at most 32",
        ),
        (
            "x" * 5000 + "=1",
            "--ray-resources 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (5002 characters)",
        ),
    ],
)
def test_bad_resources_name_the_value_and_what_is_expected(text: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        RaySpec(resources=text)
    assert str(caught.value).startswith(message), caught.value
