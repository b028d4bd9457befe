"""Security checks: what our processes listen on, who may read the rank kernels' sockets,
and that every REST route of the server extension needs an authenticated user.

The listening-socket audits start real sessions and look at every process we started: a
single-host session listens on no address other machines reach (the rendezvous store, gloo
and ipykernel's output pipe on loopback; the rank kernels on Unix sockets in a private
folder; the agent on nothing). Multi-node sessions are audited in tests/multinode.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import ipaddress
import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.rendezvous import loopback_interface, plan_rendezvous
from jupyter_dist.rank.console_guard import ALLOW
from jupyter_dist.server.handlers import API_PREFIX, DistHandler
from jupyter_dist.server.routes import API_HANDLERS
from tests.conftest import CellOutput

from .server_process import API, Server, start_server, stop_server

# -- what processes listen on ---------------------------------------------------------------


@dataclass(frozen=True)
class Listener:
    """An inet socket that accepts from others: a listening TCP socket, or a bound,
    unconnected UDP socket."""

    pid: int
    proto: str  # "tcp" or "udp"
    ip: str
    port: int

    @property
    def loopback(self) -> bool:
        addr = ipaddress.ip_address(self.ip.split("%")[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped.is_loopback
        return addr.is_loopback

    def __str__(self) -> str:
        return f"pid {self.pid} {describe(self.pid)}: {self.proto} {self.ip}:{self.port}"


def describe(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:160]
    except psutil.Error:
        return "(gone)"


def inet_listeners(procs: Iterable[psutil.Process]) -> list[Listener]:
    """Every listening inet socket of these processes (psutil reads this network
    namespace's tables: for processes in other namespaces see the multi-node test)."""
    found: list[Listener] = []
    for proc in procs:
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for c in conns:
            tcp = c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN
            udp = c.type == socket.SOCK_DGRAM and not c.raddr
            if tcp or udp:
                found.append(Listener(proc.pid, "tcp" if tcp else "udp", c.laddr.ip, c.laddr.port))
    return found


def unix_paths(proc: psutil.Process) -> set[str]:
    """The paths of the Unix sockets a process holds (listening or accepted)."""
    try:
        return {str(c.laddr) for c in proc.net_connections(kind="unix") if c.laddr}
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return set()


def ours_and_below(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and every live process below it."""
    found = [root]
    for proc in root.children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def master_port(status: dict[str, Any]) -> int:
    return int(str(status["master"]).rsplit(":", 1)[1])


def store_listeners(statuses: Iterable[dict[str, Any]]) -> set[tuple[int, int]]:
    """(rank 0's pid, MASTER_PORT) of every running session: the rendezvous store
    (found by port and pid; it listens on the address MASTER_ADDR names)."""
    found: set[tuple[int, int]] = set()
    for status in statuses:
        if status.get("master"):
            rank0 = [r["pid"] for r in status["ranks"] if r["rank"] == 0 and r["pid"]]
            found.update((pid, master_port(status)) for pid in rank0)
    return found


def exposed(listeners: Iterable[Listener], allowed: set[tuple[int, int]]) -> list[str]:
    """Listeners on an address other machines may reach, other than the allowed ones."""
    return [
        str(sock)
        for sock in listeners
        if not sock.loopback and not (sock.proto == "tcp" and (sock.pid, sock.port) in allowed)
    ]


def check_private_folder(folder: Path, sockets: set[str]) -> None:
    """The agent's folder holds the rank kernels' Unix sockets, connection files and logs:
    only this user may enter it (0700), read its files (0600) or connect to its sockets
    (connecting to a Unix socket needs write permission on it)."""
    info = folder.stat()
    # (jupyter_client adds the sticky bit to a connection file's folder)
    assert info.st_mode & 0o777 == 0o700, f"{folder}: mode {oct(info.st_mode)}"
    assert info.st_uid == os.getuid()
    seen = set()
    for entry in folder.iterdir():
        st = entry.lstat()
        mode = stat.S_IMODE(st.st_mode)
        assert st.st_uid == os.getuid(), f"{entry} is not ours"
        if stat.S_ISSOCK(st.st_mode):
            seen.add(str(entry))
            assert not mode & 0o077, f"{entry}: others may connect (mode {oct(mode)})"
        else:
            assert stat.S_ISREG(st.st_mode), f"{entry}: unexpected kind {oct(st.st_mode)}"
            assert mode == 0o600, f"{entry}: mode {oct(mode)}, expected 0o600"
    assert sockets <= seen, f"sockets outside {folder}: {sorted(sockets - seen)}"


def kernel_sockets(connection: dict[str, Any]) -> set[str]:
    """The Unix socket paths of one rank kernel's connection info (transport ipc)."""
    assert connection["transport"] == "ipc", connection
    channels = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    return {f"{connection['ip']}-{connection[ch]}" for ch in channels}


# -- single-host sessions stay on loopback --------------------------------------------------


def test_single_host_sessions_use_the_loopback_interface() -> None:
    lo = loopback_interface()
    assert lo is not None, psutil.net_if_addrs()
    assert any(a.address == "127.0.0.1" for a in psutil.net_if_addrs()[lo])
    spec = SessionSpec("s", procs_per_node=2)
    rdzv, node_env = asyncio.run(plan_rendezvous(spec, [], {}))
    assert rdzv.master_addr == "localhost"
    assert node_env == {0: {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}}
    _, chosen = asyncio.run(plan_rendezvous(spec, [], {"GLOO_SOCKET_IFNAME": "eth9"}))
    assert chosen == {0: {"GLOO_SOCKET_IFNAME": "eth9", "NCCL_SOCKET_IFNAME": lo}}


PIPE_PORT_CELL = (
    "from ipykernel.kernelapp import IPKernelApp as _App\n"
    "_jd_pipe = getattr(getattr(_App.instance(), 'iopub_thread', None), '_pipe_port', None)\n"
)


@pytest.mark.slow
def test_a_local_session_listens_on_loopback_only(shell: Any, run: Any) -> None:
    """A session the notebook runs itself: the kernel's own sockets are Unix sockets in a
    private folder, gloo and the rendezvous store (rank 0, MASTER_PORT) listen on loopback,
    the agent listens on nothing."""
    from jupyter_dist.notebook.owners import embedded_owner

    lo = loopback_interface()
    out: CellOutput = run(
        "%%distributed --session audit --procs 2 --no-init\n"
        "import os\n"
        f"{PIPE_PORT_CELL}"
        "print('ifname', os.environ['GLOO_SOCKET_IFNAME'], os.environ['NCCL_SOCKET_IFNAME'])"
    )
    try:
        assert out.ok, out.stdout + out.stderr
        assert f"[ranks 0-1] ifname {lo} {lo}" in out.stdout, out.stdout
        session: Any = embedded_owner().manager.get("audit")
        status = session.status()
        ranks = {r["rank"]: r["pid"] for r in status["ranks"]}
        agent = status["nodes"][0]["agent_pid"]
        store = master_port(status)
        # ipykernel's IOPub pipe: a 127.0.0.1 port that carries output of forked children,
        # accepted only with a random token the kernel keeps (None: no such pipe)
        pipes = shell.run_line_magic("dist", "pull _jd_pipe --session audit")

        # 1. no process group yet: a rank kernel opens no TCP port of its own
        for rank, pid in ranks.items():
            have = {(s.proto, s.ip, s.port) for s in inet_listeners([psutil.Process(pid)])}
            want = {("tcp", "127.0.0.1", pipes[rank])} if pipes[rank] else set()
            if rank == 0:
                assert {s for s in have if s[2] == store}, f"no store at {store}: {have}"
                have = {s for s in have if s[2] != store}
            assert have == want, f"rank {rank} listens on {have}"
        assert inet_listeners([psutil.Process(agent)]) == []

        # 2. a process group and a collective: gloo's listeners stay on loopback
        out = run(
            "%%distributed --session audit\n"
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "t = torch.ones(1)\n"
            "dist.all_reduce(t)\n"
            "print('sum', t.item())"
        )
        assert out.ok, out.stdout + out.stderr
        assert "[ranks 0-1] sum 2.0" in out.stdout
        procs = ours_and_below(psutil.Process())
        listeners = inet_listeners(procs)
        allowed = store_listeners(embedded_owner().manager.status())
        assert (ranks[0], store) in allowed
        # the store too: it listens on the loopback address MASTER_ADDR names, not on ::
        assert exposed(listeners, set()) == []
        assert [str(s) for s in listeners if s.port == store and not s.loopback] == []
        assert [str(s) for s in listeners if s.pid == agent] == []
        for rank, pid in ranks.items():  # new since the process group: gloo's, on loopback
            gloo = [s for s in listeners if s.pid == pid and s.port not in (store, pipes[rank])]
            assert gloo and all(s.loopback for s in gloo), [str(s) for s in gloo]

        # 3. the kernels' Unix sockets, in the agent's private folder
        folders = {Path(rec.log).parent for rec in session.ranks.values()}
        assert len(folders) == 1, folders
        folder = folders.pop()
        sockets: set[str] = set()
        for rank in session.connection_info()["ranks"]:
            sockets |= kernel_sockets(rank["connection"])
        check_private_folder(folder, sockets)
        for pid in [agent, *ranks.values()]:
            outside = {p for p in unix_paths(psutil.Process(pid)) if not p.startswith("@")}
            outside -= {p for p in outside if Path(p).parent == folder}
            assert outside == set(), f"pid {pid} holds Unix sockets outside {folder}"
    finally:
        run("%dist shutdown --session audit")


# -- the server: its own port, its sessions, and authentication -----------------------------


def only_our_extension(folder: Path) -> dict[str, str]:
    """An extra config folder that turns every other server extension off, so that every
    warning the server logs is about ours; returns the environment that adds it."""
    from jupyter_core.paths import jupyter_config_path
    from jupyter_server.extension.config import ExtensionConfigManager

    enabled = ExtensionConfigManager(read_config_path=jupyter_config_path())
    names: dict[str, bool] = enabled.get_jpserver_extensions()  # type: ignore[no-untyped-call]
    others = {n: False for n in names if n != "jupyter_dist"}
    folder.mkdir(parents=True, exist_ok=True)
    config = {"ServerApp": {"jpserver_extensions": others}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(config))
    extra = os.environ.get("JUPYTER_CONFIG_PATH")
    return {"JUPYTER_CONFIG_PATH": os.pathsep.join(filter(None, [str(folder), extra]))}


def has_auth_gate() -> bool:
    """jupyter_server >= 2.13: ``allow_unauthenticated_access`` and its handler checks."""
    from jupyter_server.serverapp import ServerApp

    return ServerApp.class_traits().get("allow_unauthenticated_access") is not None


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with only our extension, refusing every request to a handler that does
    not require authentication (``allow_unauthenticated_access=False``)."""
    if not has_auth_gate():
        pytest.skip("jupyter_server < 2.13 has no allow_unauthenticated_access")
    root = tmp_path_factory.mktemp("locked")
    running = start_server(
        root,
        root / "config",
        args=("--ServerApp.allow_unauthenticated_access=False",),
        extra_env=only_our_extension(root / "only-ours"),
    )
    yield running
    stop_server(running)


def server_log(server: Server) -> str:
    return (server.runtime_dir.parent / "server.log").read_text(errors="replace")


_AUTH_WORDS = re.compile(
    r"JupyterServerAuthWarning|allow_unauthenticated|ws_authenticated|web\.authenticated"
    r"|without authentication|not authenticated|authenticat\w* (?:failed|missing)"
    r"|Couldn't authenticate",
    re.IGNORECASE,
)
_OUR_HANDLERS = {handler.__name__ for _, handler in API_HANDLERS}


def auth_warnings(log: str) -> list[str]:
    """Auth-related lines of a server log, with the lines listing the handlers they name.
    ``Couldn't authenticate <our handler> connection`` is jupyter_server refusing a request
    without credentials to one of our routes: that is expected, not a warning about us."""
    lines = log.splitlines()
    found = []
    for i, line in enumerate(lines):
        refused = re.search(r"Couldn't authenticate (\w+) connection", line)
        if refused and refused.group(1) in _OUR_HANDLERS:
            continue
        if _AUTH_WORDS.search(line):
            listed = []
            for more in lines[i + 1 :]:
                if not more.startswith("- "):
                    break
                listed.append(more)
            found.append("\n".join([line, *listed]))
    return found


def test_every_handler_method_is_authenticated_and_authorized() -> None:
    """Each method of each route: ``@web.authenticated`` then ``@authorized`` (what starts
    programs or hands out the kernels' keys: ``@authorized("execute")``); and the check
    jupyter_server runs on extension handlers finds nothing (while it does flag a bare one)."""
    from jupyter_server.serverapp import ServerWebApplication

    # the check jupyter_server runs in add_handlers; it does not use its `self`
    check: Any = ServerWebApplication._check_handler_auth
    needs_execute = {
        ("SessionsHandler", "post"),
        ("ConnectionHandler", "get"),
        ("StacksHandler", "post"),  # it signals the ranks
        ("TurnsHandler", "post"),  # the order of the cells others run
        ("TurnEndHandler", "post"),
        ("RankKernelHandler", "post"),  # a console runs code on the rank
        ("RankLogHandler", "get"),  # what the rank printed is the code's
        ("ProfileHandler", "put"),  # a profile decides what a start runs (python, image)
    }
    for pattern, handler in API_HANDLERS:
        methods = own_methods(handler)
        assert methods, handler
        for method in methods:
            source = inspect.getsource(getattr(handler, method.lower()))
            decorators = [
                ln.split("#")[0].strip() for ln in source.splitlines() if ln.strip().startswith("@")
            ]
            execute = (handler.__name__, method.lower()) in needs_execute
            auth = '@authorized("execute")' if execute else "@authorized"
            assert decorators[:2] == ["@web.authenticated", auth], (handler, method, decorators)
        if has_auth_gate():
            assert check(None, pattern, handler) == []

    if has_auth_gate():

        class Bare(DistHandler):
            async def get(self) -> None:
                self.reply([])

        flagged = check(None, "/bare", Bare)
        assert flagged and "GET of Bare" in flagged[0]


def own_methods(handler: type[DistHandler]) -> list[str]:
    """The HTTP methods a handler of ours implements (not the base classes')."""
    ours = handler.__mro__[: handler.__mro__.index(DistHandler)]
    return [m for m in handler.SUPPORTED_METHODS if any(m.lower() in vars(cls) for cls in ours)]


def every_route(name: str) -> list[tuple[str, str]]:
    """(method, path) for every method of every route, with ``name`` as the session and
    every alternative of the other groups (``interrupt|restart``)."""
    routes: list[tuple[str, str]] = []
    for pattern, handler in API_HANDLERS:
        paths = [re.sub(r"\(\?P<name>[^)]*\)", name, pattern)]
        paths = [re.sub(r"\(\?P<turn_id>[^)]*\)", "t1", p) for p in paths]
        paths = [re.sub(r"\(\?P<rank>[^)]*\)", "0", p) for p in paths]
        for group, choices in re.findall(r"\(\?P<(\w+)>([^)]*)\)", paths[0]):
            assert re.fullmatch(r"\w+(\|\w+)*", choices), f"cannot fill {group} in {pattern}"
            paths = [
                p.replace(f"(?P<{group}>{choices})", c) for p in paths for c in choices.split("|")
            ]
        for path in paths:
            assert re.fullmatch(pattern, path), (pattern, path)
            routes.extend((method, path) for method in own_methods(handler))
    return routes


@pytest.mark.slow
def test_server_loads_our_extension_without_auth_warnings(locked_server: Server) -> None:
    assert locked_server.call("GET", f"{API}/sessions") == (200, [])
    log = server_log(locked_server)
    assert "jupyter_dist | extension was successfully loaded" in log, log
    warnings = auth_warnings(log)
    assert warnings == [], "auth warnings in the server log:\n" + "\n".join(warnings)


def sessions(server: Server) -> dict[str, dict[str, Any]]:
    status, listed = server.call("GET", f"{API}/sessions")
    assert status == 200, listed
    return {s["name"]: s for s in listed}


#: requests without valid credentials: none; a wrong token; none but a matching XSRF cookie
#: and header, as a browser page sends, so that POST and DELETE get past the XSRF check
#: and it is authentication that refuses them
NO_CREDENTIALS: dict[str, dict[str, str]] = {
    "nothing": {},
    "wrong token": {"Authorization": "token wrong-token"},
    "xsrf only": {"Cookie": "_xsrf=0123456789abcdef", "X-XSRFToken": "0123456789abcdef"},
}


def send(
    server: Server, method: str, path: str, headers: dict[str, str], body: Any = None
) -> tuple[int, bytes]:
    """One request with exactly these headers; the status and the start of the body (an
    event stream is not read to its end)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read(4096) if reply.status != 200 else b""
    finally:
        conn.close()


@pytest.mark.slow
def test_every_route_refuses_requests_without_credentials(locked_server: Server) -> None:
    """Every method of every route answers 403 without a valid token and changes nothing;
    the same routes do answer with one (so the 403s are not a missing route's)."""
    server = locked_server
    status, created = server.call("POST", f"{API}/sessions", {"name": "guarded", "procs": 1})
    assert status == 201, created
    try:
        before = {p.pid for p in server.descendants()}
        routes = every_route("guarded")
        assert {p.removeprefix(API_PREFIX) for _, p in routes} >= {
            "/events",
            "/sessions",
            "/sessions/guarded",
            "/sessions/guarded/connection",
            "/sessions/guarded/stacks",
            "/sessions/guarded/interrupt",
            "/sessions/guarded/restart",
        }
        for what, headers in NO_CREDENTIALS.items():
            for method, path in routes:
                body = {"name": "intruder", "procs": 1} if method in ("POST", "PUT") else None
                got, reply = send(server, method, path, headers, body)
                assert got == 403, (what, method, path, got, reply)
                assert b"key" not in reply, reply
        after = sessions(server)
        assert list(after) == ["guarded"]  # not deleted, nothing started
        assert after["guarded"]["ranks"][0]["pid"] in before  # not restarted
        assert {p.pid for p in server.descendants()} == before

        token = {"Authorization": f"token {server.token}"}
        for method, path in routes:  # with the token, each route is there
            if method == "GET":
                got, reply = send(server, "GET", path, token)
                assert got == 200, (path, got, reply)
        assert server.call("POST", f"{API}/sessions/guarded/interrupt", {})[0] == 204
        warnings = auth_warnings(server_log(server))
        assert warnings == [], "auth warnings in the server log:\n" + "\n".join(warnings)
    finally:
        assert server.call("DELETE", f"{API}/sessions/guarded")[0] == 204


def execute_on_ranks(info: dict[str, Any], code: str, timeout: float = 120) -> None:
    """Run ``code`` on every rank at once, as a notebook kernel attached to the session
    does: straight to the rank kernels, with the key and sockets the server hands out."""
    from jupyter_client.blocking.client import BlockingKernelClient

    clients = []
    try:
        for rank in info["ranks"]:
            client = BlockingKernelClient()
            connection: Any = {
                **rank["connection"],
                "key": info["key"],
                "signature_scheme": info["signature_scheme"],
            }
            client.load_connection_info(connection)
            client.start_channels()
            clients.append(client)
        # every rank runs it at once: a collective is meant, which a rank refuses from a
        # client other than the notebook side unless told so
        code = f"{ALLOW}\n{code}"
        sent = [(client, client.execute(code)) for client in clients]
        deadline = time.monotonic() + timeout
        for client, msg_id in sent:
            while True:
                reply = client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        for client in clients:
            client.stop_channels()


@pytest.mark.slow
def test_a_server_session_listens_on_loopback_only(locked_server: Server) -> None:
    """The server listens only where it was told (127.0.0.1); its agent and rank kernels
    as in a notebook's own session: nothing reachable from another machine."""
    server = locked_server
    status, created = server.call("POST", f"{API}/sessions", {"name": "audit", "procs": 2})
    assert status == 201, created
    try:
        status, info = server.call("GET", f"{API}/sessions/audit/connection")
        assert status == 200, info
        execute_on_ranks(
            info,
            "import os, torch, torch.distributed as dist\n"
            "t = torch.ones(1)\n"
            "dist.all_reduce(t)\n"
            "assert t.item() == 2.0, t\n"
            f"assert os.environ['GLOO_SOCKET_IFNAME'] == {loopback_interface()!r}\n",
        )
        ranks = {r["rank"]: r["pid"] for r in created["ranks"]}
        agent = created["nodes"][0]["agent_pid"]
        store = master_port(created)

        root = psutil.Process(server.process.pid)
        listeners = inet_listeners(ours_and_below(root))
        port = int(server.url.rsplit(":", 1)[1])
        own = {(s.proto, s.ip, s.port) for s in listeners if s.pid == root.pid}
        assert own == {("tcp", "127.0.0.1", port)}, own
        allowed = store_listeners(sessions(server).values())
        assert (ranks[0], store) in allowed
        # the store too: it listens on the loopback address MASTER_ADDR names, not on ::
        assert exposed(listeners, set()) == []
        assert [str(s) for s in listeners if s.port == store and not s.loopback] == []
        assert [str(s) for s in listeners if s.pid == agent] == []

        sockets: set[str] = set()
        for rank in info["ranks"]:
            sockets |= kernel_sockets(rank["connection"])
        folders = {Path(s).parent for s in sockets}
        assert len(folders) == 1, folders
        check_private_folder(folders.pop(), sockets)
    finally:
        assert server.call("DELETE", f"{API}/sessions/audit")[0] == 204
