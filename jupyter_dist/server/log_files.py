"""The rank logs of notebook cells, served to the browser: the cell view's "logs" link.

A notebook kernel writes every line each rank printed in a cell to
``<tmp>/jupyter_dist-logs-<pid>-<x>/<session>/cell-<n>/rank-<r>.log`` (`display.rank_logs`),
on the machine of the Jupyter server that launched it. That folder is outside the server's
root, so JupyterLab's file browser cannot open it; this handler serves it under
``<base URL>/jupyter-dist/logs/...``: a folder as a list of links, a log as plain text, read
in chunks off the event loop.

Only those folders are served, and only what they were made with: each path part must have
the shape the notebook side gives it (no ``..``, no other names), every part must be this
user's and no symbolic link, and the user must be logged in and allowed to execute (what
the ranks printed is as much the code's as its output in the notebook).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import stat
import tempfile
from pathlib import Path
from urllib.parse import quote

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from tornado import web

from jupyter_dist.common.wire_names import LOGS_FOLDER_PREFIX, LOGS_ROUTE
from jupyter_dist.server.handlers import AUTH_RESOURCE

#: bytes read from a log per step (the loop serves others between steps)
CHUNK_BYTES = 256 * 1024
#: a folder lists at most this many entries
MAX_ENTRIES = 2000

#: the shape of each path part, by depth: the process's folder, the session, the cell, the log
_PARTS = (
    re.compile(rf"{re.escape(LOGS_FOLDER_PREFIX)}\d{{1,10}}-[A-Za-z0-9_]{{1,64}}"),
    re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"),
    re.compile(r"cell-\d{1,9}"),
    re.compile(r"rank-\d{1,7}\.log"),
)


def logs_base() -> Path:
    """The folder the notebook kernels put their log folders in (theirs and ours agree
    unless a kernel was given another TMPDIR)."""
    return Path(tempfile.gettempdir())


def resolve(path: str, base: Path | None = None) -> Path:
    """The file or folder ``path`` names under `logs_base`, checked part by part; raises
    404 for anything else (a wrong shape, a link, another user's, nothing there)."""
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > len(_PARTS):
        raise web.HTTPError(404, "no such log")
    target = base or logs_base()
    for depth, part in enumerate(parts):
        if not _PARTS[depth].fullmatch(part) or part in (".", ".."):
            raise web.HTTPError(404, "no such log")
        target = target / part
        try:
            info = os.lstat(target)
        except OSError:
            raise web.HTTPError(404, "no such log") from None
        last = depth == len(parts) - 1
        is_file = stat.S_ISREG(info.st_mode)
        if info.st_uid != os.getuid() or not (stat.S_ISDIR(info.st_mode) or (last and is_file)):
            raise web.HTTPError(404, "no such log")
        if is_file != (depth == len(_PARTS) - 1):
            raise web.HTTPError(404, "no such log")
    return target


def listing(folder: Path, title: str) -> str:
    """A folder as an HTML page of links (folders first), at most `MAX_ENTRIES`."""
    entries: list[tuple[int, str, str]] = []
    with os.scandir(folder) as found:
        for entry in found:
            if len(entries) >= MAX_ENTRIES:
                break
            if entry.is_symlink():
                continue
            if entry.is_dir():
                entries.append((0, entry.name + "/", ""))
            elif entry.is_file():
                entries.append((1, entry.name, f"{entry.stat().st_size:,} bytes"))
    rows = "".join(
        f'<li><a href="{quote(name)}">{html.escape(name)}</a> {html.escape(size)}</li>'
        for _kind, name, size in sorted(entries, key=_natural)
    )
    return (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<h3>{html.escape(title)}</h3><ul>{rows or '<li>(empty)</li>'}</ul>"
    )


def _natural(entry: tuple[int, str, str]) -> tuple[int, list[object]]:
    """rank-2.log before rank-10.log."""
    return entry[0], [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", entry[1])]


class LogsHandler(JupyterHandler):
    """``GET <LOGS_ROUTE>/<folder>/[<session>/[cell-<n>/[rank-<r>.log]]]``."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    async def get(self, path: str) -> None:
        target = await asyncio.to_thread(resolve, path)
        if target.is_dir():
            if not self.request.path.endswith("/"):  # so that the links are relative to it
                self.redirect(self.request.path + "/")
                return
            title = f"jupyter_dist logs: {path.strip('/')}"
            page = await asyncio.to_thread(listing, target, title)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.finish(page)
            return
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        fd = await asyncio.to_thread(os.open, target, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
                self.write(chunk)
                await self.flush()
        self.finish()


LOG_HANDLERS = [(rf"{LOGS_ROUTE}/(?P<path>.*)", LogsHandler)]
