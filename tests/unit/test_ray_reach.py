"""What a session says of the Ray cluster it reaches: the address, where it came from
(``--ray-address``, ``RAY_ADDRESS``, ``auto`` and how ``auto`` found it), a cluster that
did not answer without Ray's own log lines, and the bounds the driver gives Ray."""

from __future__ import annotations

from jupyter_dist.control.launchers import ray_reach
from jupyter_dist.control.launchers.ray_reach import (
    CONNECT_BOUNDS,
    auto_found,
    bound_environment,
    connecting_text,
    failure_text,
    joined_text,
    without_ray_log,
)


def test_the_cluster_joined_is_named_with_where_its_address_came_from() -> None:
    found = {"address": "10.0.0.1:6379", "found": "a Ray cluster running on this machine"}
    assert joined_text(found, "auto", "auto") == (
        "joined the Ray cluster at 10.0.0.1:6379 (found by `auto`: a Ray cluster running on "
        "this machine; --ray-address or RAY_ADDRESS name another cluster)"
    )
    given = {"address": "10.0.0.1:6379", "found": ""}
    assert joined_text(given, "head:6379", "--ray-address") == (
        "joined the Ray cluster at 10.0.0.1:6379 (given by --ray-address)"
    )
    assert joined_text(given, "head:6379", "RAY_ADDRESS") == (
        "joined the Ray cluster at 10.0.0.1:6379 (from the RAY_ADDRESS environment variable)"
    )
    assert connecting_text("auto", "auto") == "Ray cluster: `auto` looks for one on this machine"
    assert (
        connecting_text("h:1", "--ray-address")
        == "Ray cluster h:1 (given by --ray-address): connecting"
    )


def test_a_cluster_that_did_not_answer_is_named_with_its_origin_and_what_was_expected() -> None:
    event = {"unreachable": True, "address": "127.0.0.1:9", "seconds": 6.2, "error": "Failed"}
    said = failure_text(event, "127.0.0.1:9", "--ray-address")
    assert said is not None
    assert said.startswith(
        "Ray address 127.0.0.1:9 (given by --ray-address): no Ray cluster answered there "
        "within 6 s. Expected the GCS address of a running cluster's head"
    )
    # auto: the address it found is the one named, with how it was found
    found = {**event, "address": "10.0.0.7:6379", "found": "a Ray cluster running on this machine"}
    said = failure_text(found, "auto", "auto")
    assert said is not None and said.startswith(
        "Ray address 10.0.0.7:6379 (found by `auto`: a Ray cluster running on this machine;"
    )
    nothing = failure_text({"not_found": True}, "auto", "auto")
    assert nothing is not None
    assert nothing.startswith("Ray address `auto`: no Ray cluster runs on this machine to join")
    assert failure_text({"error": "cannot place"}, "h:1", "--ray-address") is None


def test_rays_own_log_lines_are_left_out_of_what_the_driver_said() -> None:
    lines = [
        "[2026-01-01 01:02:03,456 W 31347 31347] rpc_client.h:153: Failed to connect to GCS",
        "[2026-01-01 01:02:08,457 E 31347 31347] gcs_client.cc:210: Failed to get cluster ID",
        "Traceback (most recent call last):",
        "ModuleNotFoundError: No module named 'ray'",
        "",
    ]
    assert without_ray_log(lines) == lines[2:4]


def test_the_drivers_bounds_are_rays_own_settings_and_the_users_come_first() -> None:
    environ = {"RAY_py_gcs_connect_timeout_s": "60"}
    bound_environment(environ)
    assert environ == {**CONNECT_BOUNDS, "RAY_py_gcs_connect_timeout_s": "60"}
    # what they add up to: two connection waits, the cluster's id, one try
    assert (
        float(CONNECT_BOUNDS["RAY_gcs_rpc_server_connect_timeout_s"]) * 2
        + float(CONNECT_BOUNDS["RAY_py_gcs_connect_timeout_s"])
        <= ray_reach.CONNECT_S
    )
    assert CONNECT_BOUNDS["RAY_gcs_server_port_wait_time_s"] == "1"


def test_auto_says_which_cluster_it_found_and_how_as_ray_looks() -> None:
    """Ray's order: the address file the last ``ray start`` here wrote, else a raylet
    running here; the file and the other clusters running here are named."""
    file = "/scratch/ray/ray_current_cluster"
    assert auto_found("10.0.0.1:6379", [], file) == (
        "10.0.0.1:6379",
        f"the cluster last started on this machine with `ray start`, as Ray's {file} says",
    )
    address, how = auto_found("10.0.0.1:6379", ["10.0.0.1:6379", "10.0.0.9:6380"], file)
    assert address == "10.0.0.1:6379"
    assert how.endswith(f"as Ray's {file} says; 1 other Ray cluster runs here: 10.0.0.9:6380")
    assert auto_found(None, ["10.0.0.9:6380", "10.0.0.2:6379"], file) == (
        "10.0.0.9:6380",
        "a Ray cluster running on this machine (the first of 2: 10.0.0.9:6380, 10.0.0.2:6379)",
    )
    assert auto_found(None, [], file) == (None, "")
    # what a session says once it joined: the cluster, and where its address came from
    found = {"address": "10.0.0.1:6379", "found": auto_found("10.0.0.1:6379", [], file)[1]}
    assert joined_text(found, "auto", "auto") == (
        "joined the Ray cluster at 10.0.0.1:6379 (found by `auto`: the cluster last started "
        f"on this machine with `ray start`, as Ray's {file} says; --ray-address or "
        "RAY_ADDRESS name another cluster)"
    )
    # RAY_ADDRESS=auto: the variable, and what auto found
    assert joined_text(found, "auto", "RAY_ADDRESS").startswith(
        "joined the Ray cluster at 10.0.0.1:6379 (found by `auto` (from the RAY_ADDRESS "
        "environment variable): the cluster last started on this machine"
    )
