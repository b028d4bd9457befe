"""Finding the server that launched a kernel, and the JSON forms sent to it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.ray_options import RaySpec
from jupyter_dist.common.spec import (
    SessionSpec,
    ShapeRequest,
    check_session_name,
    validate_request,
)
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import shape_from_json
from jupyter_dist.server_client.discovery import find_server, notebook_session_name
from jupyter_dist.server_client.rest_client import SSEParser


def sha(path: str) -> str:
    """The tag a notebook path gives its session name."""
    return hashlib.sha256(path.encode()).hexdigest()[:6]


def write_info(runtime: Path, pid: int, **info: Any) -> None:
    runtime.mkdir(exist_ok=True)
    (runtime / f"jpserver-{pid}.json").write_text(json.dumps({"pid": pid, **info}))


def test_the_parent_servers_runtime_file_is_found(tmp_path: Path) -> None:
    write_info(tmp_path, 4242, url="http://localhost:8888/lab/", base_url="/lab/", token="t0k")
    write_info(tmp_path, 99, url="http://localhost:9999/", base_url="/", token="other")
    found = find_server({"JPY_PARENT_PID": "4242"}, str(tmp_path))
    assert found is not None
    assert (found.url, found.token, found.pid) == ("http://localhost:8888/lab/", "t0k", 4242)


@pytest.mark.parametrize(
    "env",
    [
        {},  # plain IPython
        {"JPY_PARENT_PID": "777"},  # launched by something that is not a server (nbclient)
        {"JPY_PARENT_PID": "4242", "JUPYTER_DIST_SERVER": "none"},  # turned off
    ],
)
def test_no_server_means_none(tmp_path: Path, env: dict[str, str]) -> None:
    write_info(tmp_path, 4242, url="http://localhost:8888/", token="t")
    assert find_server(env, str(tmp_path)) is None


def test_a_server_on_a_unix_socket_is_not_used(tmp_path: Path) -> None:
    write_info(tmp_path, 5, url="http+unix://%2Ftmp%2Fjp.sock/", sock="/tmp/jp.sock")
    assert find_server({"JPY_PARENT_PID": "5"}, str(tmp_path)) is None


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("train.ipynb", "train-" + sha("train.ipynb")),
        (
            "runs/exp 1/Train (copy).ipynb",
            "exp-1-Train-copy-" + sha("runs/exp 1/Train (copy).ipynb"),
        ),
        ("/abs/.hidden.ipynb", "abs-.hidden-" + sha("/abs/.hidden.ipynb")),
        ("a/runs/train.ipynb", "runs-train-93cf1a"),
        ("___.ipynb", sha("___.ipynb")),
        ("", None),
    ],
)
def test_notebook_session_names(path: str, name: str | None) -> None:
    assert notebook_session_name({"JPY_SESSION_NAME": path} if path else {}) == name
    if name is not None:
        assert check_session_name(name) == name


def test_notebooks_of_the_same_name_in_different_folders_get_their_own_sessions() -> None:
    """``a/runs/train.ipynb`` and ``b/runs/train.ipynb`` once both became ``runs-train``
    and shared ranks and variables without a word."""
    names = {
        notebook_session_name({"JPY_SESSION_NAME": path})
        for path in ("a/runs/train.ipynb", "b/runs/train.ipynb", "runs/train.ipynb")
    }
    assert len(names) == 3
    assert all(n is not None and n.startswith("runs-train-") for n in names), names


def test_a_long_notebook_path_still_makes_a_valid_name() -> None:
    name = notebook_session_name({"JPY_SESSION_NAME": "x" * 200 + "/" + "y" * 200 + ".ipynb"})
    assert name is not None and len(name) == 64 and check_session_name(name) == name


def test_sse_events_are_parsed_across_chunks_and_comments_skipped() -> None:
    seen: list[tuple[str, Any]] = []
    parser = SSEParser(lambda kind, data: seen.append((kind, data)))
    raw = b': keep-alive\n\nevent: session\ndata: {"a": 1}\n\nevent: removed\ndata: {"name"'
    parser.feed(raw[:20])
    parser.feed(raw[20:])
    parser.feed(b': "x"}\n\n')
    assert seen == [("session", {"a": 1}), ("removed", {"name": "x"})]


def test_a_shape_request_survives_the_trip_through_json() -> None:
    hosts = (HostSpec("a", "alice", 2222, 4), HostSpec("b", slots=2))
    request = ShapeRequest(gpus=(4, 2), hosts=hosts, python="/opt/py", launcher="slurm")
    body = json.loads(json.dumps({"name": "s1", **request.to_json(), "cwd": "/w"}))
    parsed = shape_from_json(body)
    assert (parsed.name, parsed.shape, parsed.cwd, parsed.env) == ("s1", request, "/w", None)


def test_a_ray_request_survives_the_trip_through_json() -> None:
    """What the magic sends for ``--ray ...`` is what the server parses: the ``ray``
    object goes through whole."""
    ray = RaySpec(
        "head:6379", "PACK", '{"pip": ["jupyter_dist"]}', cpus=2, gpus=0, resources="TPU=1"
    )
    request = ShapeRequest(nodes=2, procs=2, launcher="ray", ray=ray)
    sent = json.loads(json.dumps({"name": "r", **request.to_json()}))
    assert sent["ray"] == {
        "address": "head:6379", "strategy": "PACK", "runtime_env": '{"pip": ["jupyter_dist"]}',
        "cpus": 2, "gpus": 0, "timeout": None, "resources": "TPU=1",
    }  # fmt: skip
    assert shape_from_json(sent).shape == request
    # the sidebar's form leaves the address and the GPUs unsaid, and may write the
    # strategy in lower case
    form = {"nodes": 2, "procs": 1, "launcher": "ray", "ray": {"strategy": "spread"}}
    assert shape_from_json(form).shape.ray == RaySpec(strategy="SPREAD")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"gpus": [2, "x"]}, "gpus: [2, 'x'] is not a count or a list of counts"),
        ({"hosts": [{"name": "a", "port": "22"}]}, "port '22' of 'a'"),
        ({"env": {"A": 1}}, "env: expected an object of strings"),
        ({"launcher": "pbs", "hosts": "a"}, "launcher 'pbs'"),
    ],
)
def test_bad_bodies_name_the_value(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_request(shape_from_json(body).shape)
    assert fragment in str(err.value)


def test_a_session_spec_survives_the_trip_through_json() -> None:
    spec = SessionSpec(
        "s", 2, 4, "cuda", "nccl", hosts=(HostSpec("a", port=22), HostSpec("b")),
        node_procs=(4, 2), launcher="ssh",
    )  # fmt: skip
    assert SessionSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_absolute_notebook_paths_are_named_from_the_server_root() -> None:
    env = {"JPY_SESSION_NAME": "/srv/lab/exp/train.ipynb"}
    relative = notebook_session_name({"JPY_SESSION_NAME": "exp/train.ipynb"}, "/srv/lab")
    assert (
        notebook_session_name(env, "/srv/lab") == relative == "exp-train-" + sha("exp/train.ipynb")
    )
    t = {"JPY_SESSION_NAME": "/srv/lab/t.ipynb"}
    assert notebook_session_name(t, "/srv/lab") == "t-" + sha("t.ipynb")
    assert notebook_session_name(env, "/elsewhere") == "exp-train-" + sha(
        "/srv/lab/exp/train.ipynb"
    )


def test_a_fifo_or_link_named_like_the_servers_file_is_not_read(tmp_path: Path) -> None:
    """The runtime folder may be shared: a FIFO there must not hang the kernel's first
    cell, nor a link lead it to a file that is not the server's."""
    import os
    import threading

    fifo = tmp_path / "jpserver-4242.json"
    os.mkfifo(fifo)
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.append(find_server({"JPY_PARENT_PID": "4242"}, str(tmp_path))),
        daemon=True,
    )
    reader.start()
    reader.join(20)
    if reader.is_alive():  # release it before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        raise AssertionError("find_server waited on a FIFO")
    assert found == [None]

    write_info(tmp_path / "elsewhere", 7, url="http://localhost:8888/", token="t")
    (tmp_path / "jpserver-7.json").symlink_to(tmp_path / "elsewhere" / "jpserver-7.json")
    assert find_server({"JPY_PARENT_PID": "7"}, str(tmp_path)) is None
