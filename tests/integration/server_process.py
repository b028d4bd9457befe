"""A real `jupyter server` process with jupyter_dist enabled and token auth on, for tests."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from jupyter_dist.common.ports import free_port

API = "/jupyter-dist/api/v1"
#: seconds a server may take to answer after it was started
START_S = 180


@dataclass
class Server:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    runtime_dir: Path

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = "default"
    ) -> tuple[int, Any]:
        token = self.token if token == "default" else token
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if token is not None:
            request.add_header("Authorization", f"token {token}")
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                raw = reply.read()
                return reply.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw else None

    def descendants(self) -> list[psutil.Process]:
        """Our agents and ranks under the server (other extensions may start helpers)."""
        found = []
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and "jupyter_dist" in " ".join(
                    proc.cmdline()
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found


def start_server(
    root: Path,
    config_dir: Path,
    extension: bool = True,
    args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    argv_prefix: Sequence[str] = (),
    ip: str = "127.0.0.1",
    base_env: Mapping[str, str] | None = None,
) -> Server:
    """A server in ``root``, with its own config and runtime folders; its kernels
    inherit them, so they find the server as they would anywhere.

    ``argv_prefix`` runs it under a wrapper that execs it (``ip netns exec NS``: the
    server's pid stays the one started), ``ip`` is where it listens (an address of that
    namespace the tests reach), ``base_env`` the environment ``extra_env`` goes on top of
    (this process's by default)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "ServerApp": {"jpserver_extensions": {"jupyter_dist": extension}},
        # the File ID service's ids (renames keep them) in this server's memory, not in a
        # database file the user's other servers and the other tests' share
        "BaseFileIdManager": {"db_path": ":memory:"},
    }
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
    token, port = secrets.token_hex(16), free_port()
    runtime_dir = root / "runtime"
    env = {
        **(os.environ if base_env is None else base_env),
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_RUNTIME_DIR": str(runtime_dir),
    }
    env.pop("JUPYTER_DIST_SERVER", None)
    env.update(extra_env or {})
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [*argv_prefix, sys.executable, "-m", "jupyter_server", "--no-browser", f"--ip={ip}",
         f"--port={port}", f"--IdentityProvider.token={token}", "--allow-root",
         f"--ServerApp.root_dir={root}", *args],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )  # fmt: skip
    server = Server(f"http://{ip}:{port}", token, process, runtime_dir)
    # a server starting beside other work may take a minute to import its extensions:
    # waited for while it runs, up to a limit that only a hung one reaches
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and process.poll() is None:
        # the port it took: another than the one asked for where that was taken meanwhile
        # (by a test running beside this one); it says so in its jpserver-PID.json
        server.url = f"http://{ip}:{listening_port(runtime_dir, process.pid, port)}"
        try:
            if server.call("GET", "/api/status")[0] == 200:
                return server
        except OSError:
            pass
        time.sleep(0.2)
    ended = process.poll()
    process.kill()
    process.wait()
    said = f"exited with status {ended}" if ended is not None else f"not up in {START_S} s"
    raise RuntimeError(f"jupyter server {said}:\n{(root / 'server.log').read_text()}")


def listening_port(runtime_dir: Path, pid: int, asked: int) -> int:
    """The port in the server's ``jpserver-PID.json``; ``asked`` until it wrote one."""
    try:
        return int(json.loads((runtime_dir / f"jpserver-{pid}.json").read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return asked


def stop_server(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@contextlib.contextmanager
def serving_text_output(root: Path, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """A server in ``root`` whose notebook kernels draw cells as text (and get ``env``,
    as the server does), for a module's tests; stopped after them, it must leave none of
    its processes behind."""
    extra_env = {"JUPYTER_DIST_OUTPUT": "text", **(env or {})}
    running = start_server(root, root / "config", extra_env=extra_env)
    yield running
    ours = running.descendants()
    stop_server(running)
    assert not [p for p in ours if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def start_server_in(root: Path, runtime_dir: Path, args: tuple[str, ...] = ()) -> Server:
    """A server like `start_server`'s, in ``root`` but with ``runtime_dir`` as its runtime
    folder, which several servers may share (as they do by default on one machine)."""
    server = start_server(
        root, root / "config", args=args, extra_env={"JUPYTER_RUNTIME_DIR": str(runtime_dir)}
    )
    server.runtime_dir = runtime_dir
    return server


def kill_server(server: Server) -> None:
    """SIGKILL: the server gets no chance to stop its sessions."""
    server.process.kill()
    server.process.wait()


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[tuple[int, list[str]]]:
    """Every process under ``pid``: its pid and command line (those gone meanwhile left out)."""
    found = []
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found.append((proc.pid, proc.cmdline()))
    return found


def server_kernels(server: Server) -> list[int]:
    """The pids of the notebook kernels ``server`` started (its children, not a session's)."""
    return [pid for pid, argv in descendants(server.process.pid) if "ipykernel" in " ".join(argv)]


def stop_servers(started: Sequence[Server]) -> None:
    """Stop each server still running, and kill every notebook kernel it started."""
    for server in started:
        kernels = server_kernels(server)
        if server.process.poll() is None:
            stop_server(server)
        for pid in kernels:
            kill_pid(pid)


def wait_for(check: Any, timeout: float, what: str, poll: float = 1.0) -> Any:
    """``check()``'s first true value, asked every ``poll`` s; AssertionError naming ``what``
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)
