"""What the REST API does with what it is sent, in a real Jupyter server in this process
with sessions on in-memory agents (as tests/unit/test_handlers.py): bad values are 400s
naming them and start nothing, ``env`` and ``cwd`` mean what the API says, error messages
come back as written, ``/stacks`` needs the ``execute`` permission. Also the notebook
side: what a kernel sends, and how long push and pull wait.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

# the plugin's fixtures, for this module only (as in test_handlers)
from jupyter_server.auth.authorizer import Authorizer
from pytest_jupyter.jupyter_core import *  # noqa: F403
from pytest_jupyter.jupyter_server import *  # noqa: F403
from pytest_jupyter.pytest_tornasync import *  # noqa: F403

from jupyter_dist.common import pickling
from jupyter_dist.common.spec import MAX_WORLD_SIZE, SessionSpec, ShapeRequest
from jupyter_dist.control.cell_queue import Sender
from jupyter_dist.errors import PullError, PushError
from jupyter_dist.server_client.server_sessions import ServerSessions
from tests.unit.fake_agent import FakeCluster
from tests.unit.test_control_plane_fake import KernelStub, kernels, run, session_on
from tests.unit.test_handlers import call, cluster, jp_asyncio_loop

__all__ = ["call", "cluster", "jp_asyncio_loop", "kernels"]
#: a request with this header is made by a user allowed to read and write, not execute
READER = {"X-Test-Role": "reader"}


class RoleAuthorizer(Authorizer):
    """Everything for the token's user, but no ``execute`` for a request marked reader."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        reader = handler.request.headers.get("X-Test-Role") == "reader"
        return not (reader and action == "execute")


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_dist": True},
            "authorizer_class": RoleAuthorizer,
        }
    }


Call = Callable[..., tuple[int, Any]]


def nothing_started(call: Call, cluster: FakeCluster) -> None:
    assert call("GET", "sessions") == (200, [])
    assert cluster.agents == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"procs": 10**12}, f"at most {MAX_WORLD_SIZE} ranks"),
        ({"procs": 5000}, "ranks may run on a node"),
        ({"nodes": 10**12, "procs": 1}, "a session takes at most 1024 nodes"),
        ({"hosts": [{"name": "a", "port": 99999}], "procs": 1}, "port 99999 of 'a'"),
        ({"hosts": [{"name": "a", "port": 0}], "procs": 1}, "port 0 of 'a'"),
        ({"hosts": [{"name": "a", "slots": -3}]}, "slots -3 of 'a'"),
        ({"hosts": [{"name": "a", "user": "-oX"}], "procs": 1}, "user '-oX' starts with '-'"),
        (
            {"hosts": [{"name": "a", "slots": 10**12}]},
            "slots 1000000000000 of 'a': expected a whole number of at least 1 and at most 65536",
        ),
        ({"hosts": "a", "python": "--version", "procs": 1}, "starts with '-'"),
        ({"procs": 1, "python": "-c"}, "python '-c' starts with '-'"),
        ({"procs": 1, "cwd": "/no/such/folder"}, "cwd '/no/such/folder': no such folder"),
        ({"procs": 1, "ssh_config": "/dev/zero"}, "ssh_config '/dev/zero': not a regular file"),
        ({"procs": 1, "env": {"A=B": "x"}}, "env: 'A=B' is not a variable name"),
        ({"procs": 1, "env": {"A": 1}}, "env: expected an object of strings"),
    ],
)
def test_bad_bodies_are_400s_naming_the_value_and_start_nothing(
    call: Call, cluster: FakeCluster, kernels: KernelStub, body: dict[str, Any], fragment: str
) -> None:
    began = time.monotonic()
    code, reply = call("POST", "sessions", {"name": "bad", **body})
    assert (code, reply["reason"]) == (400, "SpecError"), reply
    assert fragment in reply["message"]
    assert time.monotonic() - began < 5
    nothing_started(call, cluster)


def test_a_body_over_a_mebibyte_is_refused_unread(call: Call, cluster: FakeCluster) -> None:
    code, reply = call("POST", "sessions", {"name": "big", "env": {"A": "x" * (1 << 20)}})
    assert code == 400 and "expected at most 1048576" in reply["message"], reply
    nothing_started(call, cluster)


def test_env_reaches_every_rank_and_the_session_reads_its_knobs_there(
    call: Call, cluster: FakeCluster, kernels: KernelStub, tmp_path: Path
) -> None:
    env = {"MY_SETTING": "on", "OMP_NUM_THREADS": "3"}
    code, status = call(
        "POST", "sessions", {"name": "e", "procs": 2, "env": env, "cwd": str(tmp_path)}
    )
    assert code == 201, status
    (agent,) = cluster.agents
    assert agent.env["OMP_NUM_THREADS"] == "3"  # read from env, not the server's default
    for rank in agent.spawned:
        assert rank.env["MY_SETTING"] == "on"
        assert rank.env["OMP_NUM_THREADS"] == "3"
        assert rank.env["RANK"] == str(rank.rank)  # the session's own variables win
        assert rank.cwd == str(tmp_path)
    assert call("DELETE", "sessions/e")[0] == 204


def test_a_rank_variable_cannot_replace_the_sessions_own(
    call: Call, cluster: FakeCluster, kernels: KernelStub
) -> None:
    code, status = call("POST", "sessions", {"name": "e", "procs": 2, "env": {"RANK": "7"}})
    assert code == 201, status
    assert sorted(r.env["RANK"] for r in cluster.agents[0].spawned) == ["0", "1"]
    assert call("DELETE", "sessions/e")[0] == 204


def test_error_messages_come_back_as_written(call: Call, cluster: FakeCluster) -> None:
    code, reply = call("GET", "sessions/nope")
    assert code == 404
    assert "a %%distributed cell starts one" in reply["message"]  # not %%%%distributed
    assert reply["reason"] == "UnknownSession"


def test_stacks_is_a_post_that_needs_execute(
    call: Call, cluster: FakeCluster, kernels: KernelStub
) -> None:
    assert call("POST", "sessions", {"name": "s", "procs": 2})[0] == 201
    try:
        code, _ = call("POST", "sessions/s/stacks", {}, headers=READER)
        assert code == 403  # read (and write) is not enough: it signals the ranks
        assert call("GET", "sessions/s/stacks")[0] == 405
        stacks = [c for a in cluster.agents for c in a.commands if c["op"] == "stacks"]
        assert stacks == []  # no rank was signalled

        code, reply = call("POST", "sessions/s/stacks", {}, params={"ranks": "1"})
        assert code == 200, reply
        assert list(reply["stacks"]) == ["1"]
        for ranks, fragment in (
            ("0-30000000", "rank 30000000 does not exist; the session has ranks 0-1"),
            ("9" * 5000, "does not exist"),
            ("x", "'x' is not a rank or a range"),
        ):
            began = time.monotonic()
            code, reply = call("POST", "sessions/s/stacks", {}, params={"ranks": ranks})
            assert (code, reply["reason"]) == (400, "SpecError"), reply
            assert fragment in reply["message"]
            assert time.monotonic() - began < 2
    finally:
        assert call("DELETE", "sessions/s")[0] == 204


# -- the notebook's side -------------------------------------------------------------------------
def test_a_kernel_sends_only_the_variables_the_session_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[str, Any]] = []

    class Client:
        server = SimpleNamespace(url="http://127.0.0.1:1/", root_dir="/")
        sender = Sender("train.ipynb", "k1")

        async def create(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            sent.append(json.loads(json.dumps(body)))
            return {}, True

    async def nothing(*_args: Any) -> Any:
        return None

    environ = {
        "AWS_SECRET_ACCESS_KEY": "secret",
        "JUPYTERHUB_API_TOKEN": "token",
        "PATH": "/usr/bin",
        "OMP_NUM_THREADS": "4",
        "GLOO_SOCKET_IFNAME": "eth1",
    }
    sessions = ServerSessions(Client(), environ)  # type: ignore[arg-type]
    monkeypatch.setattr(sessions, "_ensure_events", nothing)
    monkeypatch.setattr(sessions, "_attach", nothing)
    environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # read when the session starts
    asyncio.run(sessions.get_or_start("s", ShapeRequest(procs=1)))
    assert sent[0]["env"] == {
        "OMP_NUM_THREADS": "4",
        "GLOO_SOCKET_IFNAME": "eth1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    }


@pytest.fixture
def ready(kernels: KernelStub) -> Iterator[Callable[[], Any]]:
    """Starts a two-rank session whose kernels never answer a push or pull."""
    yield lambda: session_on(FakeCluster(), SessionSpec(name="quiet", procs_per_node=2))


@pytest.mark.parametrize("op", ["push", "pull"])
def test_push_and_pull_give_up_after_their_timeout(ready: Callable[[], Any], op: str) -> None:
    async def main() -> str:
        session = ready()
        await session.start()
        try:
            began = time.monotonic()
            with pytest.raises(PushError) as err:
                if op == "push":
                    await session.push(pickling.dump({"x": 1}), None, 0.3)
                else:
                    await session.pull("x", [1], 0.3)
            assert time.monotonic() - began < 3
            assert type(err.value) is (PushError if op == "push" else PullError)
            assert all(not rec.client._comm_waiters for rec in session.ranks.values())
            return str(err.value)
        finally:
            await session.shutdown()

    message = run(main(), timeout=20)
    if op == "push":
        assert message.startswith("push in session 'quiet': ranks 0-1 of ranks 0-1 did not")
    else:
        assert message.startswith("pull 'x' in session 'quiet': rank 1 of rank 1 did not")
    assert "within 0.3 s" in message
