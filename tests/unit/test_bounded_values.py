"""Numbers with thousands of digits, typed in a cell or sent in a REST body, are refused
naming the value short (its first and last digits and how many) and the range expected;
a refusal that repeats a long value repeats its beginning."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_dist.common.bounded import check_whole, cut, parse_seconds, parse_whole, shown
from jupyter_dist.common.hosts import MAX_NODES, read_hostfile
from jupyter_dist.common.launcher_options import check_launcher_options, given_options
from jupyter_dist.common.spec import validate_request
from jupyter_dist.errors import SpecError
from jupyter_dist.notebook.magics import DistMagics
from jupyter_dist.server.handlers import shape_from_json

HUGE = int("9" * 4000)
SHORT = "'99999999...9999' (4000 digits)"


def refusal(call: object, *args: object) -> str:
    with pytest.raises(SpecError) as caught:
        call(*args)  # type: ignore[operator]
    message = str(caught.value)
    assert len(message) < 300, message
    return message


def test_a_value_is_named_short() -> None:
    assert shown(HUGE) == SHORT
    assert shown(-HUGE) == "'-99999999...9999' (4000 digits)"
    assert shown(10**5000).startswith("a number of about 5001 digits")  # past str()'s limit
    assert shown("9" * 4000) == SHORT
    assert shown("x" * 500) == f"{'x' * 30!r}... (500 characters)"
    assert (shown(12), shown("12"), shown(True), shown(1.5)) == ("12", "'12'", "True", "1.5")
    assert cut("y" * 500) == f"{'y' * 30}... (500 characters)" and cut("4") == "4"


def test_bounded_numbers_are_refused_with_the_range() -> None:
    assert refusal(check_whole, "--x", HUGE, 1, 8) == f"--x {SHORT}: expected 1 to 8"
    assert refusal(check_whole, "--x", "3", 1, 8) == "--x '3': expected a whole number, 1 to 8"
    assert refusal(parse_whole, "--x", "9" * 5000, 1, 8) == (
        "--x '99999999...9999' (5000 digits): expected 1 to 8"
    )
    assert refusal(parse_whole, "--x", "0" * 5000 + "9", 1, 8) == (
        "--x 9: expected 1 to 8"  # leading zeros are no digits of the value
    )
    assert parse_whole("--x", " 007 ", 1, 8) == 7
    assert refusal(parse_seconds, "--t", "1e999", 60) == (
        "--t '1e999': expected seconds, more than 0, at most 60"
    )
    assert refusal(parse_seconds, "--t", "nan", 60).startswith("--t 'nan': expected seconds")
    assert parse_seconds("--t", "2.5", 60) == 2.5


def test_a_cells_counts_with_thousands_of_digits_are_refused_with_their_range() -> None:
    magics = DistMagics(None)
    with pytest.raises(UsageError) as caught:
        magics._cell_args("--nodes " + "9" * 5000)
    assert str(caught.value) == (
        "argument --nodes: '99999999...9999' (5000 digits): expected a number of nodes, "
        f"1 to {MAX_NODES}"
    )
    assert magics._cell_args("--nodes 3").nodes == 3
    given = given_options(vars(magics._cell_args("--cpus " + "9" * 5000)))
    with pytest.raises(SpecError) as refused:
        check_launcher_options([("ray", "--ray")], given)
    assert str(refused.value).startswith(
        f"--cpus {'9' * 30}... (5000 characters): --cpus is a Kubernetes option"
    )
    assert len(str(refused.value)) < 400


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"nodes": HUGE}, f"--nodes {SHORT}: a session takes at most {MAX_NODES} nodes"),
        ({"procs": HUGE}, f"--procs {SHORT}: a session has at most 65536 ranks in all"),
        ({"procs": -HUGE}, "--procs '-99999999...9999' (4000 digits): expected a whole number"),
    ],
)
def test_a_bodys_counts_with_thousands_of_digits_are_named_short(
    body: dict[str, object], message: str
) -> None:
    assert refusal(validate_request, shape_from_json(body).shape).startswith(message)


def test_a_hosts_slots_are_bounded() -> None:
    body = {"hosts": [{"name": "a", "slots": HUGE}]}
    assert refusal(shape_from_json, body) == (
        f"hosts[0]: slots {SHORT} of 'a': expected a whole number of at least 1 and at most 65536"
    )


def test_a_hostfile_path_with_a_nul_is_refused_naming_it() -> None:
    assert refusal(read_hostfile, "hosts\0.txt") == (
        "--hostfile 'hosts\\x00.txt': a file's path holds no NUL character"
    )


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--k8s-deadline", "expected 60 to 2592000"),
        ("--k8s-timeout", "expected seconds, more than 0, at most 86400"),
        ("--k8s-grace", "expected seconds, more than 0, at most 3600"),
    ],
)
def test_a_cells_kubernetes_seconds_with_thousands_of_digits_are_named_short(
    flag: str, expected: str
) -> None:
    """Read as text and checked before converting: argparse's own int() repeated all of
    them ('invalid int value') or gave up past Python's limit on digits."""
    from jupyter_dist.notebook.magics import _k8s_spec

    magics = DistMagics(None)
    with pytest.raises(SpecError) as refused:
        _k8s_spec(magics._cell_args(f"--k8s {flag} " + "9" * 5000))
    assert str(refused.value) == f"{flag} '99999999...9999' (5000 digits): {expected}"
    spec = _k8s_spec(magics._cell_args(f"--k8s {flag} 120"))
    assert spec is not None
    assert {"--k8s-deadline": spec.deadline, "--k8s-timeout": spec.timeout}.get(
        flag, spec.grace
    ) == 120
