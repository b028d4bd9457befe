"""The control plane's handle on one node's agent: commands out, events in.

The messages are `common.payloads`' `AgentCommand` and `AgentEvent` (JSON lines, see
`common.agent_protocol`); the agent itself is `node.agent`.

Every wait on an agent has a deadline, and the client pings the agent (`Heartbeat`): a
node whose agent says nothing for `Heartbeat.deadline_s` is lost ("unreachable since
HH:MM:SS"), everything waiting on it fails with that reason, and its launcher is stopped.
Lines that are not the protocol (a login banner, bad types, a line too long) are named
with what the node sent, and never taken for the agent's exit: before ``ready`` they are
kept to quote if the start fails; after it they make the node lost at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from jupyter_dist.common.agent_protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Heartbeat,
    as_event,
    decode,
    encode,
)
from jupyter_dist.common.gpus import GPUInfo
from jupyter_dist.common.payloads import (
    AgentCommand,
    AgentEvent,
    KernelConnection,
    ReplyEvent,
    RequestOp,
)
from jupyter_dist.common.stacks import is_dump
from jupyter_dist.control.launchers.base import AgentStreams, Launcher, LineReader
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)
#: what `AgentClient.stacks` says of a rank whose log could not be read (it exited)
NO_DUMP = "(no dump: "

#: called with (rank, returncode, log_tail) when a rank process exits
ExitCallback = Callable[[int, int, str], None]
#: seconds a spawn may take, once the agent has the command: a fork and a connection file
#: (longer only while the rank's previous process is still being reaped)
SPAWN_TIMEOUT_S = 60.0
#: lines a node wrote that were not the protocol, kept to quote in errors
KEPT_STRAY_LINES = 5


def quote_line(line: bytes, limit: int = 200) -> str:
    """What a node sent, for an error message: its first ``limit`` bytes, escaped, and its
    length when longer."""
    shown = repr(line[:limit].rstrip(b"\n"))
    return shown if len(line) <= limit else f"{shown}... ({len(line)} bytes)"


async def read_lines(reader: LineReader, limit: int = MAX_LINE_BYTES) -> AsyncIterator[bytes]:
    """The lines of ``reader``, each with its newline; a line longer than ``limit`` comes
    as its first ``limit`` bytes only, with no newline, and the rest of it is skipped
    (memory stays bounded whatever the node sends)."""
    buf = bytearray()
    skipping = False
    while chunk := await reader.read(1 << 16):
        buf += chunk
        while True:
            end = buf.find(b"\n")
            if end < 0:
                break
            line = bytes(buf[: end + 1])
            del buf[: end + 1]
            if skipping:
                skipping = False
            else:
                yield line
        if len(buf) > limit:
            if not skipping:
                yield bytes(buf[:limit])
            skipping = True
            buf.clear()
    if buf and not skipping:
        yield bytes(buf)


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
        heartbeat: Heartbeat | None = None,
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
        self._heartbeat: asyncio.Task[None] | None = None
        self._stopping_launcher: asyncio.Task[None] | None = None
        self.heartbeat = heartbeat or Heartbeat()
        self.lost = False
        #: its agent was started and said it is ready (`start` returned)
        self.started = False
        #: why `start` failed, in a line ("" while it did not)
        self.start_error = ""
        #: why the node was lost ("" while it is not): its agent exited, the link went
        #: down, or it is unreachable
        self.lost_reason = ""
        #: its first line, for one-line summaries
        self.lost_summary = ""
        #: when the agent last said anything (``time.time()``, for messages)
        self.last_heard = 0.0
        self._last_heard_mono = 0.0
        #: lines the node wrote that were not the protocol (a login banner...)
        self.stray_lines: list[bytes] = []

    @property
    def host(self) -> str:
        """The node's name as users see it: the name they gave it (`Launcher.label`), else
        the hostname its agent reported."""
        label = self.launcher.label
        if label is not None:
            return label
        return self.info.host if self.info else self.launcher.host

    @property
    def running(self) -> bool:
        """Whether its agent started and is neither lost nor stopped: a session restarts
        keeping its agents only while every one of them runs (`recovery.RestartPlan`)."""
        return self.started and not self.lost and not self.stopping

    @property
    def unreachable(self) -> str:
        """Why the node could not be started or was lost, in a line ("" when it runs, or
        was stopped from here)."""
        if self.stopping or self.running:
            return ""
        return self.lost_summary or self.start_error

    async def start(self, session: str, env: Mapping[str, str], timeout: float) -> AgentInfo:
        """Start the agent and wait until it is ready; the first line of why it could not
        is kept (`unreachable`)."""
        try:
            info = await self._start(session, env, timeout)
        except BaseException as err:
            self.start_error = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise
        self.started = True
        return info

    async def _start(self, session: str, env: Mapping[str, str], timeout: float) -> AgentInfo:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._streams = await self.launcher.start(session, env)
        self._heard()
        self._reader = asyncio.ensure_future(self._read_events())
        try:
            info = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.CancelledError:
            self._ready.cancel()  # nobody waits for it any more: no "never retrieved" error
            raise
        except asyncio.TimeoutError:
            self._ready.cancel()  # nobody waits for it any more: no "never retrieved" error
            await self.launcher.stop(1.0)
            raise AgentError(
                f"node {self.host!r}: the agent did not report ready within {timeout:.0f} s"
                f"{self._stray_note()}{self._stderr_note()}"
            ) from None
        self._heartbeat = asyncio.ensure_future(self._beat())
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

    def _stray_note(self) -> str:
        """The lines the node wrote that were not the protocol, quoted."""
        if not self.stray_lines:
            return ""
        quoted = "\n".join(f"  {quote_line(line)}" for line in self.stray_lines)
        return (
            "; before that it wrote lines that are not the agent protocol (a login banner "
            "or a shell startup file writing to stdout?):\n" + quoted
        )

    def _heard(self) -> None:
        self.last_heard = time.time()
        self._last_heard_mono = time.monotonic()

    async def _send(self, message: AgentCommand) -> None:
        if self._streams is None or self.lost:
            raise AgentError(self.lost_reason or f"node {self.host!r}: the agent is not running")
        try:
            self._streams.writer.write(encode(message))
            await self._streams.writer.drain()
        except (ConnectionError, RuntimeError) as err:
            raise AgentError(f"node {self.host!r}: lost the agent: {err}") from err

    async def _read_events(self) -> None:
        assert self._streams is not None
        summary = ""
        try:
            async for line in read_lines(self._streams.reader):
                self._heard()
                self._take(line)
            log.debug("node %s: agent event stream closed", self.host)
        except (OSError, asyncio.IncompleteReadError) as err:  # the channel itself broke
            log.debug("node %s: agent stream failed: %s", self.host, err)
        finally:
            try:
                if not self.lost and not self.stopping:
                    summary = await asyncio.wait_for(self._exit_summary(), 2.0)
            except Exception as err:
                log.debug("node %s: no exit status: %s", self.host, err)
            finally:
                notes = f"{self._stray_note()}{self._stderr_note()}"
                self._lose(summary or f"node {self.host!r}: the agent exited", notes)

    def _take(self, line: bytes) -> None:
        """One line from the node: an event, or something else, named with what it was."""
        if not line.endswith(b"\n") and len(line) >= MAX_LINE_BYTES:
            problem = f"a line over {MAX_LINE_BYTES} bytes"
        else:
            try:
                data = decode(line)
            except ValueError as err:  # not JSON, not UTF-8, not an object
                problem = f"a line that is not a JSON message ({err})"
            else:
                event = as_event(data)
                if event is None:  # a newer agent's kind of event, or none at all
                    if "event" in data:
                        return
                    problem = "a JSON line with no 'event'"
                else:
                    try:
                        self._dispatch(event)
                        return
                    except (ValueError, KeyError, TypeError) as err:
                        kind = event["event"]
                        problem = f"a malformed {kind!r} event ({type(err).__name__}: {err})"
                        if kind == "ready" and self._ready and not self._ready.done():
                            self._ready.set_exception(
                                AgentError(f"node {self.host!r} sent {problem}: {quote_line(line)}")
                            )
                            return
        if self._ready is not None and not self._ready.done():
            if len(self.stray_lines) < KEPT_STRAY_LINES:
                self.stray_lines.append(line[:1000])
            return
        self._refuse(problem, line)

    def _refuse(self, problem: str, line: bytes) -> None:
        """After ``ready`` only the agent writes to the node's channel (`node.agent` keeps
        its stdout for the protocol), so a line that is not the protocol means something
        else answers there: nothing more the node says is trusted, and the node is lost
        at once, quoting the line, where a spawn would have waited out its deadline."""
        if self.lost or self.stopping:
            return
        self._lose(
            f"node {self.host!r}: after its agent was ready, it sent {problem}: "
            f"{quote_line(line)}; the agent never writes that (another program writes to "
            "the node's channel, or it is not this notebook's agent), so the node was given up"
        )

    async def _exit_summary(self) -> str:
        """Why the agent's stream ended, in a line: what the launcher knows (the link was
        lost, the agent's exit status)."""
        how = await self.launcher.describe_exit()
        if self.launcher.link_lost():
            return f"node {self.host!r} unreachable since {self._since()}: {how}"
        return f"node {self.host!r}: {how}"

    def _since(self) -> str:
        """When the agent was last heard, as HH:MM:SS."""
        return time.strftime("%H:%M:%S", time.localtime(self.last_heard))

    def _lose(self, summary: str, notes: str = "") -> None:
        """The node is out of reach (once): everything waiting on it fails with
        ``summary`` (a line) and ``notes`` (what the node wrote), the session hears of it,
        and the launcher is stopped."""
        if self.lost:
            return
        reason = summary + notes
        self.lost = True
        self.lost_reason = reason
        self.lost_summary = summary
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        gone = AgentError(reason)
        for fut in [self._ready, *self._spawns.values(), *self._requests.values()]:
            if fut is not None and not fut.done():
                fut.set_exception(gone)
        if not self.stopping:
            log.info("%s", reason)
            self.on_lost(self)
            self._stopping_launcher = asyncio.ensure_future(self.launcher.stop(5.0))

    async def _beat(self) -> None:
        """Ping the agent every `Heartbeat.interval_s`; take the node as lost once it said
        nothing for `Heartbeat.deadline_s`. A loop held up past a beat (a busy notebook)
        first lets what arrived meanwhile be read."""
        beat = self.heartbeat
        loop = asyncio.get_running_loop()
        seq = 0
        while not self.lost:
            # the first at once: the agent's own deadline is armed from now on, not one beat
            # later (a link lost in between would leave it running its ranks for ever)
            with contextlib.suppress(AgentError):
                await self._send({"op": "ping", "seq": seq, "deadline_s": beat.agent_deadline_s})
            seq += 1
            planned = loop.time() + beat.interval_s
            await asyncio.sleep(beat.interval_s)
            if loop.time() - planned > beat.interval_s:
                continue  # this loop stalled: judge the node on a later beat
            silent = time.monotonic() - self._last_heard_mono
            if silent >= beat.deadline_s:
                await asyncio.sleep(0.1)  # lines already here are read first
                silent = time.monotonic() - self._last_heard_mono
            if silent >= beat.deadline_s:
                self._lose(
                    f"node {self.host!r} unreachable since {self._since()}: its agent did not "
                    f"answer for {silent:.0f} s (the network link, or the node itself, "
                    "may be down, or the agent is stopped); its ranks are out of reach"
                )
                return

    def _dispatch(self, event: AgentEvent) -> None:
        if event["event"] == "ready":
            if self.stray_lines:
                log.info(
                    "node %s wrote %d line(s) before its agent that are not the protocol "
                    "(a login banner?), first: %s",
                    self.host,
                    len(self.stray_lines),
                    quote_line(self.stray_lines[0]),
                )
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
        elif event["event"] == "pong":
            pass  # heard: `_read_events` noted the time
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
        self,
        rank: int,
        local_rank: int,
        env: Mapping[str, str],
        key: str,
        cwd: str,
        timeout: float = SPAWN_TIMEOUT_S,
    ) -> SpawnedRank:
        fut: asyncio.Future[SpawnedRank] = asyncio.get_running_loop().create_future()
        self._spawns[rank] = fut
        try:
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
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise AgentError(
                f"node {self.host!r}: rank {rank} was not started within {timeout:.0f} s "
                "of asking its agent"
            ) from None
        finally:
            if self._spawns.get(rank) is fut:
                del self._spawns[rank]

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
            raise AgentError(
                f"node {self.host!r}: the agent did not answer {op!r} within {timeout:.0f} s"
            ) from None
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

    async def free(self, ranks: list[int]) -> list[int]:
        """Ask ``ranks`` to free their main thread from a collective of their process
        group (`rank.group_sockets`); the ranks asked."""
        reply = await self.request("free", ranks=ranks)
        return [int(r) for r in reply.get("ranks", [])]

    async def signal_rank(self, rank: int, signal_name: str) -> None:
        await self._send({"op": "signal", "rank": rank, "signal": signal_name})

    async def kill(self, ranks: list[int] | None, grace: float) -> None:
        await self._send({"op": "kill", "ranks": ranks, "grace": grace})

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopping = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if not self.lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send({"op": "shutdown"}), timeout)
        if self._stopping_launcher is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._stopping_launcher), timeout + 5)
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
