"""Which Jupyter server launched this kernel, so that it can own the kernel's sessions.

jupyter_client puts the launching process's pid in the kernel's ``JPY_PARENT_PID``, and a
running server describes itself in ``jpserver-<pid>.json`` in the Jupyter runtime folder
(URL and token; the file is readable by its user only). ``JUPYTER_DIST_SERVER=none``
keeps sessions in the kernel even under a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir

from jupyter_dist.common.notebook_names import relative_path, session_name_for
from jupyter_dist.common.private_files import read_private_file
from jupyter_dist.settings import SERVER_CHOICE_VAR

#: the environment variable that turns server ownership off ("none")
CHOICE_VAR = SERVER_CHOICE_VAR
#: a server's ``jpserver-PID.json`` is a few hundred bytes
MAX_SERVER_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerInfo:
    """How to reach a running Jupyter server."""

    url: str  # ends with the base URL and "/"
    token: str
    pid: int
    root_dir: str = ""

    def __str__(self) -> str:
        return f"{self.url} (pid {self.pid})"


def find_server(env: Mapping[str, str], runtime_dir: str | None = None) -> ServerInfo | None:
    """The server that started this kernel, or None (plain IPython, nbclient, tests, or
    turned off with ``JUPYTER_DIST_SERVER=none``)."""
    if env.get(CHOICE_VAR, "").strip().lower() in ("none", "off", "0", "false", "no"):
        return None
    parent = env.get("JPY_PARENT_PID", "")
    if not parent.isdigit():
        return None
    path = Path(runtime_dir or jupyter_runtime_dir()) / f"jpserver-{parent}.json"
    try:  # a FIFO named like it must not hang the kernel, nor a link or another's file lead it
        info = json.loads(read_private_file(path, MAX_SERVER_FILE_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    url = str(info.get("url") or "")
    if not url.startswith(("http://", "https://")):
        return None  # a server on a Unix socket: not reachable with a URL
    base = str(info.get("base_url") or "/")
    if not url.rstrip("/").endswith(base.rstrip("/")):
        url = url.rstrip("/") + "/" + base.strip("/")
    return ServerInfo(
        url=url.rstrip("/") + "/",
        token=str(info.get("token") or ""),
        pid=int(info.get("pid") or parent),
        root_dir=str(info.get("root_dir") or ""),
    )


def notebook_session_name(env: Mapping[str, str], root_dir: str = "") -> str | None:
    """A default session name for the notebook this kernel runs, from the path the server
    gave it (``JPY_SESSION_NAME``, relative to the server's ``root_dir`` when it is an
    absolute path): `common.notebook_names.session_name_for`. The server may give the
    notebook another (``GET /notebook``), when another notebook's session holds this one."""
    return session_name_for(env.get("JPY_SESSION_NAME", ""), root_dir)


def notebook_path(env: Mapping[str, str], root_dir: str = "") -> str:
    """The notebook this kernel runs, as the server's users see it (relative to its
    ``root_dir``); "" when the server did not say."""
    return relative_path(env.get("JPY_SESSION_NAME", ""), root_dir)


def kernel_id(pid: int) -> str:
    """This kernel's id on its server (from its connection file's name,
    ``kernel-ID.json``), or ``pid-PID`` outside ipykernel."""
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).name
    except Exception:
        return f"pid-{pid}"
    found = re.fullmatch(r"kernel-([A-Za-z0-9_.-]{1,64})\.json", name)
    return found.group(1) if found else f"pid-{pid}"
