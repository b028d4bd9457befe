"""What one server, its users and its notebook kernels may take on trust, through real
`jupyter server` processes with token auth on: rank consoles belong to the server that
adopted them (several servers of one user share a runtime folder), a kernel id a request
names must be a kernel of the server, a read-only user neither keeps turns alive nor reads
what the ranks printed, and a body that is not UTF-8 is a 400."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.server.process_records import server_tag
from jupyter_dist.server.rank_consoles import FOLDER_PREFIX

from .roles import AUTHORIZER, READER
from .server_process import API, Server, kill_server, start_server, start_server_in, stop_server
from .test_security import every_route, execute_on_ranks
from .test_server import run_on_kernel

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BARE = {"procs": 1, "framework": "none"}  # a rank kernel, no process group: quick to start


def send(
    server: Server,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, http.client.HTTPResponse, http.client.HTTPConnection]:
    """One request with the token and ``headers``; the status, the start of the body (an
    event stream is left open: the caller closes the connection)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request(
        method,
        path,
        body=body,
        headers={"Authorization": f"token {server.token}", **(headers or {})},
    )
    reply = conn.getresponse()
    if reply.getheader("Content-Type", "").startswith("text/event-stream"):
        return reply.status, b"", reply, conn
    data = reply.read()
    conn.close()
    return reply.status, data, reply, conn


def call(server: Server, method: str, path: str, body: Any = None, **headers: str) -> Any:
    status, data, _, _ = send(
        server, method, path, None if body is None else json.dumps(body).encode(), headers
    )
    return status, json.loads(data) if data else None


def first_event(server: Server, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """The status of an event stream and its first event (the snapshot)."""
    status, data, reply, conn = send(server, "GET", path, headers=headers)
    try:
        if status != 200:
            return status, json.loads(data) if data else None
        while True:
            line = reply.readline().decode()
            if line.startswith("data: "):
                return status, json.loads(line[6:])
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("trust")
    running = start_server(
        root,
        root / "config",
        args=(f"--ServerApp.authorizer_class={AUTHORIZER}",),
        extra_env={
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        },
    )
    yield running
    stop_server(running)


def kernel_ids(server: Server) -> set[str]:
    status, listed = server.call("GET", "/api/kernels")
    assert status == 200, listed
    return {k["id"] for k in listed}


# -- rank consoles are their server's ----------------------------------------------------------


def test_servers_sharing_a_runtime_folder_keep_their_rank_consoles_apart(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    roots = {name: tmp_path / name for name in ("a", "b", "c")}
    for root in roots.values():
        root.mkdir()
    a = start_server_in(roots["a"], runtime)
    b = start_server_in(roots["b"], runtime)
    c: Server | None = None
    try:
        consoles, pids = {}, {}
        for server in (a, b):  # one session name on both
            status, created = server.call("POST", f"{API}/sessions", {"name": "s", **BARE})
            assert status == 201, created
            pids[server.url] = created["ranks"][0]["pid"]
            status, kernel = server.call("POST", f"{API}/sessions/s/ranks/0/kernel", {})
            assert status == 201, kernel
            consoles[server.url] = kernel["id"]
        status, created = b.call("POST", f"{API}/sessions", {"name": "only-b", **BARE})
        assert status == 201, created
        status, only_b = b.call("POST", f"{API}/sessions/only-b/ranks/0/kernel", {})
        assert status == 201, only_b
        # neither server lists (nor lets its clients use) the other's rank consoles
        assert kernel_ids(a) == {consoles[a.url]}
        assert kernel_ids(b) == {consoles[b.url], only_b["id"]}
        for server in (a, b):  # each console is on its own server's rank
            out = run_on_kernel(server, consoles[server.url], "import os; print(os.getpid())")
            assert out.strip() == str(pids[server.url]), out
        folders = {s.url: runtime / f"{FOLDER_PREFIX}{server_tag(s.process.pid)}" for s in (a, b)}
        assert sorted(runtime.glob(f"{FOLDER_PREFIX}*")) == sorted(folders.values())
        for folder in folders.values():
            assert folder.stat().st_mode & 0o777 == 0o700, folder
        # b's restart of its session "s" leaves a's console of its own session "s"
        assert b.call("POST", f"{API}/sessions/s/restart", {})[0] == 200
        assert consoles[a.url] in kernel_ids(a)
        assert consoles[b.url] not in kernel_ids(b)
        # a killed server's folder (with its session's key) stays, until a server starts
        kill_server(a)
        assert folders[a.url].exists()
        c = start_server_in(roots["c"], runtime)
        assert not folders[a.url].exists()
        assert kernel_ids(c) == set()  # nor was anything of a's adopted on the way
        assert folders[b.url].exists()  # a live server's stays
        # a server that stops removes its own
        stop_server(b)
        assert not folders[b.url].exists()
    finally:
        for server in (a, b, c):
            if server is not None and server.process.poll() is None:
                stop_server(server)


# -- kernel ids are checked; a read-only user keeps nothing alive --------------------------


def test_made_up_kernel_ids_are_refused_and_the_status_stays_small(server: Server) -> None:
    assert server.call("POST", f"{API}/sessions", {"name": "busy", **BARE})[0] == 201
    try:
        turn = {"turn_id": "holder", "kind": "cell", "ranks": []}
        status, held = server.call("POST", f"{API}/sessions/busy/turns", turn)
        assert status == 200 and held["state"] == "running", held

        def ask(i: int) -> tuple[int, Any]:
            sender = {"path": "p" * 1000, "kernel_id": f"made-up-{i}"}
            return server.call(
                "POST", f"{API}/sessions/busy/turns", {"turn_id": f"t{i}", "sender": sender}
            )

        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(ask, range(40)))
        for status, reply in answers:
            assert status == 400, reply
            assert "kernel_id 'made-up-" in reply["message"], reply
            assert "not a kernel of this Jupyter server" in reply["message"], reply
        status, reply = call(server, "GET", f"{API}/sessions/busy/connection?kernel_id=made-up")
        assert status == 400 and "not a kernel of this Jupyter server" in reply["message"]
        status, reply = first_event(server, f"{API}/events?kernel_id=made-up", {})
        assert status == 400 and "not a kernel of this Jupyter server" in reply["message"]
        status, data, _, _ = send(server, "GET", f"{API}/sessions")
        assert status == 200
        assert len(data) < 20_000, f"GET /sessions is {len(data)} bytes"
        (listed,) = json.loads(data)
        assert listed["notebooks"] == [] and listed["queue"] == []
    finally:
        assert server.call("DELETE", f"{API}/sessions/busy")[0] == 204


def test_a_reader_cannot_keep_a_gone_kernels_turn(server: Server) -> None:
    status, kernel = server.call("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, kernel
    assert server.call("POST", f"{API}/sessions", {"name": "held", **BARE})[0] == 201
    try:
        sender = {"path": "victim.ipynb", "kernel_id": kernel["id"]}
        turn = {"turn_id": "victim", "kind": "cell", "sender": sender}
        status, held = server.call("POST", f"{API}/sessions/held/turns", turn)
        assert status == 200 and held["state"] == "running", held
        # naming the kernel on the event stream would keep it (and its turn) alive
        status, reply = first_event(server, f"{API}/events?kernel_id={kernel['id']}", READER)
        assert status == 403, reply
        assert "permission to execute" in reply["message"], reply
        status, snapshot = first_event(server, f"{API}/events", READER)  # a reader may look
        assert status == 200 and snapshot["type"] == "snapshot"
        # the kernel goes: the next asker gets the ranks at once, not after its turn
        assert server.call("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204
        status, next_turn = server.call("POST", f"{API}/sessions/held/turns", {"turn_id": "next"})
        assert status == 200 and next_turn["state"] == "running", next_turn
        listed = server.call("GET", f"{API}/sessions/held")[1]
        assert listed["notebooks"] == [], listed["notebooks"]
    finally:
        assert server.call("DELETE", f"{API}/sessions/held")[0] == 204
        server.call("DELETE", f"/api/kernels/{kernel['id']}")


def test_a_reader_sees_no_rank_logs_nor_exit_tails(server: Server) -> None:
    status, created = server.call("POST", f"{API}/sessions", {"name": "told", **BARE})
    assert status == 201, created
    try:
        status, info = server.call("GET", f"{API}/sessions/told/connection")
        assert status == 200, info
        execute_on_ranks(info, "import os\nos.write(1, b'SECRET-IN-THE-LOG\\n')")
        log_path = f"{API}/sessions/told/ranks/0/log"
        status, piece = server.call("GET", log_path)
        assert status == 200, piece
        assert call(server, "GET", log_path, **READER)[0] == 403
        os.kill(created["ranks"][0]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            rank = server.call("GET", f"{API}/sessions/told")[1]["ranks"][0]
            if rank["state"] == "dead" and rank["exit_tail"]:
                break
            assert time.monotonic() < deadline, rank
            time.sleep(0.2)
        assert "SECRET-IN-THE-LOG" in rank["exit_tail"], rank
        status, seen = call(server, "GET", f"{API}/sessions/told", **READER)
        assert status == 200 and seen["ranks"][0]["state"] == "dead"
        assert seen["ranks"][0]["exit_tail"] == "", seen["ranks"][0]
        status, listed = call(server, "GET", f"{API}/sessions", **READER)
        assert status == 200 and "SECRET-IN-THE-LOG" not in json.dumps(listed)
        status, snapshot = first_event(server, f"{API}/events", READER)
        assert status == 200 and "SECRET-IN-THE-LOG" not in json.dumps(snapshot)
        status, snapshot = first_event(server, f"{API}/events", {})
        assert status == 200 and "SECRET-IN-THE-LOG" in json.dumps(snapshot)
    finally:
        assert server.call("DELETE", f"{API}/sessions/told")[0] == 204


def login_cookie(server: Server) -> str:
    """The login cookie a browser holds after it signed in with the token (the server sets
    it on any request the token authenticates)."""
    _, _, reply, _ = send(server, "GET", "/api/status")
    cookies = [c.split(";", 1)[0] for c in reply.headers.get_all("Set-Cookie") or []]
    (cookie,) = [c for c in cookies if c.startswith("username-")]
    return cookie


def test_no_change_from_a_read_only_user_nor_a_page_without_the_xsrf_token(
    server: Server,
) -> None:
    """Every route that changes something (each POST and DELETE of ours, and the rank
    consoles' Kernel > Interrupt and Restart): 403 for a user with read permission only,
    and for a browser's request that has the login cookie but not the XSRF token (what a
    page of another site could send); nothing changed. The cookie with the token gets
    through, so the 403s were the XSRF check's."""
    status, created = server.call("POST", f"{API}/sessions", {"name": "kept", **BARE})
    assert status == 201, created
    try:
        status, console = server.call("POST", f"{API}/sessions/kept/ranks/0/kernel")
        assert status == 201, console
        routes = [(m, p) for m, p in every_route("kept") if m not in ("GET", "HEAD")]
        routes += [("POST", f"/api/kernels/{console['id']}/{a}") for a in ("interrupt", "restart")]
        assert {p.rsplit("/", 1)[-1] for _, p in routes} >= {
            "sessions", "kept", "stacks", "interrupt", "restart", "heal", "resize", "free",
            "turns", "end", "kernel",
        }  # fmt: skip
        cookie = f"{login_cookie(server)}; _xsrf=0123456789abcdef"
        sent_by = {"a read-only user": READER, "a page without the XSRF token": {}}
        for who, headers in sent_by.items():
            token = None if headers is not READER else server.token
            for method, path in routes:
                body = json.dumps({"name": "intruder", **BARE, "counts": [2]}).encode()
                got, reply, _, _ = send_as(server, method, path, body, headers, token, cookie)
                assert got == 403, (who, method, path, got, reply)
                if token is None:
                    assert b"_xsrf" in reply, (method, path, reply)
        status, listed = server.call("GET", f"{API}/sessions")
        assert [(s["name"], s["state"]) for s in listed] == [("kept", "ready")], listed
        assert listed[0]["ranks"][0]["pid"] == created["ranks"][0]["pid"]  # not restarted
        assert listed[0]["queue"] == [] and listed[0]["spec"]["procs_per_node"] == 1
        assert console["id"] in kernel_ids(server)
        xsrf = {"X-XSRFToken": "0123456789abcdef"}
        got, reply, _, _ = send_as(
            server, "POST", f"{API}/sessions/kept/interrupt", b"{}", xsrf, None, cookie
        )
        assert got == 204, reply
    finally:
        assert server.call("DELETE", f"{API}/sessions/kept")[0] == 204


def send_as(
    server: Server,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    token: str | None,
    cookie: str,
) -> tuple[int, bytes, http.client.HTTPResponse, http.client.HTTPConnection]:
    """One request with ``token`` (None: the browser's ``cookie`` instead) and ``headers``."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    auth = {"Authorization": f"token {token}"} if token else {"Cookie": cookie}
    try:
        conn.request(method, path, body=body, headers={**auth, **headers})
        reply = conn.getresponse()
        return reply.status, reply.read(), reply, conn
    finally:
        conn.close()


# -- bodies --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["sessions", "sessions/nobody/turns", "sessions/nobody/turns/t/end"]
)
def test_a_body_that_is_not_utf8_is_a_400(server: Server, path: str) -> None:
    if path != "sessions":
        assert server.call("POST", f"{API}/sessions", {"name": "nobody", **BARE})[0] == 201
    try:
        status, data, _, _ = send(server, "POST", f"{API}/{path}", b'{"name": "caf\xe9"}')
        assert status == 400, data
        reply = json.loads(data)
        assert "not UTF-8" in reply["message"] and "byte 13" in reply["message"], reply
    finally:
        if path != "sessions":
            assert server.call("DELETE", f"{API}/sessions/nobody")[0] == 204
    assert server.call("GET", f"{API}/sessions") == (200, [])
