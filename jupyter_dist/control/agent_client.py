"""The control plane's handle on one node's agent: commands out, events in.

The messages are `common.payloads`' `AgentCommand` and `AgentEvent` (JSON lines, see
`common.agent_protocol`); the agent itself is `node.agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from jupyter_dist.common.agent_protocol import PROTOCOL_VERSION, as_event, decode, encode
from jupyter_dist.common.gpus import GPUInfo
from jupyter_dist.common.payloads import (
    AgentCommand,
    AgentEvent,
    KernelConnection,
    ReplyEvent,
    RequestOp,
)
from jupyter_dist.common.stacks import is_dump
from jupyter_dist.control.launchers.base import AgentStreams, Launcher
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)
#: what `AgentClient.stacks` says of a rank whose log could not be read (it exited)
NO_DUMP = "(no dump: "

#: called with (rank, returncode, log_tail) when a rank process exits
ExitCallback = Callable[[int, int, str], None]


@dataclass(frozen=True)
class AgentInfo:
    """What an agent reports about its node once it is ready."""

    host: str
    pid: int
    python: str
    gpus: tuple[GPUInfo, ...]
    versions: Mapping[str, str | None]
    preload_errors: Mapping[str, str] = field(default_factory=dict)
    free_port: int = 0


@dataclass(frozen=True)
class SpawnedRank:
    rank: int
    pid: int
    connection: KernelConnection
    log: str


class AgentClient:
    """Talks to one agent started by a `Launcher`."""

    def __init__(
        self,
        launcher: Launcher,
        node_rank: int,
        on_exit: ExitCallback,
        on_lost: Callable[[AgentClient], None] = lambda _: None,
    ) -> None:
        self.launcher = launcher
        self.node_rank = node_rank
        self.on_exit = on_exit
        self.on_lost = on_lost
        self.stopping = False
        self.info: AgentInfo | None = None
        self._streams: AgentStreams | None = None
        self._ready: asyncio.Future[AgentInfo] | None = None
        self._spawns: dict[int, asyncio.Future[SpawnedRank]] = {}
        self._requests: dict[str, asyncio.Future[ReplyEvent]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.lost = False

    @property
    def host(self) -> str:
        """The node's name as users see it: the name they gave it (`Launcher.label`), else
        the hostname its agent reported."""
        label = self.launcher.label
        if label is not None:
            return label
        return self.info.host if self.info else self.launcher.host

    async def start(self, session: str, env: Mapping[str, str], timeout: float) -> AgentInfo:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._streams = await self.launcher.start(session, env)
        self._reader = asyncio.ensure_future(self._read_events())
        try:
            info = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            self._ready.cancel()  # nobody waits for it any more: no "never retrieved" error
            await self.launcher.stop(1.0)
            raise AgentError(
                f"node {self.host!r}: the agent did not report ready within {timeout:.0f} s"
                f"{self._stderr_note()}"
            ) from None
        if info.preload_errors.get("torch"):
            raise AgentError(
                f"node {info.host!r}: {info.python} cannot import torch: "
                f"{info.preload_errors['torch']}"
            )
        check_versions(info)
        return info

    def _stderr_note(self) -> str:
        tail = self.launcher.stderr_tail().strip()
        return f"; its last output:\n{tail}" if tail else ""

    async def _send(self, message: AgentCommand) -> None:
        if self._streams is None or self.lost:
            raise AgentError(f"node {self.host!r}: the agent is not running")
        try:
            self._streams.writer.write(encode(message))
            await self._streams.writer.drain()
        except (ConnectionError, RuntimeError) as err:
            raise AgentError(f"node {self.host!r}: lost the agent: {err}") from err

    async def _read_events(self) -> None:
        assert self._streams is not None
        reader = self._streams.reader
        try:
            while line := await reader.readline():
                try:
                    event = as_event(decode(line))
                    if event is not None:  # a newer agent's kind of event: ignored
                        self._dispatch(event)
                except (ValueError, KeyError) as err:
                    log.warning("node %s: bad agent message %r: %s", self.host, line[:200], err)
        finally:
            self.lost = True
            gone = AgentError(f"node {self.host!r}: the agent exited{self._stderr_note()}")
            if self._ready and not self._ready.done():
                self._ready.set_exception(gone)
            for fut in self._spawns.values():
                if not fut.done():
                    fut.set_exception(gone)
            for req in self._requests.values():
                if not req.done():
                    req.set_exception(gone)
            log.debug("node %s: agent event stream closed", self.host)
            if not self.stopping:
                log.info("node %s: lost its agent%s", self.host, self._stderr_note())
                self.on_lost(self)

    def _dispatch(self, event: AgentEvent) -> None:
        if event["event"] == "ready":
            info = AgentInfo(
                host=event["host"],
                pid=int(event["pid"]),
                python=event["python"],
                gpus=tuple(GPUInfo(**g) for g in event.get("gpus", [])),
                versions=event.get("versions", {}),
                preload_errors=event.get("preload_errors", {}),
                free_port=int(event.get("free_port", 0)),
            )
            self.info = info
            if self._ready and not self._ready.done():
                if event.get("protocol") != PROTOCOL_VERSION:
                    self._ready.set_exception(protocol_mismatch(info, event.get("protocol")))
                else:
                    self._ready.set_result(info)
        elif event["event"] == "spawned":
            rank = int(event["rank"])
            spawned = SpawnedRank(rank, int(event["pid"]), event["connection"], event["log"])
            fut = self._spawns.pop(rank, None)
            if fut and not fut.done():
                fut.set_result(spawned)
        elif event["event"] == "reply":
            replied = self._requests.pop(str(event["id"]), None)
            if replied and not replied.done():
                replied.set_result(event)
        elif event["event"] == "exited":
            self.on_exit(int(event["rank"]), int(event["returncode"]), event.get("log_tail", ""))
        else:  # error
            failed: int | None = event.get("rank")
            message = f"node {self.host!r}: agent error: {event.get('message')}"
            request = self._requests.pop(str(event.get("id")), None)
            if request is not None:  # the answer to a request: its caller decides
                if not request.done():
                    request.set_exception(AgentError(message))
                return
            log.warning("%s", message)
            if failed is None and len(self._spawns) == 1:
                failed = next(iter(self._spawns))
            fut = self._spawns.pop(failed, None) if failed is not None else None
            if fut and not fut.done():
                fut.set_exception(AgentError(message))

    async def spawn(
        self, rank: int, local_rank: int, env: Mapping[str, str], key: str, cwd: str
    ) -> SpawnedRank:
        fut: asyncio.Future[SpawnedRank] = asyncio.get_running_loop().create_future()
        self._spawns[rank] = fut
        await self._send(
            {
                "op": "spawn",
                "rank": rank,
                "local_rank": local_rank,
                "env": dict(env),
                "key": key,
                "cwd": cwd,
            }
        )
        return await fut

    async def request(self, op: RequestOp, timeout: float = 30.0, **args: Any) -> ReplyEvent:
        """Send a query to the agent and wait for its reply; ``args`` are the fields of
        the op's command in `common.payloads` besides ``op`` and ``id``."""
        request_id = uuid.uuid4().hex
        fut: asyncio.Future[ReplyEvent] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = fut
        try:
            await self._send(cast(AgentCommand, {"op": op, "id": request_id, **args}))
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise AgentError(f"node {self.host!r}: the agent did not answer {op!r}") from None
        finally:
            self._requests.pop(request_id, None)

    async def route(self, addr: str) -> ReplyEvent:
        """The interface and local address this node reaches ``addr`` through."""
        return await self.request("route", addr=addr)

    async def probe(self, addr: str, port: int, timeout: float = 5.0) -> ReplyEvent:
        """Whether this node can open a TCP connection to ``addr:port``."""
        return await self.request(
            "probe", timeout=timeout + 10, addr=addr, port=port, timeout_s=timeout
        )

    async def stacks(
        self, ranks: list[int], settle: float = 0.1, patience: float = 2.0
    ) -> dict[int, str]:
        """Every thread's Python stack of each of ``ranks`` on this node (faulthandler's
        format), read back from the ranks' logs.

        Each rank's own thread writes its dump (`rank.stack_dumps`); the logs are read
        every ``settle`` seconds until each has one. A rank silent for ``patience``
        seconds (its GIL held by stuck C code) is asked again through faulthandler's
        signal handler, which writes even then."""
        loop = asyncio.get_running_loop()
        offsets = await self._ask_stacks(ranks, fallback=False)
        found: dict[int, str] = {}
        deadline = loop.time() + patience
        while True:
            await asyncio.sleep(settle)
            waiting = {r: o for r, o in offsets.items() if r not in found}
            for rank, text in (await self._read_logs(waiting)).items():
                if is_dump(text) or text.startswith(NO_DUMP):  # answered, or gone
                    found[rank] = text
            if len(found) == len(offsets) or loop.time() >= deadline:
                break
        silent = [r for r in offsets if r not in found]
        if silent:
            log.info("node %s: ranks %s did not answer; asking faulthandler", self.host, silent)
            again = await self._ask_stacks(silent, fallback=True)
            await asyncio.sleep(max(settle, 0.3))
            found.update(await self._read_logs(again))
        return {r: found.get(r, "") for r in offsets}

    async def _ask_stacks(self, ranks: list[int], fallback: bool) -> dict[int, int]:
        reply = await self.request("stacks", ranks=ranks, fallback=fallback)
        return {int(r): int(o) for r, o in reply.get("offsets", {}).items()}

    async def _read_logs(self, offsets: dict[int, int]) -> dict[int, str]:
        """Each rank's log from its offset on (a note for a log that cannot be read)."""
        texts = await asyncio.gather(
            *(self.request("read_log", rank=r, offset=o) for r, o in offsets.items()),
            return_exceptions=True,
        )
        return {
            r: t.get("text", "") if isinstance(t, dict) else f"{NO_DUMP}{t})"
            for r, t in zip(offsets, texts, strict=True)
        }

    async def signal_rank(self, rank: int, signal_name: str) -> None:
        await self._send({"op": "signal", "rank": rank, "signal": signal_name})

    async def kill(self, ranks: list[int] | None, grace: float) -> None:
        await self._send({"op": "kill", "ranks": ranks, "grace": grace})

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopping = True
        if not self.lost:
            with contextlib.suppress(Exception):
                await self._send({"op": "shutdown"})
        await self.launcher.stop(timeout)
        if self._reader:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 1.0)


def protocol_mismatch(info: AgentInfo, protocol: object) -> AgentError:
    """The error for an agent that speaks another agent protocol than this notebook's:
    another jupyter_dist release, so the advice is the version to install."""
    from jupyter_dist._version import __version__

    theirs = info.versions.get("jupyter_dist") or "another version"
    return AgentError(
        f"node {info.host!r}: {info.python} has jupyter_dist {theirs}, whose agent speaks "
        f"protocol {protocol} (this notebook's speaks {PROTOCOL_VERSION}); install "
        f"jupyter_dist=={__version__} there (or pass --python to pick another interpreter)"
    )


def check_versions(info: AgentInfo) -> None:
    """A node must run this jupyter_dist and the same torch release as the notebook.

    torch.distributed's wire formats are only promised between equal releases; the
    agent protocol between equal jupyter_dist versions.
    """
    from jupyter_dist._version import __version__

    here = {"jupyter_dist": __version__, "torch": _local_torch_version()}
    for name, mine in here.items():
        theirs = info.versions.get(name)
        if mine and theirs and _release(theirs) != _release(mine):
            raise AgentError(
                f"node {info.host!r}: {info.python} has {name} {theirs}, this notebook has "
                f"{mine}; install {name}=={mine} there (or pass --python to pick another "
                "interpreter)"
            )


def _release(version: str) -> str:
    return version.split("+", maxsplit=1)[0]


def _local_torch_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None
