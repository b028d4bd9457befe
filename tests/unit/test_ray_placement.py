"""What a Ray session asks the cluster for, and what it says when the cluster cannot hold
it: bundles, feasibility, the texts; the ``--ray`` shapes and their errors."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from jupyter_dist.common.ray_options import RaySpec
from jupyter_dist.common.spec import SessionSpec, ShapeRequest, check_same_shape, resolve_shape
from jupyter_dist.control.launchers import placement_for, ray_driver_changes
from jupyter_dist.control.launchers.ray import RayPlacement, bundles
from jupyter_dist.control.launchers.ray_cluster import (
    ask_text,
    cluster_text,
    group_name,
    infeasible,
)
from jupyter_dist.control.launchers.ray_driver_changes import Driver
from jupyter_dist.control.launchers.ray_driver_nodes import PlacementError, explain
from jupyter_dist.errors import ShapeMismatchError, SpecError


def node(ip: str, cpus: float, gpus: float = 0, alive: bool = True) -> dict[str, object]:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return {"NodeManagerAddress": ip, "Alive": alive, "Resources": resources, "NodeID": ip}


CLUSTER = [node("10.0.0.1", 4), node("10.0.0.2", 4, 4), node("10.0.0.3", 4, 4)]


def ray_spec(flags: ShapeRequest) -> SessionSpec:
    return resolve_shape("r", flags, 0, "here")


def test_a_bundle_per_node_holds_its_gpus_and_the_cpus_asked() -> None:
    spec = ray_spec(ShapeRequest(launcher="ray", nodes=2, gpus=4, ray=RaySpec(cpus=2)))
    assert spec.remote and spec.device == "cuda" and spec.world_size == 8
    assert bundles(spec) == [{"CPU": 2.0, "GPU": 4.0}] * 2
    uneven = ray_spec(ShapeRequest(launcher="ray", nodes=2, gpus=(4, 2), ray=RaySpec()))
    assert bundles(uneven) == [{"CPU": 1.0, "GPU": 4.0}, {"CPU": 1.0, "GPU": 2.0}]
    cpu = ray_spec(ShapeRequest(launcher="ray", nodes=3, procs=2, ray=RaySpec()))
    assert bundles(cpu) == [{"CPU": 1.0}] * 3
    held = ray_spec(ShapeRequest(launcher="ray", nodes=2, procs=2, ray=RaySpec(gpus=1)))
    assert bundles(held) == [{"CPU": 1.0, "GPU": 1.0}] * 2


def test_strict_spread_needs_a_machine_per_bundle() -> None:
    two = [{"CPU": 1.0, "GPU": 4.0}] * 2
    assert infeasible(two, "STRICT_SPREAD", CLUSTER) is None
    three = [{"CPU": 1.0, "GPU": 4.0}] * 3
    why = infeasible(three, "STRICT_SPREAD", CLUSTER)
    assert why == "3 bundles need 3 machines, and 2 can hold one"
    # PACK may put bundles together, as long as each fits a node and the sum the cluster
    assert infeasible([{"GPU": 2.0}] * 4, "PACK", CLUSTER) is None
    assert (
        infeasible([{"GPU": 4.0}] * 3, "PACK", CLUSTER) == "12 GPU asked in all, 8 in the cluster"
    )
    assert infeasible([{"GPU": 8.0}], "PACK", CLUSTER) == "no node can hold bundle 0 (8 GPUs)"
    # a dead node holds nothing
    dead = [*CLUSTER[:2], node("10.0.0.3", 4, 4, alive=False)]
    assert infeasible(two, "STRICT_SPREAD", dead) == "2 bundles need 2 machines, and 1 can hold one"


def test_what_was_asked_and_what_the_cluster_has_read_as_text() -> None:
    assert (
        ask_text([{"CPU": 1.0, "GPU": 4.0}] * 2, "STRICT_SPREAD")
        == "2 bundles of 4 GPUs, 1 CPU (STRICT_SPREAD: one machine each)"
    )
    assert ask_text([{"CPU": 2.0}, {"CPU": 1.0}], "SPREAD") == "bundles of 2 CPUs; 1 CPU (SPREAD)"
    assert cluster_text(CLUSTER) == (
        "the cluster has 3 nodes: 10.0.0.1 (4 CPUs); 10.0.0.2 (4 GPUs, 4 CPUs); "
        "10.0.0.3 (4 GPUs, 4 CPUs)"
    )


def test_a_cluster_without_jupyter_dist_is_told_how_to_get_it() -> None:
    text = explain(ModuleNotFoundError("No module named 'jupyter_dist'"))
    assert "install jupyter_dist==" in text and "--ray-runtime-env" in text
    assert explain(RuntimeError("a\n\nb")) == "a\nb"


def test_names_are_under_the_owner() -> None:
    assert group_name("me@box/12", "s") == "jupyter_dist/me@box/12/s"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (ShapeRequest(launcher="ray", nodes=2), "--ray: say how many ranks each node runs"),
        (
            ShapeRequest(launcher="ray", nodes=3, gpus=(4, 2)),
            "--gpus 4,2: 2 counts for --nodes 3",
        ),
        (
            ShapeRequest(launcher="ray", procs=1, hosts=(), ray=RaySpec(), nodes=1, python=None),
            None,
        ),
        (ShapeRequest(procs=1, ray=RaySpec()), "ray options without --ray"),
        (ShapeRequest(launcher="rya", procs=1), "launcher 'rya': expected one of"),
    ],
)
def test_ray_shapes_are_checked(request_: ShapeRequest, message: str | None) -> None:
    if message is None:
        assert ray_spec(request_).launcher == "ray"
        return
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        ray_spec(request_)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cpus": 0}, "--ray-cpus 0: expected 1 to 4096"),
        ({"gpus": -1}, "--ray-gpus -1: expected 0 to 4096"),
        ({"strategy": "spread_out"}, "--ray-strategy 'spread_out': expected one of"),
        ({"runtime_env": "[1]"}, "--ray-runtime-env '\\[1\\]': a JSON list"),
        ({"address": "ray://head:10001"}, "Ray Client addresses"),
        ({"timeout": 0}, "--ray-timeout 0: expected seconds"),
    ],
)
def test_bad_ray_options_name_the_value(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        RaySpec(**fields)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="unknown field 'cpu'"):
        RaySpec.from_json({"cpu": 1})


def test_a_running_ray_session_refuses_other_ray_options_and_other_launchers() -> None:
    running = ray_spec(ShapeRequest(launcher="ray", nodes=2, procs=1, ray=RaySpec()))
    assert SessionSpec.from_json(running.to_json()) == running
    check_same_shape(running, ShapeRequest(launcher="ray", procs=1, ray=RaySpec()))
    with pytest.raises(ShapeMismatchError, match="other --ray"):
        check_same_shape(running, ShapeRequest(launcher="ray", ray=RaySpec(cpus=2), procs=1))
    local = resolve_shape("r", ShapeRequest(procs=1), 0, "here")
    with pytest.raises(ShapeMismatchError, match="--ray"):
        check_same_shape(local, ShapeRequest(launcher="ray", procs=1, ray=RaySpec()))


def test_only_ray_sessions_get_a_placement_and_it_reads_ray_address() -> None:
    local = resolve_shape("r", ShapeRequest(procs=1), 0, "here")
    assert placement_for(local, {}) is None
    spec = ray_spec(ShapeRequest(launcher="ray", nodes=2, procs=1, ray=RaySpec()))
    placement = placement_for(spec, {"RAY_ADDRESS": "head:6379"})
    assert isinstance(placement, RayPlacement) and placement.address == "head:6379"
    flagged = ray_spec(ShapeRequest(launcher="ray", procs=1, ray=RaySpec(address="h2:7000")))
    assert RayPlacement(flagged, {"RAY_ADDRESS": "head:6379"}).address == "h2:7000"


def lost_bundle_driver(
    monkeypatch: pytest.MonkeyPatch, homes: Iterator[str], nodes: list[dict[str, object]]
) -> Driver:
    """A driver whose node 1 (once on 10.0.0.3) was lost, its bundle held on ``homes`` in
    turn (``""``: on none yet), on a cluster of ``nodes``; Ray itself not asked."""
    driver = Driver(
        {"owner": "me@box/1", "session": "s", "bundles": [{"CPU": 1.0, "GPU": 1.0}] * 2,
         "strategy": "STRICT_SPREAD", "timeout": 5}
    )  # fmt: skip
    driver.placed = [{"node_id": "10.0.0.2"}, {"node_id": "10.0.0.3"}]
    monkeypatch.setattr(driver, "bundle_home", lambda _i: (next(homes), "RESCHEDULING"))
    monkeypatch.setattr(ray_driver_changes, "cluster_nodes", lambda: nodes)
    monkeypatch.setattr(ray_driver_changes, "free_nodes", lambda _b, _n: 0)
    monkeypatch.setattr(ray_driver_changes, "REPLACE_POLL_S", 0.0)
    monkeypatch.setattr(ray_driver_changes, "PROGRESS_EVERY_S", 0.0)
    return driver


def test_a_lost_nodes_bundle_is_awaited_until_ray_holds_it_on_a_live_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = [*CLUSTER[:2], node("10.0.0.3", 4, 4, alive=False), node("10.0.0.4", 4, 4)]
    homes = iter(["", "10.0.0.3", "10.0.0.4"])  # not yet; its dead node; a new one
    driver = lost_bundle_driver(monkeypatch, homes, dead)
    driver._await_bundle(1, deadline=float("inf"), timeout=5)
    said = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert said[0].startswith(
        "node 1: waiting for Ray to place bundle 1 (1 GPU, 1 CPU, STRICT_SPREAD: apart from "
        "the other nodes' bundles) again (its Ray node is gone): 0 node(s) have room now; "
        "the cluster has 3 nodes: 10.0.0.1 (4 CPUs); "
    ), said
    assert said[-1] == (
        "node 1: Ray placed bundle 1 (1 GPU, 1 CPU, STRICT_SPREAD: apart from the other "
        "nodes' bundles) again"
    )


def test_a_lost_nodes_bundle_not_held_in_time_names_the_ask_and_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = [*CLUSTER[:2], node("10.0.0.3", 4, 4, alive=False)]
    driver = lost_bundle_driver(monkeypatch, iter(lambda: "", None), dead)
    with pytest.raises(PlacementError) as failed:
        driver._await_bundle(1, deadline=0.0, timeout=7)
    assert str(failed.value) == (
        "node 1: waited 7 s for Ray to place bundle 1 (1 GPU, 1 CPU, STRICT_SPREAD: apart "
        "from the other nodes' bundles) again (the placement group is RESCHEDULING): 0 "
        "node(s) have room now; the cluster has 2 nodes: 10.0.0.1 (4 CPUs); 10.0.0.2 (4 "
        "GPUs, 4 CPUs)"
    )


def test_a_grow_that_cannot_be_placed_apart_from_the_sessions_machines_names_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under STRICT_SPREAD a grow's nodes go to machines the session holds no bundle on:
    with one such machine, two more nodes cannot be placed, and the driver says so before
    asking Ray, holding nothing more."""
    import ray.util

    driver = Driver(
        {"owner": "me@box/1", "session": "s", "bundles": [{"CPU": 1.0}] * 2,
         "strategy": "STRICT_SPREAD", "timeout": 5}
    )  # fmt: skip
    driver.group = object()
    held = {"bundles_to_node_id": {0: "10.0.0.2", 1: "10.0.0.3"}}
    monkeypatch.setattr(ray.util, "placement_group_table", lambda _group: held)
    monkeypatch.setattr(ray_driver_changes, "cluster_nodes", lambda: CLUSTER)
    with pytest.raises(PlacementError) as failed:
        driver._place_more([{"CPU": 1.0}] * 2, 2, timeout=5)
    assert str(failed.value) == (
        "cannot place 2 bundles of 1 CPU (STRICT_SPREAD: one machine each) apart from the 2 "
        "machine(s) the session holds: 2 bundles need 2 machines, and 1 can hold one; the "
        "cluster has 3 nodes: 10.0.0.1 (4 CPUs); 10.0.0.2 (4 GPUs, 4 CPUs); 10.0.0.3 (4 GPUs, "
        "4 CPUs)"
    )
    assert driver.grows == 0 and driver.grown == []
