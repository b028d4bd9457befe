"""The cell logs the server serves (the cell view's "logs" link): only the notebook
kernels' log folders, only to a logged-in user, in a real Jupyter server in this process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the plugin's fixtures, for this module only (see test_handlers.py)
from pytest_jupyter.jupyter_core import *  # noqa: F403
from pytest_jupyter.jupyter_server import *  # noqa: F403
from pytest_jupyter.pytest_tornasync import *  # noqa: F403
from tornado import web
from tornado.httpclient import HTTPClientError

from jupyter_dist.common.wire_names import LOGS_ROUTE
from jupyter_dist.server import log_files
from jupyter_dist.server_client.discovery import ServerInfo
from jupyter_dist.server_client.log_links import log_folder_url

FOLDER = "jupyter_dist-logs-4242-abc_12"


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook kernel's log folder with one cell of two ranks, as the cell view
    leaves it, in a temporary folder the server serves."""
    cell = tmp_path / FOLDER / "train" / "cell-3"
    cell.mkdir(parents=True)
    for rank in (0, 1, 10):
        (cell / f"rank-{rank}.log").write_text(f"rank {rank} says hello\n" * 3)
    monkeypatch.setattr(log_files, "logs_base", lambda: tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "path",
    [
        "",
        "..",
        f"{FOLDER}/../{FOLDER}",
        "other-folder",
        f"{FOLDER}/train/cell-3/rank-0.txt",
        f"{FOLDER}/train/cell-3/rank-0.log/x",
        f"{FOLDER}/train/cell-3/rank-9.log",  # not there
        f"{FOLDER}/train/cell-x",
    ],
)
def test_only_the_shape_the_notebook_writes_resolves(logs: Path, path: str) -> None:
    with pytest.raises(web.HTTPError) as err:
        log_files.resolve(path)
    assert err.value.status_code == 404


def test_a_log_and_its_folders_resolve_but_not_through_a_link(logs: Path) -> None:
    assert log_files.resolve(f"{FOLDER}/train/cell-3/rank-1.log").read_text().startswith("rank 1")
    assert log_files.resolve(f"{FOLDER}/train/").is_dir()
    secret = logs / "secret.txt"
    secret.write_text("not a log")
    os.symlink(secret, logs / FOLDER / "train" / "cell-3" / "rank-5.log")
    os.symlink(logs / FOLDER, logs / "jupyter_dist-logs-1-link")
    for path in (f"{FOLDER}/train/cell-3/rank-5.log", "jupyter_dist-logs-1-link/train"):
        with pytest.raises(web.HTTPError):
            log_files.resolve(path)


def test_the_kernel_links_to_where_the_server_serves_its_folder(tmp_path: Path) -> None:
    server = ServerInfo("http://127.0.0.1:8888/user/ada/", "token", 1)
    folder = tmp_path / FOLDER / "train" / "cell-3"
    url = log_folder_url(server, folder, base=tmp_path)
    assert url == f"/user/ada{LOGS_ROUTE}/{FOLDER}/train/cell-3/"
    assert log_folder_url(server, tmp_path / "elsewhere", base=tmp_path) is None


@pytest.fixture
def jp_asyncio_loop() -> Iterator[asyncio.AbstractEventLoop]:
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


def fetch(jp_fetch: Any, loop: asyncio.AbstractEventLoop, path: str, **kwargs: Any) -> Any:
    asyncio.set_event_loop(loop)
    parts = [p for p in f"{LOGS_ROUTE}/{path}".split("/") if p]
    if path.endswith("/"):
        parts[-1] += "/"
    return loop.run_until_complete(jp_fetch(*parts, method="GET", **kwargs))


def test_the_server_serves_a_cell_log_and_lists_its_folder(
    jp_fetch: Any, jp_asyncio_loop: asyncio.AbstractEventLoop, logs: Path
) -> None:
    reply = fetch(jp_fetch, jp_asyncio_loop, f"{FOLDER}/train/cell-3/rank-1.log")
    assert reply.code == 200
    assert reply.headers["Content-Type"].startswith("text/plain")
    assert reply.body.decode() == "rank 1 says hello\n" * 3
    page = fetch(jp_fetch, jp_asyncio_loop, f"{FOLDER}/train/cell-3/").body.decode()
    links = [part.split('"')[0] for part in page.split('href="')[1:]]
    assert links == ["rank-0.log", "rank-1.log", "rank-10.log"]  # natural order


def test_cell_logs_need_a_logged_in_user(
    jp_fetch: Any, jp_asyncio_loop: asyncio.AbstractEventLoop, logs: Path
) -> None:
    with pytest.raises(HTTPClientError) as err:
        fetch(
            jp_fetch,
            jp_asyncio_loop,
            f"{FOLDER}/train/cell-3/rank-1.log",
            headers={"Authorization": ""},
            follow_redirects=False,
        )
    assert err.value.code in (302, 403)
    assert err.value.response is not None
    assert b"hello" not in (err.value.response.body or b"")


def test_anything_else_is_not_found(
    jp_fetch: Any, jp_asyncio_loop: asyncio.AbstractEventLoop, logs: Path
) -> None:
    for path in ("..%2F..%2Fetc%2Fpasswd", f"{FOLDER}/train/cell-3/rank-7.log"):
        with pytest.raises(HTTPClientError) as err:
            fetch(jp_fetch, jp_asyncio_loop, path)
        assert err.value.code == 404, path
