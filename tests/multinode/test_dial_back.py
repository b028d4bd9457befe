"""Nodes that dial back to the session's owner (``control/launchers/dial_back.py``,
``node/dial_back.py``), each in its own network namespace: sessions run on them as on SSH
nodes, only the session's keys get anything run, and a node whose connection goes takes
its ranks with it."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.events import StreamOut
from jupyter_dist.control.session import Session, SessionTimeouts
from jupyter_dist.errors import AgentError, RanksFailed
from tests.async_run import in_loop

from .dial_back_nodes import (
    children,
    dial_back_nodes,
    listening,
    printed,
    proc_text,
    spec,
    start_node,
    until,
)
from .test_link_faults import set_link
from .test_ssh_sessions import netns_pids

pytestmark = pytest.mark.slow
TIMEOUTS = SessionTimeouts(start=90.0, process_group=60.0)
#: a cell that says it runs on each rank, then sleeps (see `running_on`)
RUNNING = "import time\nprint('running', flush=True)\ntime.sleep(300)"


@contextlib.asynccontextmanager
async def started(session: Session) -> Any:
    try:
        await session.start()
        yield session
    finally:
        await session.shutdown()


@in_loop
async def test_a_session_runs_on_nodes_that_dial_back(cluster: Any, tmp_path: Path) -> None:
    async with listening(cluster, 2) as listener:
        with dial_back_nodes(cluster, listener, tmp_path) as procs:
            session = Session(spec("dialled", 2), TIMEOUTS, env={}, launchers=listener.launcher)
            async with started(session):
                # each node's rank runs in that node's namespace, under its dial-back process
                for rank, node in ((0, 0), (1, 1)):
                    pid = session.ranks[rank].pid
                    assert pid in netns_pids(cluster, node)
                    assert pid in children(procs[node].pid)
                assert [n.host for n in session.nodes] == list(cluster.addresses)
                sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
                result = await session.execute(
                    "import os, torch, torch.distributed as dist\n"
                    "t = torch.tensor([float(os.environ['RANK']) + 1]); dist.all_reduce(t)\n"
                    "total = t.item(); print('sum', total, dist.get_world_size())",
                    sink=sink,
                )
                assert not result.failures, printed(sink)
                result = await session.execute("print('kept', total)", sink=sink)
                assert not result.failures
                text = printed(sink)
                for rank in (0, 1):
                    assert f"[rank {rank}] sum 3.0 2" in text, text
                    assert f"[rank {rank}] kept 3.0" in text, text
                # the keys are in no command line or environment of the node's processes
                ours = [p.pid for p in procs] + [c for p in procs for c in children(p.pid)]
                for node in (0, 1):
                    secret = listener.credentials(node).split("\\n")[1].encode()
                    assert len(secret) > 20
                    for what in ("cmdline", "environ"):
                        assert secret not in proc_text(ours, what)
            assert await until(lambda: not children(procs[1].pid), 30), "agent left running"


@in_loop
async def test_a_plain_tcp_client_and_wrong_keys_are_refused_and_run_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    async with listening(cluster, 1) as listener, listening(cluster, 1) as other:
        host, port = listener.address.rsplit(":", 1)

        def plain_client() -> float:
            """Seconds until the listener closed the connection (a thread's blocking
            socket: the listener runs in this test's loop, which must not wait on it)."""
            with socket.create_connection((host, int(port)), timeout=10) as plain:
                plain.sendall(b"GET / HTTP/1.0\r\n\r\nprint('hello')\n")
                plain.shutdown(socket.SHUT_WR)
                plain.settimeout(40)
                began = time.monotonic()
                with contextlib.suppress(OSError):
                    while plain.recv(4096):
                        pass  # until the listener closes it
                return time.monotonic() - began

        closed_after = await asyncio.to_thread(plain_client)
        assert closed_after < 30, f"the listener kept a plain TCP client {closed_after:.0f} s"
        assert await until(lambda: len(listener.refused) == 1, 10), listener.refused
        # a node holding another session's keys, and one holding the right host key but
        # accepting another client key
        wrong_host = other.credentials(0)
        wrong_client = listener.credentials(0).replace(
            listener.client_key.export_public_key().decode().strip(),
            other.client_key.export_public_key().decode().strip(),
        )
        assert wrong_client != listener.credentials(0)
        for node, creds in ((0, wrong_host), (1, wrong_client)):
            # it dials again after a second while its --retry lasts: two tries, or three
            proc = start_node(cluster, node, listener.address, creds, tmp_path, retry=1.5)
            try:
                assert await until(lambda p=proc: p.poll() is not None, 60)
                said = proc.stdout.read().decode() if proc.stdout else ""
                assert proc.returncode == 1, said
                assert "cannot connect" in said, said
            finally:
                proc.kill()
                proc.wait()
            left = netns_pids(cluster, node) - {cluster.sshd_pids[node]}
            assert not left, f"processes left on the node: {left}"
        assert len(listener.refused) >= 3, listener.refused
        listener.connect_timeout = 1.0
        with pytest.raises(AgentError, match="did not connect"):
            await listener.connection(0)  # nothing got through


async def running_on(sink: queue.SimpleQueue[Any], ranks: set[int], timeout: float = 60) -> None:
    """Once every rank of ``ranks`` printed the `RUNNING` cell's line into ``sink``."""
    said: set[int] = set()

    def heard() -> bool:
        while not sink.empty():
            event = sink.get()
            if isinstance(event, StreamOut) and "running" in event.text:
                said.add(event.rank)
        return said >= ranks

    assert await until(heard, timeout, step=0.05), f"only ranks {said} ran the cell"


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: bytearray
) -> None:
    try:
        while data := await reader.read(65536):
            seen += data
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@in_loop
async def test_what_crosses_the_link_is_not_plain_text(cluster: Any, tmp_path: Path) -> None:
    seen = bytearray()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = listener.address.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(reader, up_writer, seen), _pipe(up_reader, writer, seen))

    async with listening(cluster, 2) as listener:
        proxy = await asyncio.start_server(relay, cluster.bridge_address, 0)
        via = f"{cluster.bridge_address}:{proxy.sockets[0].getsockname()[1]}"
        try:  # node 0 dials directly (the rendezvous is at its own address), node 1 via us
            with dial_back_nodes(cluster, listener, tmp_path, addresses=[None, via]):
                session = Session(spec("wire", 2), TIMEOUTS, env={}, launchers=listener.launcher)
                async with started(session):
                    sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
                    result = await session.execute(
                        "code_canary_in_clear = 'kept'\nprint('printed' + '-canary-' + 'text')",
                        sink=sink,
                    )
                    assert not result.failures
                    assert "[rank 1] printed-canary-text" in printed(sink)
        finally:
            proxy.close()
    assert seen.startswith(b"SSH-2.0-")
    assert len(seen) > 10_000  # the agent's protocol, the rank start-up and the cell
    for clear in (b"code_canary_in_clear", b"printed-canary-text", b"execute_request"):
        assert clear not in seen


@in_loop
async def test_a_node_whose_connection_goes_fails_the_cell_naming_it_and_its_ranks_end(
    cluster: Any, tmp_path: Path
) -> None:
    async with listening(cluster, 2) as listener:
        with dial_back_nodes(cluster, listener, tmp_path) as procs:
            session = Session(spec("cut", 2), TIMEOUTS, env={}, launchers=listener.launcher)
            async with started(session):
                node1 = set(children(procs[1].pid))  # its agent, relay and rank
                assert len(node1) >= 3, node1
                sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
                cell = asyncio.ensure_future(session.execute(RUNNING, sink=sink))
                await running_on(sink, {0, 1})
                began = time.monotonic()
                procs[1].send_signal(signal.SIGKILL)  # the ip netns exec'd process itself
                result = await asyncio.wait_for(cell, 60)
                took = time.monotonic() - began
                with pytest.raises(RanksFailed) as failed:
                    session.raise_for(result)
                text = str(failed.value)
                assert f"node '{cluster.addresses[1]}'" in text, text
                assert "the connection the node dialled in on was lost" in text, text
                assert took < 30, f"the cell failed {took:.0f} s after the node's connection went"
                # without its connection the agent stops its ranks, and exits
                gone = await until(lambda: not node1 & netns_pids(cluster, 1), 30)
                assert gone, f"left running on node 1: {node1 & netns_pids(cluster, 1)}"
                # the node's process runs again: the session restarts on both nodes
                creds = listener.credentials(1)
                procs.append(start_node(cluster, 1, listener.address, creds, tmp_path))
                await session.restart()
                sink = queue.SimpleQueue()
                result = await session.execute(
                    "import torch, torch.distributed as dist\n"
                    "t = torch.ones(1); dist.all_reduce(t); print('sum', t.item())",
                    sink=sink,
                )
                assert not result.failures, printed(sink)
                assert "[rank 1] sum 2.0" in printed(sink)
                assert session.ranks[1].pid in children(procs[-1].pid)


@in_loop
async def test_a_link_lost_without_a_reset_fails_the_cell_and_the_node_stops_its_ranks(
    cluster: Any, tmp_path: Path
) -> None:
    # a node silent for 10 s is lost (20 s by default; less than 10 s loses a healthy node of
    # a loaded machine too); its agent stops its ranks once the notebook side was silent for 20 s
    timeouts = SessionTimeouts(start=90.0, process_group=60.0, node_deadline=10.0)
    async with listening(cluster, 2) as listener:
        with dial_back_nodes(cluster, listener, tmp_path):
            session = Session(spec("silent", 2), timeouts, env={}, launchers=listener.launcher)
            async with started(session):
                rank1 = session.ranks[1].pid
                assert rank1 in netns_pids(cluster, 1)
                sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
                cell = asyncio.ensure_future(session.execute(RUNNING, sink=sink))
                await running_on(sink, {0, 1})
                set_link(cluster, 1, "down")  # every packet dropped, nothing sent back
                try:
                    result = await asyncio.wait_for(cell, 120)
                    with pytest.raises(RanksFailed) as failed:
                        session.raise_for(result)
                    assert f"node '{cluster.addresses[1]}'" in str(failed.value)
                    # no owner on the line: the node ends its connection, and its ranks go
                    assert await until(lambda: rank1 not in netns_pids(cluster, 1), 90)
                finally:
                    set_link(cluster, 1, "up")
