"""The server extension through a real `jupyter server` process with token auth on."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_dist.common.ports import free_port
from jupyter_dist.settings import MASTER_PORTS_VAR
from tests.conftest import wait_until_ready

from .server_process import API, Server, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("server")
    running = start_server(root, root / "config")
    yield running
    stop_server(running)


def test_extension_is_loaded(server: Server) -> None:
    assert server.call("GET", f"{API}/sessions") == (200, [])


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_requests_without_a_valid_token_are_refused_and_start_nothing(
    server: Server, token: str | None
) -> None:
    for method, path, body in (
        ("GET", f"{API}/sessions", None),
        ("POST", f"{API}/sessions", {"name": "intruder", "procs": 1}),
        ("POST", f"{API}/sessions/intruder/restart", {}),
        ("DELETE", f"{API}/sessions/intruder", None),
    ):
        status, _ = server.call(method, path, body, token=token)
        assert status == 403, (method, path, status)
    assert server.call("GET", f"{API}/sessions") == (200, [])
    assert server.descendants() == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"procs": "two"}, "procs: 'two' is not a int"),
        ({"bogus": 1}, "unknown field 'bogus'"),
        ({"procs": 0}, "--procs 0: expected a whole number"),
        ({"name": "a b", "procs": 1}, "--session 'a b'"),
        ({"procs": 1, "backend": "mpi"}, "--backend 'mpi'"),
        ({"procs": 1, "framework": "tf"}, "--framework 'tf': expected one of torch, jax, none"),
    ],
)
def test_bad_requests_are_400_and_name_the_value(
    server: Server, body: dict[str, Any], fragment: str
) -> None:
    status, reply = server.call("POST", f"{API}/sessions", body)
    assert status == 400
    assert fragment in reply["message"]


def test_a_session_without_a_process_group_through_the_server(server: Server) -> None:
    body = {"name": "bare", "procs": 2, "framework": "none"}
    status, created = server.call("POST", f"{API}/sessions", body)
    try:
        assert status == 201, created
        assert created["spec"]["framework"] == "none" and not created["spec"]["init_process_group"]
        assert created["shape"] == "2 CPU ranks (no process group)"
        again = {"name": "bare", "framework": "torch"}
        status, conflict = server.call("POST", f"{API}/sessions", again)
        assert status == 409 and "--framework torch" in conflict["message"], conflict
    finally:
        assert server.call("DELETE", f"{API}/sessions/bare")[0] == 204


def test_unknown_session_is_404(server: Server) -> None:
    status, reply = server.call("GET", f"{API}/sessions/nobody")
    assert status == 404
    assert "no session named 'nobody'" in reply["message"]
    assert server.call("POST", f"{API}/sessions/nobody/interrupt", {})[0] == 404


def test_session_round_trip(server: Server) -> None:
    status, created = server.call("POST", f"{API}/sessions", {"name": "srv", "procs": 2})
    assert status == 201, created
    assert created["state"] == "ready"
    assert [r["rank"] for r in created["ranks"]] == [0, 1]
    pids = [r["pid"] for r in created["ranks"]]
    assert all(psutil.pid_exists(p) for p in pids)

    assert server.call("POST", f"{API}/sessions", {"name": "srv"})[0] == 200
    status, conflict = server.call("POST", f"{API}/sessions", {"name": "srv", "procs": 3})
    assert status == 409
    assert "is running 2 CPU ranks" in conflict["message"]

    status, listed = server.call("GET", f"{API}/sessions")
    assert [s["name"] for s in listed] == ["srv"]
    assert server.call("POST", f"{API}/sessions/srv/interrupt", {})[0] == 204

    status, restarted = server.call("POST", f"{API}/sessions/srv/restart", {})
    assert status == 200
    new_pids = [r["pid"] for r in restarted["ranks"]]
    assert set(new_pids).isdisjoint(pids)

    assert server.call("DELETE", f"{API}/sessions/srv")[0] == 204
    assert server.call("GET", f"{API}/sessions/srv")[0] == 404
    deadline = time.monotonic() + 60  # an exit a busy machine may take seconds over
    while any(psutil.pid_exists(p) for p in new_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in new_pids)


def test_server_options_apply_and_stopping_the_server_stops_its_sessions(
    tmp_path: Path,
) -> None:
    lo = free_port()
    # the option, not an environment's JUPYTER_DIST_MASTER_PORTS (which comes first)
    env = {k: v for k, v in os.environ.items() if k != MASTER_PORTS_VAR}
    own = start_server(
        tmp_path,
        tmp_path / "config",
        args=(f"--DistServerApp.master_port_range={lo}-{lo + 3}",),
        base_env=env,
    )
    try:
        status, created = own.call("POST", f"{API}/sessions", {"name": "bye", "procs": 2})
        assert status == 201, created
        assert lo <= int(created["master"].rsplit(":", 1)[1]) <= lo + 3, created["master"]
        ours = [p.pid for p in own.descendants()]
        assert len(ours) == 4  # the agent, its relay and two ranks
    finally:
        stop_server(own)
    deadline = time.monotonic() + 60  # an exit a busy machine may take seconds over
    while any(psutil.pid_exists(p) for p in ours) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in ours)
    assert "stopping 1 session(s)" in (tmp_path / "server.log").read_text()


def test_the_servers_limits_refuse_sessions_and_ranks_a_node_across_sessions(
    tmp_path: Path,
) -> None:
    """Tiny limits: two sessions, two ranks on this machine across them. A refusal is a
    409 that names the limit, the sessions holding it and the option to raise, and it
    starts nothing."""
    own = start_server(
        tmp_path,
        tmp_path / "config",
        args=(
            "--DistServerApp.max_sessions=2",
            "--DistServerApp.max_ranks_per_node_all_sessions=2",
        ),
    )
    try:
        status, created = own.call("POST", f"{API}/sessions", {"name": "a", "procs": 1})
        assert status == 201, created
        ours = {p.pid for p in own.descendants()}

        status, refused = own.call("POST", f"{API}/sessions", {"name": "b", "procs": 2})
        assert (status, refused["reason"]) == (409, "LimitError"), refused
        message = refused["message"]
        assert "2 ranks on node" in message and "would make 3 there" in message, message
        assert "DistServerApp.max_ranks_per_node_all_sessions = 2" in message, message
        assert "1 run there already ('a': 1)" in message, message
        assert {p.pid for p in own.descendants()} == ours  # nothing of b started

        status, created = own.call("POST", f"{API}/sessions", {"name": "b", "procs": 1})
        assert status == 201, created  # the refusal held no room
        status, refused = own.call("POST", f"{API}/sessions", {"name": "c", "procs": 1})
        assert (status, refused["reason"]) == (409, "LimitError"), refused
        assert refused["message"].startswith(
            "session 'c': this Jupyter server runs 2 sessions already ('a', 'b'), the most "
            "it may (DistServerApp.max_sessions = 2)"
        ), refused
        assert [s["name"] for s in own.call("GET", f"{API}/sessions")[1]] == ["a", "b"]
        # a running session's name is no new session: it is answered, not refused
        assert own.call("POST", f"{API}/sessions", {"name": "a"})[0] == 200
    finally:
        stop_server(own)


def test_openapi_file_describes_every_route() -> None:
    import yaml

    from jupyter_dist.server.handlers import API_PREFIX
    from jupyter_dist.server.routes import API_HANDLERS

    spec = yaml.safe_load(
        (Path(__file__).parents[2] / "jupyter_dist" / "server" / "rest-api.yaml").read_text()
    )
    assert spec["servers"][0]["url"] == API_PREFIX
    documented = set(spec["paths"])
    for pattern, _handler in API_HANDLERS:
        path = pattern.removeprefix(API_PREFIX)
        path = re.sub(r"\(\?P<name>[^)]*\)", "{name}", path)
        path = re.sub(r"\(\?P<turn_id>[^)]*\)", "{turn_id}", path)
        path = re.sub(r"\(\?P<rank>[^)]*\)", "{rank}", path)
        for action in re.findall(r"\(\?P<action>([^)]*)\)", path):
            for one in action.split("|"):
                assert path.replace(f"(?P<action>{action})", one) in documented
            break
        else:
            assert path in documented, path
    from jupyter_dist.server.handlers import K8S_FIELDS, RAY_FIELDS, REQUEST_FIELDS

    fields = spec["components"]["schemas"]["SessionRequest"]["properties"]
    assert set(fields) == set(REQUEST_FIELDS)
    assert set(fields["ray"]["properties"]) == set(RAY_FIELDS)
    assert set(fields["k8s"]["properties"]) == set(K8S_FIELDS)


def test_installing_enables_the_extension() -> None:
    """The package's jupyter_server_config.d file turns the extension on, and it loads."""
    from jupyter_core.paths import jupyter_config_path
    from jupyter_server.extension.config import ExtensionConfigManager
    from jupyter_server.extension.manager import ExtensionPackage

    config = ExtensionConfigManager(read_config_path=jupyter_config_path())
    assert config.get_jpserver_extensions().get("jupyter_dist") is True
    package = ExtensionPackage(name="jupyter_dist", enabled=True)
    assert package.validate()
    assert list(package.extension_points) == ["jupyter_dist"]


def read_events(response: Any, until: Any, limit_s: float = 60) -> list[dict[str, Any]]:
    """Parse server-sent events until ``until(event)`` holds."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = response.readline().decode()
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
            if until(events[-1]):
                return events
    raise AssertionError(f"no matching event; got {[e['type'] for e in events]}")


def test_event_stream_follows_sessions_and_ranks(server: Server) -> None:
    import http.client

    host, port = server.url.removeprefix("http://").split(":")
    refused = http.client.HTTPConnection(host, int(port), timeout=30)
    refused.request("GET", f"{API}/events")
    assert refused.getresponse().status == 403
    refused.close()

    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", f"{API}/events", headers={"Authorization": f"token {server.token}"})
    stream = conn.getresponse()
    assert stream.status == 200
    assert stream.getheader("Content-Type") == "text/event-stream"
    first = read_events(stream, lambda e: True)
    assert first[0]["type"] == "snapshot"

    def ready(e: dict[str, Any]) -> bool:
        return (
            e["type"] == "session"
            and e["session"]["name"] == "ev"
            and (e["session"]["state"] == "ready")
        )

    assert server.call("POST", f"{API}/sessions", {"name": "ev", "procs": 2})[0] == 201
    seen = read_events(stream, ready)
    states = [e["session"]["state"] for e in seen if e["type"] == "session"]
    assert states[0] == "starting"
    assert {r["state"] for r in seen[-1]["session"]["ranks"]} == {"idle"}

    assert server.call("DELETE", f"{API}/sessions/ev")[0] == 204
    read_events(stream, lambda e: e == {"type": "removed", "name": "ev"})
    conn.close()


def test_connection_info_lets_a_client_run_code_on_the_ranks(server: Server) -> None:
    from jupyter_client.blocking.client import BlockingKernelClient

    assert server.call("POST", f"{API}/sessions", {"name": "conn", "procs": 2})[0] == 201
    try:
        assert server.call("GET", f"{API}/sessions/conn/connection", token=None)[0] == 403
        status, info = server.call("GET", f"{API}/sessions/conn/connection")
        assert status == 200
        assert [r["rank"] for r in info["ranks"]] == [0, 1]
        for rank in info["ranks"]:
            client = BlockingKernelClient()
            client.load_connection_info({**rank["connection"], "key": info["key"]})
            client.start_channels()
            wait_until_ready(client)  # its output is heard only once IOPub subscribed
            printed: list[str] = []

            def hook(msg: dict[str, Any], printed: list[str] = printed) -> None:
                if msg["msg_type"] == "stream":
                    printed.append(msg["content"]["text"])

            try:
                reply = client.execute_interactive(
                    "import os, torch.distributed as dist\nprint(os.environ['RANK'], "
                    "dist.is_initialized())",
                    timeout=60,
                    output_hook=hook,
                )
                assert reply["content"]["status"] == "ok"
                assert "".join(printed).strip() == f"{rank['rank']} True"
            finally:
                client.stop_channels()
        # a wrong key is refused by the kernel: no reply comes back
        bad = BlockingKernelClient()
        bad.load_connection_info({**info["ranks"][0]["connection"], "key": "not-the-key"})
        bad.start_channels()
        good = BlockingKernelClient()
        good.load_connection_info({**info["ranks"][0]["connection"], "key": info["key"]})
        good.start_channels()
        try:
            bad.kernel_info()
            # the kernel answers requests in the order they came: once it answered a good
            # one sent after the bad one, the bad one's answer would be there already
            asked = good.kernel_info()
            while good.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != asked:
                pass
            with pytest.raises(Exception):  # noqa: B017 - queue.Empty on timeout
                bad.get_shell_msg(timeout=1)
        finally:
            bad.stop_channels()
            good.stop_channels()
    finally:
        server.call("DELETE", f"{API}/sessions/conn")


def test_metrics_stream_and_rank_logs_for_the_sidebar(server: Server) -> None:
    import http.client

    status, created = server.call("POST", f"{API}/sessions", {"name": "watched", "procs": 2})
    assert status == 201, created
    try:
        host, port = server.url.removeprefix("http://").split(":")
        auth = {"Authorization": f"token {server.token}"}
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("GET", f"{API}/sessions/watched/metrics?interval=0.25", headers=auth)
        stream = conn.getresponse()
        assert stream.status == 200
        samples = read_events(stream, lambda e: len(e.get("ranks", [])) == 2 and e["time"])
        conn.close()
        last = samples[-1]
        (node,) = last["nodes"]
        assert node["error"] == "" and node["cpus"] >= 1
        assert 0 < node["mem_used_mib"] < node["mem_total_mib"]
        assert node["gpus"] == []  # no NVIDIA driver here: CPU and memory only
        assert [r["rank"] for r in last["ranks"]] == [0, 1]
        assert all(r["rss_mib"] > 10 for r in last["ranks"])  # real rank processes
        pids = [r["pid"] for r in server.call("GET", f"{API}/sessions/watched")[1]["ranks"]]
        assert [r["pid"] for r in last["ranks"]] == pids

        for bad in ("0", "nan", "61", "x"):
            status, reply = server.call("GET", f"{API}/sessions/watched/metrics?interval={bad}")
            assert status == 400 and "interval" in reply["message"], (bad, reply)

        status, piece = server.call("GET", f"{API}/sessions/watched/ranks/1/log")
        assert status == 200, piece
        assert piece["rank"] == 1 and piece["offset"] == 0 and piece["end"] >= 0
        assert piece["path"].endswith(".log")
        status, again = server.call(
            "GET", f"{API}/sessions/watched/ranks/1/log?offset={piece['end']}"
        )
        assert status == 200 and again["offset"] == piece["end"]
        status, reply = server.call("GET", f"{API}/sessions/watched/ranks/2/log")
        assert status == 400 and "has ranks 0-1" in reply["message"], reply
        status, reply = server.call("GET", f"{API}/sessions/watched/ranks/0/log?offset=-1")
        assert status == 400 and "offset" in reply["message"], reply
    finally:
        assert server.call("DELETE", f"{API}/sessions/watched")[0] == 204


def run_on_kernel(server: Server, kernel_id: str, code: str) -> str:
    """Execute ``code`` on the server's kernel ``kernel_id`` through its websocket, as a
    JupyterLab console does; returns what it printed."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def go() -> str:
        url = server.url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(
            HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
        )
        msg_id = uuid.uuid4().hex
        ws.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": "test",
                        "session": uuid.uuid4().hex,
                        "version": "5.3",
                        "date": "2026-01-01T00:00:00Z",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "store_history": False},
                    "channel": "shell",
                }
            )
        )
        printed = []
        while True:
            raw = await asyncio.wait_for(ws.read_message(), 60)
            assert raw is not None, "the websocket closed"
            msg = json.loads(raw)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed.append(msg["content"]["text"])
            idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
            if idle:  # after every output of the request (the reply may come first)
                ws.close()
                return "".join(printed)

    return asyncio.run(go())


def test_a_rank_kernel_becomes_a_server_kernel_for_a_console(server: Server) -> None:
    status, created = server.call("POST", f"{API}/sessions", {"name": "consoled", "procs": 2})
    assert status == 201, created
    try:
        pids = [r["pid"] for r in created["ranks"]]
        status, kernel = server.call("POST", f"{API}/sessions/consoled/ranks/1/kernel", {})
        assert status == 201, kernel
        assert kernel["rank"] == 1 and kernel["name"] == "python3"
        status, listed = server.call("GET", "/api/kernels")
        assert kernel["id"] in [k["id"] for k in listed]
        out = run_on_kernel(server, kernel["id"], "import os; print('rank', os.environ['RANK'])")
        assert out.strip() == "rank 1", out
        # asked again: the same kernel; closing it from a console leaves the rank alone
        assert server.call("POST", f"{API}/sessions/consoled/ranks/1/kernel", {})[1] == kernel
        assert server.call("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204
        after = server.call("GET", f"{API}/sessions/consoled")[1]
        assert [r["pid"] for r in after["ranks"]] == pids
        assert {r["state"] for r in after["ranks"]} == {"idle"}
        # and it can be opened again
        status, again = server.call("POST", f"{API}/sessions/consoled/ranks/1/kernel", {})
        assert status == 201 and again["id"] != kernel["id"], again
        assert run_on_kernel(server, again["id"], "print(1 + 1)").strip() == "2"
        # a restart takes the old ranks' kernels off the server's list
        status, kernel = server.call("POST", f"{API}/sessions/consoled/ranks/0/kernel", {})
        assert status == 201, kernel
        assert server.call("POST", f"{API}/sessions/consoled/restart", {})[0] == 200
        listed = server.call("GET", "/api/kernels")[1]
        assert kernel["id"] not in [k["id"] for k in listed]
        status, reply = server.call("POST", f"{API}/sessions/consoled/ranks/2/kernel", {})
        assert status == 400 and "has ranks 0-1" in reply["message"], reply
    finally:
        assert server.call("DELETE", f"{API}/sessions/consoled")[0] == 204


def test_profiles_of_the_servers_config_folder_start_sessions_and_are_saved(
    server: Server,
) -> None:
    """``GET /profiles`` lists the server's profiles with the request each makes, ``POST
    /sessions`` takes one by name under its own fields, and ``PUT /profiles/NAME`` saves a
    request as one."""
    from jupyter_dist.common.profiles import PROFILES_FILE

    path = server.runtime_dir.parent / "config" / PROFILES_FILE
    status, listed = server.call("GET", f"{API}/profiles")
    assert status == 200 and listed == {"path": str(path), "profiles": [], "error": ""}
    path.write_text(
        "bare:\n  procs: 2\n  framework: none\n  output: text\n"
        "broken:\n  k8s: true\n  memory: lots\n  procs: 1\n"
    )
    try:
        status, listed = server.call("GET", f"{API}/profiles")
        assert status == 200, listed
        bare, broken = listed["profiles"]
        assert bare["request"] == {"procs": 2, "framework": "none"} and bare["error"] == ""
        assert bare["unused"] == ["output"] and bare["launcher"] == "local"
        assert broken["launcher"] == "k8s" and "--memory 'lots'" in broken["error"]
        # the request's own fields override the profile's
        body = {"name": "profiled", "profile": "bare", "procs": 1}
        status, valid = server.call("POST", f"{API}/sessions?validate=true", body)
        assert valid == {"valid": True, "name": "profiled"}, valid
        status, created = server.call("POST", f"{API}/sessions", body)
        try:
            assert status == 201, created
            assert created["shape"] == "1 CPU rank (no process group)", created
        finally:
            assert server.call("DELETE", f"{API}/sessions/profiled")[0] == 204
        status, refused = server.call("POST", f"{API}/sessions", {"profile": "broken"})
        assert status == 400 and refused["message"].startswith(
            f"profile 'broken' ({path}): k8s: --memory 'lots'"
        ), refused
        status, refused = server.call("POST", f"{API}/sessions", {"profile": "bear"})
        assert status == 400 and "has no profile 'bear'; did you mean bare?" in refused["message"]
        # saved: the request as the options a cell gives, beside the others, mode 0600
        k8s = {"namespace": "ml", "tolerations": ["nvidia.com/gpu:NoSchedule"]}
        saved = {"name": "x", "launcher": "k8s", "nodes": 2, "gpus": [4, 2], "k8s": k8s}
        status, reply = server.call("PUT", f"{API}/profiles/pods", saved)
        assert status == 200, reply
        assert reply["settings"] == {
            "k8s": True,
            "nodes": 2,
            "gpus": [4, 2],
            "namespace": "ml",
            "toleration": ["nvidia.com/gpu:NoSchedule"],
        }
        assert reply["request"] == {key: v for key, v in saved.items() if key != "name"}
        names = [p["name"] for p in server.call("GET", f"{API}/profiles")[1]["profiles"]]
        assert names == ["bare", "broken", "pods"] and path.stat().st_mode & 0o777 == 0o600
        status, refused = server.call("PUT", f"{API}/profiles/pods", {"procs": 0})
        assert status == 400 and "--procs 0" in refused["message"], refused
    finally:
        path.unlink()
