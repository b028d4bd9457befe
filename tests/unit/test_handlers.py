"""The REST handlers in a real Jupyter server, in this process (pytest-jupyter's
``jp_fetch``), with auth on and sessions on in-memory agents (`fake_agent`).

The server extension is loaded as users load it; only its `SessionManager` is swapped
for one whose launchers are fakes, so these tests cover routing, auth, parsing and the
error-to-status mapping in seconds. tests/integration/test_server.py covers the same API
over real agents and kernels in a server process of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# the plugin's fixtures, for this module only (registered as a plugin, its autouse
# fixtures would give every test of the suite a loop of its own)
from pytest_jupyter.jupyter_core import *  # noqa: F403
from pytest_jupyter.jupyter_server import *  # noqa: F403
from pytest_jupyter.pytest_tornasync import *  # noqa: F403
from tornado.httpclient import HTTPClientError, HTTPResponse

from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.server.app import DistServerApp
from tests.unit.fake_agent import FakeCluster
from tests.unit.test_control_plane_fake import KernelStub, kernels

__all__ = ["kernels"]
Fetch = Callable[..., Awaitable[HTTPResponse]]


@pytest.fixture
def jp_asyncio_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh loop, set as this thread's current one: tornado's client looks it up, and
    earlier tests of a run (asyncio.run, closed loops) may have left none set."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_dist": True}}}


@pytest.fixture
def cluster(jp_serverapp: Any) -> Iterator[FakeCluster]:
    """The loaded extension, its manager swapped for one on fake agents."""
    fake = FakeCluster()
    apps = jp_serverapp.extension_manager.extension_apps["jupyter_dist"]
    (app,) = [a for a in apps if isinstance(a, DistServerApp)]
    manager = SessionManager(launchers=fake.launcher)
    manager.add_listener(app._session_event)
    app.manager = manager
    jp_serverapp.web_app.settings["jupyter_dist_manager"] = manager
    yield fake


@pytest.fixture
def call(jp_fetch: Fetch, jp_asyncio_loop: Any, cluster: FakeCluster) -> Callable[..., Any]:
    """``call(method, path, body=None, **fetch_args) -> (status, json)``, errors included."""

    def do(method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        parts = [p for p in f"{API_PREFIX}/{path}".split("/") if p]
        if body is not None:
            kwargs["body"] = json.dumps(body)
        # the server's loop is this thread's current one for tornado's client (a helper
        # that ran asyncio.run since the fixture was made has unset it)
        asyncio.set_event_loop(jp_asyncio_loop)
        try:
            reply = jp_asyncio_loop.run_until_complete(jp_fetch(*parts, method=method, **kwargs))
        except HTTPClientError as err:
            assert err.response is not None
            raw = err.response.body
            return err.code, json.loads(raw) if raw else None
        return reply.code, json.loads(reply.body) if reply.body else None

    return do


def test_a_session_starts_is_listed_and_stops(
    call: Callable[..., Any], kernels: KernelStub
) -> None:
    assert call("GET", "sessions") == (200, [])
    code, status = call("POST", "sessions", {"name": "t", "procs": 2})
    assert code == 201, status
    assert status["name"] == "t"
    assert status["state"] == "ready"
    assert [r["rank"] for r in status["ranks"]] == [0, 1]
    # the same request again finds it: 200, not a second session
    assert call("POST", "sessions", {"name": "t", "procs": 2})[0] == 200
    code, listed = call("GET", "sessions")
    assert code == 200 and [s["name"] for s in listed] == ["t"]
    assert call("GET", "sessions/t")[1]["world_size"] == 2
    assert call("DELETE", "sessions/t") == (204, None)
    assert call("GET", "sessions") == (200, [])


def test_domain_errors_become_json_with_a_status_that_means_something(
    call: Callable[..., Any], kernels: KernelStub
) -> None:
    code, body = call("GET", "sessions/nope")
    assert code == 404 and "nope" in body["message"]
    code, body = call("POST", "sessions", {"name": "t", "procs": "two"})
    assert code == 400 and "procs" in body["message"]
    code, body = call("POST", "sessions", {"name": "t", "colour": "red"})
    assert code == 400 and "colour" in body["message"]
    assert call("POST", "sessions", {"name": "t", "procs": 2})[0] == 201
    code, body = call("POST", "sessions", {"name": "t", "procs": 1})
    assert code == 409 and "t" in body["message"], body  # another shape under the same name
    assert call("DELETE", "sessions/t")[0] == 204


def test_a_bad_ray_request_is_a_400_naming_the_value_and_starts_nothing(
    call: Callable[..., Any], cluster: FakeCluster
) -> None:
    ray = {"nodes": 2, "procs": 1, "launcher": "ray"}
    code, body = call("POST", "sessions", {**ray, "ray": {"strategy": "diagonal"}})
    assert code == 400, body
    assert "ray: --ray-strategy 'diagonal': expected one of STRICT_SPREAD" in body["message"]
    code, body = call("POST", "sessions", {**ray, "ray": {"cpus": 0}})
    assert code == 400 and "ray: --ray-cpus 0: expected 1 to 4096" in body["message"], body
    code, body = call("POST", "sessions", {**ray, "ray": []})
    assert code == 400 and "ray: '[]' is not a dict" in body["message"], body
    code, body = call("POST", "sessions", {"procs": 1, "ray": {"cpus": 2}})
    assert code == 400 and "ray options without --ray" in body["message"], body
    code, body = call("POST", "sessions", {"nodes": 2, "launcher": "ray"})
    assert code == 400 and "--ray: say how many ranks each node runs" in body["message"], body
    # what the sidebar's form asks before it closes: checked, nothing started
    form = {**ray, "name": "r", "ray": {"strategy": "pack", "cpus": 2, "runtime_env": "{}"}}
    code, body = call("POST", "sessions", form, params={"validate": "true"})
    assert (code, body) == (200, {"valid": True, "name": "r"})
    code, body = call(
        "POST", "sessions", {**form, "ray": {"gpus": 5000}}, params={"validate": "true"}
    )
    assert code == 200 and body["valid"] is False, body
    assert body["message"] == "ray: --ray-gpus 5000: expected 0 to 4096"
    assert call("GET", "sessions") == (200, [])
    assert not cluster.agents


def test_a_bad_k8s_request_is_a_400_naming_the_field_and_value_and_starts_nothing(
    call: Callable[..., Any], cluster: FakeCluster, tmp_path: Path
) -> None:
    k8s = {"nodes": 2, "gpus": 4, "launcher": "k8s"}
    refusals = [
        ({"namespace": "GPU_Team"}, "k8s: --namespace 'GPU_Team': expected a Kubernetes namespace"),
        ({"memory": "64GB"}, "k8s: --memory '64GB': expected a Kubernetes quantity"),
        ({"cpus": 8}, "k8s.cpus: '8' is not a str"),
        ({"namespce": "ml"}, "k8s: unknown field 'namespce'; expected callback, context"),
        ({"tolerations": ["gpu:Never"]}, "k8s: --toleration 'gpu:Never': expected key[=value]"),
        ({"deadline": 10}, "k8s: --k8s-deadline 10: expected whole seconds, 60 to 2592000"),
    ]
    for fields, message in refusals:
        code, body = call("POST", "sessions", {**k8s, "k8s": fields})
        assert code == 400 and message in body["message"], (fields, body)
    code, body = call("POST", "sessions", {**k8s, "hosts": "a,b", "k8s": {}})
    assert code == 400 and "--k8s and --hosts/--hostfile: give one" in body["message"], body
    code, body = call("POST", "sessions", {"procs": 1, "k8s": {"namespace": "ml"}})
    assert code == 400 and "k8s options without --k8s" in body["message"], body
    # the pod template is read on the server before anything starts
    missing = str(tmp_path / "missing.yaml")
    code, body = call("POST", "sessions", {**k8s, "k8s": {"pod_template": missing}})
    assert code == 400, body
    assert body["message"] == f"k8s: --pod-template {missing!r}: No such file or directory"
    two = tmp_path / "two.yaml"
    two.write_text("spec:\n  containers: [{name: a}, {name: b}]\n")
    code, body = call("POST", "sessions", {**k8s, "k8s": {"pod_template": str(two)}})
    assert code == 400 and "2 containers; expected at most one" in body["message"], body
    # what the sidebar's form asks before it closes: checked, nothing started
    good = tmp_path / "pod.yaml"
    good.write_text("spec:\n  serviceAccountName: trainer\n")
    form = {
        **k8s,
        "name": "on-k8s",
        "k8s": {
            "namespace": "ml",
            "memory": "64Gi",
            "node_selector": ["nvidia.com/gpu.product=H100"],
            "tolerations": ["nvidia.com/gpu:NoSchedule"],
            "pod_template": str(good),
            "callback": "10.0.3.7:7077",
            "timeout": 600,
        },
    }
    code, body = call("POST", "sessions", form, params={"validate": "true"})
    assert (code, body) == (200, {"valid": True, "name": "on-k8s"})
    code, body = call(
        "POST",
        "sessions",
        {**form, "k8s": {"pod_template": str(two)}},
        params={"validate": "true"},
    )
    assert code == 200 and body["valid"] is False, body
    assert body["message"].startswith(f"k8s: --pod-template {str(two)!r}: 2 containers")
    assert call("GET", "sessions") == (200, [])
    assert not cluster.agents


def test_an_agent_that_fails_to_start_is_a_502_naming_the_node(
    call: Callable[..., Any], cluster: FakeCluster
) -> None:
    cluster.script(0).versions = {"jupyter_dist": "0.0.1"}
    code, body = call("POST", "sessions", {"name": "old", "procs": 1})
    assert code == 502, body
    assert "install jupyter_dist==" in body["message"]
    assert call("GET", "sessions") == (200, [])  # a failed start is not registered
    assert all(agent.exited for agent in cluster.agents)


def test_every_route_needs_a_token(jp_fetch: Fetch, jp_asyncio_loop: Any, cluster: Any) -> None:
    for method, path, body in (
        ("GET", "sessions", None),
        ("POST", "sessions", json.dumps({"name": "t", "procs": 1})),
        ("GET", "sessions/t", None),
        ("DELETE", "sessions/t", None),
    ):
        parts = [p for p in f"{API_PREFIX}/{path}".split("/") if p]
        asyncio.set_event_loop(jp_asyncio_loop)
        with pytest.raises(HTTPClientError) as err:
            jp_asyncio_loop.run_until_complete(
                jp_fetch(*parts, method=method, body=body, headers={"Authorization": ""})
            )
        assert err.value.code == 403, (method, path)
    assert not cluster.agents  # nothing started for an unauthenticated POST
