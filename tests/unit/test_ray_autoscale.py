"""Ray's autoscaler as a session's driver reads it: which status is an autoscaler's, what no
node type could ever hold, what the wait says; a request no live node holds refused only
where nothing could hold it, and its bundles holding the ``--ray-resources``."""

from __future__ import annotations

import pytest

from jupyter_dist.common.ray_options import RaySpec
from jupyter_dist.common.spec import ShapeRequest, resolve_shape
from jupyter_dist.control.launchers import ray_driver_nodes
from jupyter_dist.control.launchers.ray import bundles
from jupyter_dist.control.launchers.ray_autoscale import (
    Autoscaler,
    NodeType,
    never,
    types_text,
    v1_counts,
    waiting_text,
)
from jupyter_dist.control.launchers.ray_driver_nodes import PlacedSession, PlacementError


def node(ip: str, cpus: float, gpus: float = 0) -> dict[str, object]:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return {"NodeManagerAddress": ip, "Alive": True, "Resources": resources, "NodeID": ip}


CPU_ONLY = [node("10.0.0.1", 4), node("10.0.0.2", 4)]
GPU_TYPE = NodeType("gpu_worker", {"CPU": 4.0, "GPU": 1.0, "memory": 1e9}, max_count=2)
SCALER = Autoscaler(types=(GPU_TYPE,), running={"gpu_worker": 0}, adding={})
ONE_GPU = [{"CPU": 1.0, "GPU": 1.0}]
HEX = "0123456789abcdef" * 3 + "01234567"


def test_a_v1_status_is_an_autoscalers_unless_it_is_the_mirror_or_old() -> None:
    report = {
        "active_nodes": {"head": 1, "gpu_worker": 1},
        "pending_launches": {"gpu_worker": 1},
        "pending_nodes": [["10.0.0.9", "gpu_worker", "setting-up"]],
    }
    status = {"time": 1000.0, "autoscaler_report": report}
    assert v1_counts(status, now=1010.0) == (
        {"head": 1, "gpu_worker": 1},
        {"gpu_worker": 2},
    )
    # scaled to zero beside nodes it does not manage: still an autoscaler
    empty = {"time": 1000.0, "autoscaler_report": {"active_nodes": {}, "pending_launches": {}}}
    assert v1_counts(empty, now=1000.0) == ({}, {})
    # `ray start --head` runs a read-only mirror: a made-up node type per node
    mirror = {"time": 1000.0, "autoscaler_report": {"active_nodes": {f"node_{HEX}": 1}}}
    assert v1_counts(mirror, now=1000.0) is None
    # the status of an autoscaler that stopped writing it a minute ago
    assert v1_counts(status, now=1061.0) is None
    assert v1_counts({"time": 1000.0}, now=1000.0) is None


def test_only_what_no_node_type_could_ever_hold_is_refused() -> None:
    assert never(ONE_GPU, "STRICT_SPREAD", CPU_ONLY, SCALER) is None
    assert never(ONE_GPU * 2, "STRICT_SPREAD", CPU_ONLY, SCALER) is None
    # at most 2 nodes of the type: a third bundle that needs a GPU machine of its own
    assert never(ONE_GPU * 3, "STRICT_SPREAD", CPU_ONLY, SCALER) == (
        "3 bundles need 3 machines, and 2 can hold one"
    )
    # one of them runs already (and is busy): one more can be added
    busy = Autoscaler(types=(GPU_TYPE,), running={"gpu_worker": 1})
    assert never(ONE_GPU * 2, "STRICT_SPREAD", CPU_ONLY, busy) == (
        "2 bundles need 2 machines, and 1 can hold one"
    )
    assert never([{"CPU": 1.0, "TPU": 1.0}], "PACK", CPU_ONLY, SCALER) == (
        "no node can hold bundle 0 (1 CPU, 1 TPU)"
    )
    unbounded = Autoscaler(types=(NodeType("gpu", {"CPU": 1.0, "GPU": 1.0}, -1),))
    assert never(ONE_GPU * 50, "STRICT_SPREAD", CPU_ONLY, unbounded) is None
    # an autoscaler that does not report its node types may have one
    assert never([{"TPU": 1.0}], "PACK", CPU_ONLY, Autoscaler()) is None


def test_the_wait_names_the_node_type_and_how_many_of_it_run() -> None:
    assert waiting_text(ONE_GPU, CPU_ONLY, SCALER) == (
        "waiting for Ray's autoscaler to add a node for 1 GPU, 1 CPU (node type gpu_worker, "
        "0 of 2 running)"
    )
    adding = Autoscaler(types=(GPU_TYPE,), running={"gpu_worker": 1}, adding={"gpu_worker": 1})
    assert waiting_text(ONE_GPU, CPU_ONLY, adding).endswith(
        "(node type gpu_worker, 1 of 2 running, 1 being added)"
    )
    unknown = Autoscaler(adding={"gpu-group": 1})
    assert waiting_text(ONE_GPU, CPU_ONLY, unknown) == (
        "waiting for Ray's autoscaler to add a node for 1 GPU, 1 CPU (node types not "
        "reported; adding gpu-group 1)"
    )
    assert types_text((GPU_TYPE, NodeType("cpu", {"CPU": 8.0}, -1))) == (
        "gpu_worker (1 GPU, 4 CPUs; at most 2), cpu (8 CPUs; no bound)"
    )


def session(bundle: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> PlacedSession:
    placed = PlacedSession(
        {"owner": "me@box/1", "session": "s", "bundles": [bundle], "strategy": "STRICT_SPREAD",
         "timeout": 5}
    )  # fmt: skip
    monkeypatch.setattr(ray_driver_nodes, "emit", lambda *_a, **_k: None)
    return placed


def test_no_live_node_holds_it_refused_without_an_autoscaler_asked_with_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placed = session({"CPU": 1.0, "GPU": 1.0}, monkeypatch)
    ask = "1 bundle of 1 GPU, 1 CPU (STRICT_SPREAD: one machine each)"
    monkeypatch.setattr(ray_driver_nodes, "read_autoscaler", lambda: None)
    with pytest.raises(PlacementError, match=r"^cannot place 1 bundle of 1 GPU, 1 CPU \(STRICT"):
        placed.autoscaler_for(placed.bundles, ask, CPU_ONLY, CPU_ONLY)
    monkeypatch.setattr(ray_driver_nodes, "read_autoscaler", lambda: SCALER)
    assert placed.autoscaler_for(placed.bundles, ask, CPU_ONLY, CPU_ONLY) is SCALER
    # live nodes that can hold it: nothing is asked of the autoscaler
    gpus = [*CPU_ONLY, node("10.0.0.3", 4, 4)]
    assert placed.autoscaler_for(placed.bundles, ask, gpus, gpus) is None
    tpu = session({"CPU": 1.0, "TPU": 1.0}, monkeypatch)
    with pytest.raises(PlacementError) as failed:
        tpu.autoscaler_for(tpu.bundles, "1 bundle of 1 CPU, 1 TPU", CPU_ONLY, CPU_ONLY)
    assert str(failed.value) == (
        "cannot place 1 bundle of 1 CPU, 1 TPU: no node can hold bundle 0 (1 CPU, 1 TPU), nor "
        "with every node Ray's autoscaler can add; the cluster has 2 nodes: 10.0.0.1 (4 CPUs); "
        "10.0.0.2 (4 CPUs); its node types: gpu_worker (1 GPU, 4 CPUs; at most 2)"
    )
    # more GPU machines than the autoscaler may add: what is missing with them, said too
    three = PlacedSession(
        {"owner": "me@box/1", "session": "s", "bundles": ONE_GPU * 3,
         "strategy": "STRICT_SPREAD", "timeout": 5}
    )  # fmt: skip
    with pytest.raises(PlacementError) as failed:
        three.autoscaler_for(three.bundles, "3 bundles", CPU_ONLY, CPU_ONLY)
    assert str(failed.value).startswith(
        "cannot place 3 bundles: no node can hold bundle 0 (1 GPU, 1 CPU), nor with every node "
        "Ray's autoscaler can add (3 bundles need 3 machines, and 2 can hold one); the cluster"
    )


def test_every_bundle_holds_the_resources_and_the_accelerator_type_asked() -> None:
    ray = RaySpec(gpus=1, resources="TPU=2,accelerator_type=T4")
    spec = resolve_shape("r", ShapeRequest(launcher="ray", nodes=2, procs=1, ray=ray), 0, "here")
    assert bundles(spec) == [{"CPU": 1.0, "GPU": 1.0, "TPU": 2.0, "accelerator_type:T4": 0.001}] * 2
