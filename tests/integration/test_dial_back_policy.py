"""What a dial-back node (``python -m jupyter_dist.node.dial_back``) lets the session's
owner do over its connection: run the agent and reach the agent's sockets, nothing else.
Its credentials are secret: a file others may read is refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from jupyter_dist.control.launchers.dial_back import DialBackListener
from jupyter_dist.errors import AgentError
from tests.async_run import in_loop

pytestmark = pytest.mark.slow
NODE = [sys.executable, "-m", "jupyter_dist.node.dial_back"]


def dial(listener: DialBackListener, index: int = 0) -> subprocess.Popen[str]:
    """A node process dialling ``listener`` as node ``index``, with its credentials on stdin."""
    node = subprocess.Popen(
        [*NODE, listener.address, "--credentials", "-", "--retry", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert node.stdin is not None
    node.stdin.write(listener.credentials(index))
    node.stdin.close()
    return node


@contextlib.asynccontextmanager
async def dialled() -> AsyncIterator[tuple[DialBackListener, asyncssh.SSHClientConnection]]:
    """A listener on the loopback interface and the connection its one node made."""
    listener = DialBackListener(1, "127.0.0.1", connect_timeout=60)
    await listener.start()
    node = dial(listener)
    try:
        conn = await listener.connection(0)
        try:
            yield listener, conn
        finally:
            conn.close()
    finally:
        await listener.close()
        node.kill()
        node.wait()


@in_loop
async def test_the_node_runs_only_the_agent_and_forwards_only_to_its_sockets(
    tmp_path: Path,
) -> None:
    async with dialled() as (_, conn):
        shell = await conn.run("id; echo ran", timeout=30)
        assert shell.exit_status == 2 and "ran" not in str(shell.stdout)
        assert "only the agent runs here" in str(shell.stderr)
        bad = await conn.run(json.dumps({"session": "x; id", "env": {}}), timeout=30)
        assert bad.exit_status == 2 and "session 'x; id'" in str(bad.stderr)
        with pytest.raises(asyncssh.Error):
            await conn.run(subsystem="sftp", timeout=30)
        # a Unix socket of this user's that is no agent's: not reachable
        other = tmp_path / "other.sock"
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(other))
        server.listen()
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_unix_connection(str(other))
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_connection("127.0.0.1", 22)
        with pytest.raises(asyncssh.ChannelListenError):
            await conn.forward_remote_port("127.0.0.1", 0, "127.0.0.1", 22)
        with pytest.raises(asyncssh.ChannelListenError):
            await conn.forward_remote_path(str(tmp_path / "listen.sock"), str(other))

        # the agent runs, and its own folder's sockets are reachable
        agent = await conn.create_process(
            json.dumps({"session": "policy", "env": {}}), encoding=None
        )
        ready = json.loads(await asyncio.wait_for(agent.stdout.readline(), 120))
        assert ready["event"] == "ready", ready
        inside = Path(ready["dir"]) / "probe.sock"
        probe = socket.socket(socket.AF_UNIX)
        probe.bind(str(inside))
        probe.listen()
        (Path(ready["dir"]) / "out.sock").symlink_to(other)
        try:
            _, writer = await conn.open_unix_connection(str(inside))
            writer.close()
            for escape in (f"{ready['dir']}/../{other.name}", f"{ready['dir']}/out.sock"):
                with pytest.raises(asyncssh.ChannelOpenError):
                    await conn.open_unix_connection(escape)
        finally:
            probe.close()
        agent.stdin.write_eof()
        await asyncio.wait_for(agent.wait_closed(), 60)
        server.close()


def test_credentials_others_may_read_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "node0.json"
    path.write_text("{}")
    os.chmod(path, 0o644)
    out = subprocess.run(
        [*NODE, "127.0.0.1:9", "--credentials", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert f"credentials file '{path}': mode 644, expected 600" in out.stderr


@in_loop
async def test_renewed_credentials_let_in_the_new_node_alone() -> None:
    """A lost node's place is taken with fresh keys (``renew``): the old node, dialling
    again with its own, is refused; the one given the new credentials is node 0."""
    async with dialled() as (listener, conn):
        old_key = conn.get_server_host_key()
        listener.renew(0)
        conn.close()  # the old node dials again at once, with the old key
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not listener.refused:
            assert loop.time() < deadline, "the old node's second dial was not refused"
            await asyncio.sleep(0.05)
        new = dial(listener)
        try:
            taken = await listener.connection(0)
            key = taken.get_server_host_key()
            assert key is not None and old_key is not None
            assert key.public_data != old_key.public_data
            assert key.public_data == listener.host_keys[0].public_data
            taken.close()
        finally:
            new.kill()
            new.wait()


@in_loop
async def test_a_resized_listener_lets_in_a_new_node_and_refuses_a_removed_one() -> None:
    """A session that grows gives its new node keys of its own, by which it is known; one
    that shrinks forgets the removed node's keys: that node, dialling again, is refused,
    even once its index is a node's again, and node 0 keeps its connection."""
    async with dialled() as (listener, conn):
        first = listener.host_keys[0].public_data
        listener.resize(2)
        node1 = dial(listener, 1)
        try:
            taken = await listener.connection(1)
            key = taken.get_server_host_key()
            assert key is not None and key.public_data == listener.host_keys[1].public_data
            listener.resize(1)
            assert not listener.listening  # node 0 has its connection: none is awaited
            listener.resize(2)  # node 1 again, with new keys: the listener listens for them
            taken.close()  # the removed node dials again at once, with the keys forgotten
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not listener.refused:
                assert loop.time() < deadline, "the removed node's second dial was not refused"
                await asyncio.sleep(0.05)
        finally:
            node1.kill()
            node1.wait()
        assert "a host key that is not the session's" in listener.refused[-1]
        listener.resize(1)
        assert listener.host_keys[0].public_data == first and listener.nodes == 1
        with pytest.raises(AgentError, match="dial-back node 1: expected 0 to 0"):
            listener.credentials(1)
        assert not conn.is_closed()  # node 0 kept its connection
