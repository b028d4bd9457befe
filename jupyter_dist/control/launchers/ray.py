"""The ``ray`` launcher: a session's nodes placed on a Ray cluster, their agents dialling back.

``%%distributed --ray --nodes 2 --gpus 4`` asks Ray for one placement group with one bundle
per node (``STRICT_SPREAD``: one machine each, unless ``--ray-strategy`` says otherwise),
each holding the node's GPUs, ``--ray-cpus`` CPUs and any ``--ray-resources`` (custom
resources, an accelerator type). One actor per bundle
(``node.ray_host``) starts the node's ``jupyter_dist.node.dial_back`` process, which
connects to this side's `DialBackListener` over SSH (encrypted, both ends proven by the
session's fresh keys) and runs the node's agent exactly as on SSH nodes: the GPUs are the
ones Ray gave the actor (``CUDA_VISIBLE_DEVICES``), node 0's address as Ray knows it is
``MASTER_ADDR``.

Ray is spoken to by a child process, the session's driver (``ray_driver``), never in this
process: `RayPlacement` starts it, relays its progress, and stops it with the session,
whatever state the session is in (a start that is cancelled releases it too). The driver
ends with its stdin and with its owner (``--owner-pid``: the kernel kills it when this
process ends, even while it connects), so a notebook kernel or server that dies takes its
sessions' actors and placement groups with it (Ray removes a driver's), and the actors'
ends end the nodes' dial-back processes, agents and ranks.

A node whose Ray node was lost is placed again by a heal (`RayPlacement.replace_node`): Ray
reschedules a dead node's bundles on its own, the driver waits for the node's bundle and
starts a new actor in it, and the node's agent dials back with fresh credentials. A resize
(`RayPlacement.resize`) asks the driver for bundles and actors of the new nodes, or to give
back those of the nodes removed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import getpass
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jupyter_dist.common.payloads import ClusterHold
from jupyter_dist.common.ray_options import RaySpec, address_origin, resolve_ray_address
from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers.base import Launcher, Placement
from jupyter_dist.control.launchers.dial_back import DialBackLauncher, DialBackListener
from jupyter_dist.control.launchers.ray_probe import auto_from_file, probe
from jupyter_dist.control.launchers.ray_reach import (
    CONNECTED_WAIT_S,
    connecting_text,
    failure_text,
    joined_text,
    without_ray_log,
)
from jupyter_dist.errors import AgentError, SpecError

log = logging.getLogger(__name__)
#: the session's driver, run as ``python -m`` this module
DRIVER_MODULE = "jupyter_dist.control.launchers.ray_driver"
#: seconds the driver gets to give everything back when the session stops
RELEASE_S = 20.0
#: seconds a node's launcher waits for the driver to say why the node ended
EXIT_NEWS_S = 2.0
#: the most bytes of one line the driver writes
MAX_EVENT_BYTES = 1 << 20


def owner_id() -> str:
    """Who owns a session's things on the cluster: ``user@host/pid`` of this process."""
    return f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}"


def bundles(spec: SessionSpec) -> list[dict[str, float]]:
    """Each node's bundle: its GPUs (``--ray-gpus``, else its ``--gpus`` count, else none),
    ``--ray-cpus`` CPUs and the ``--ray-resources``."""
    ray = spec.ray or RaySpec()
    extra = ray.resources_dict()
    out = []
    for node in range(spec.nodes):
        gpus = (
            ray.gpus
            if ray.gpus is not None
            else spec.procs_on(node)
            if spec.device == "cuda"
            else 0
        )
        bundle: dict[str, float] = {"CPU": float(ray.cpus)}
        if gpus:
            bundle["GPU"] = float(gpus)
        bundle.update(extra)
        out.append(bundle)
    return out


def node_text(info: Mapping[str, Any]) -> str:
    """``Ray node 10.0.0.2 (worker1), GPUs 0,1``: a node as its actor described it."""
    gpus = info.get("gpu_ids") or []
    held = f", GPUs {','.join(gpus)}" if gpus else ""
    return f"Ray node {info.get('ip')} ({info.get('hostname')}){held}"


class RayPlacement(Placement):
    """One session on a Ray cluster: its driver process, its listener, its nodes."""

    def __init__(self, spec: SessionSpec, env: Mapping[str, str]) -> None:
        self.spec = spec
        self.ray = spec.ray or RaySpec()
        self.address = resolve_ray_address(self.ray.address, env)
        #: where the address came from: ``--ray-address``, ``RAY_ADDRESS`` or ``auto``
        self.origin = address_origin(self.ray.address, env)
        self.env = dict(env)
        self.owner = owner_id()
        self.listener: DialBackListener | None = None
        self.driver: asyncio.subprocess.Process | None = None
        #: what the driver said of each node once placed: ``ip``, ``hostname``, ``gpu_ids``
        self.nodes: list[dict[str, Any]] = []
        #: why a node ended, as the driver saw it, by node
        self.exits: dict[int, str] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._tasks: list[asyncio.Task[None]] = []
        self._exit_news = asyncio.Event()
        self._requests = 0  # replacement requests sent to the driver

    # -- place ---------------------------------------------------------------------------
    async def place(self, progress: Callable[[str], None], timeout: float) -> None:
        progress(connecting_text(self.address, self.origin))
        # asked before a driver is started (`ray_probe`); `auto`: the address of Ray's
        # address file, as the driver's `auto` would take it
        target, found = self.address, ""
        if target == "auto":
            target, found = auto_from_file({**os.environ, **self.env}) or ("", "")
        how = await probe(target) if target else None
        if how is not None:
            event = {"unreachable": True, "how": how, "address": target, "found": found}
            raise AgentError(failure_text(event, self.address, self.origin) or how)
        self.driver = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            DRIVER_MODULE,
            "--owner-pid",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **self.env},
            limit=MAX_EVENT_BYTES,
            # not in the notebook kernel's process group: the stop button SIGINTs that
            # group, and the driver ending would end the session's nodes
            start_new_session=True,
        )
        self._tasks += [
            asyncio.ensure_future(self._read_events()),
            asyncio.ensure_future(self._read_stderr()),
        ]
        runtime_env = self.ray.runtime_env_dict()
        self._send(
            {
                "address": self.address,
                "owner": self.owner,
                "session": self.spec.name,
                "bundles": bundles(self.spec),
                "strategy": self.ray.strategy,
                "runtime_env": runtime_env,
                "timeout": self.ray.timeout or timeout,
                "python": self.spec.python,
            }
        )
        connected = await self._next("connected", progress, min(timeout, CONNECTED_WAIT_S))
        progress(joined_text(connected, self.address, self.origin))
        if self.address == "auto" and connected.get("address"):
            # what `auto` found: the session's record and status name that cluster (a
            # sweep after a dead server must reach it, not what `auto` finds then)
            self.address = str(connected["address"])
        ip = str(connected["ip"])
        self.listener = DialBackListener(
            self.spec.nodes, host=ip, advertise=ip, connect_timeout=timeout
        )
        await self.listener.start()
        credentials = [self.listener.credentials(n) for n in range(self.spec.nodes)]
        self._send({"listener": self.listener.address, "credentials": credentials})
        placed = await self._next("placed", progress, (self.ray.timeout or timeout) + 30)
        self.nodes = list(placed["nodes"])
        for node, info in enumerate(self.nodes):
            progress(f"node {node}: {node_text(info)}")

    async def replace_node(
        self, node: int, progress: Callable[[str], None], timeout: float
    ) -> None:
        """Node ``node``'s bundle held again and a new actor in it: Ray reschedules the
        bundles of a dead node on its own, the driver waits for it (``--ray-timeout``, else
        ``timeout``) and starts the actor, which dials in with the node's fresh
        credentials (the lost machine's, should it come back, no longer open the door)."""
        if self.listener is None or self.driver is None or self.driver.returncode is not None:
            raise AgentError(f"Ray: node {node} cannot be placed again: the session's driver "
                             f"has ended{self._stderr_text()}")  # fmt: skip
        self._drop_stale_events()
        self.listener.renew(node)
        self._requests += 1
        wait = self.ray.timeout or timeout
        self._send(
            {
                "op": "replace",
                "request": self._requests,
                "node": node,
                "credentials": self.listener.credentials(node),
                "timeout": wait,
            }
        )
        done = await self._next("replaced", progress, wait + 30, request=self._requests)
        lost = self.nodes[node] if node < len(self.nodes) else {}
        info = dict(done["info"])
        self.nodes[node] = info
        self.exits.pop(node, None)  # what ended was the lost node; this one runs
        was = f" in place of {lost.get('ip')} ({lost.get('hostname')})" if lost else ""
        progress(f"node {node}: {node_text(info)}{was}")

    resizable = True

    async def resize(
        self, spec: SessionSpec, progress: Callable[[str], None], timeout: float
    ) -> None:
        """More nodes: the driver holds a bundle for each (one a shrink left idle, else a
        new placement group apart from the session's machines under ``STRICT_SPREAD``,
        waited for up to ``--ray-timeout``, else ``timeout``) and starts an actor in it,
        which dials in with the node's new credentials. Fewer: the driver kills the actors
        of the nodes past ``spec.nodes`` and gives back their bundles where it can."""
        listener, old = self.listener, len(self.nodes)
        if listener is None or self.driver is None or self.driver.returncode is not None:
            raise AgentError(f"Ray: the session cannot be resized: its driver has ended"
                             f"{self._stderr_text()}")  # fmt: skip
        self._drop_stale_events()
        self._requests += 1
        request = self._requests
        if spec.nodes > old:
            listener.resize(spec.nodes)
            wait = self.ray.timeout or timeout
            self._send(
                {
                    "op": "grow",
                    "request": request,
                    "bundles": bundles(spec)[old:],
                    "credentials": [listener.credentials(n) for n in range(old, spec.nodes)],
                    "timeout": wait,
                }
            )
            try:
                done = await self._next(
                    "grown", progress, wait + 30, request=request, failed="grow_failed"
                )
            except BaseException:
                listener.resize(old)  # the new nodes' keys open no door
                raise
            self.nodes += [dict(info) for info in done["nodes"]]
            for node in range(old, spec.nodes):
                progress(f"node {node}: {node_text(self.nodes[node])}")
        elif spec.nodes < old:
            self._send({"op": "shrink", "request": request, "nodes": spec.nodes})
            listener.resize(spec.nodes)
            del self.nodes[spec.nodes :]
            for node in range(spec.nodes, old):
                self.exits.pop(node, None)
            await self._next("shrunk", progress, RELEASE_S, request=request)
        self.spec = spec

    def _drop_stale_events(self) -> None:
        """Forget what the driver said since the last request (exits are kept by the
        reader), but for its end."""
        while not self._events.empty():
            stale = self._events.get_nowait()
            if stale.get("event") in ("failed", "ended"):
                self._events.put_nowait(stale)
                break

    async def _next(
        self,
        wanted: str,
        progress: Callable[[str], None],
        timeout: float,
        request: int | None = None,
        failed: str = "replace_failed",
    ) -> dict[str, Any]:
        """The driver's next ``wanted`` event (of ``request``, when given: ``failed`` says
        it could not be done), relaying its progress; `AgentError` if it fails, ends or
        says nothing for ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            try:
                event = await asyncio.wait_for(self._events.get(), max(left, 0.0))
            except asyncio.TimeoutError:
                raise AgentError(
                    f"Ray cluster {self.address}: no answer within {timeout:.0f} s "
                    f"(waiting for {wanted}){self._stderr_text()}"
                ) from None
            kind = event.get("event")
            if request is not None and kind in (wanted, failed):
                if event.get("request") != request:
                    continue  # an earlier request's late answer
                if kind == failed:
                    raise AgentError(f"Ray: {event.get('error')}")
            if kind == wanted:
                return event
            if kind == "progress":
                progress(str(event.get("text", "")))
            elif kind in ("failed", "ended"):
                raise AgentError(self._failure(event))

    def _failure(self, event: Mapping[str, Any]) -> str:
        """Why the driver failed or ended, in words: the address and its origin when the
        cluster could not be reached."""
        unreachable = failure_text(event, self.address, self.origin)
        if unreachable is not None:
            return unreachable
        why = event.get("error") or f"the Ray driver exited{self._stderr_text()}"
        return f"Ray: {why}"

    def _send(self, message: Mapping[str, Any]) -> None:
        assert self.driver is not None and self.driver.stdin is not None
        self.driver.stdin.write(json.dumps(message).encode() + b"\n")

    async def _read_events(self) -> None:
        assert self.driver is not None and self.driver.stdout is not None
        with contextlib.suppress(Exception):
            while line := await self.driver.stdout.readline():
                try:
                    event = json.loads(line)
                except ValueError:
                    self._stderr.append(line.decode(errors="replace").rstrip())
                    continue
                if event.get("event") == "node_exited":
                    node = int(event.get("node", -1))
                    self.exits[node] = str(event.get("detail", ""))
                    log.warning("ray: node %d ended: %s", node, self.exits[node])
                    self._exit_news.set()
                self._events.put_nowait(event)
        self._events.put_nowait({"event": "ended"})

    async def _read_stderr(self) -> None:
        assert self.driver is not None and self.driver.stderr is not None
        with contextlib.suppress(Exception):
            while line := await self.driver.stderr.readline():
                self._stderr.append(line.decode(errors="replace").rstrip())

    def _stderr_text(self) -> str:
        tail = "\n".join(without_ray_log(self._stderr))[-3000:]
        return f"\n{tail}" if tail else ""

    # -- nodes ---------------------------------------------------------------------------
    def launcher(self, spec: SessionSpec, node: int) -> Launcher:
        if self.listener is None:
            raise AgentError("Ray: the session's nodes are not placed yet")
        return RayLauncher(self, node)

    async def exit_news(self, node: int) -> str | None:
        """Why node ``node`` ended as the driver saw it, waiting a moment for the news."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EXIT_NEWS_S
        while node not in self.exits and loop.time() < deadline:
            self._exit_news.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._exit_news.wait(), deadline - loop.time())
        return self.exits.get(node)

    def hold(self) -> ClusterHold:
        """The cluster and the owner prefix that every name of the session is under."""
        return {"kind": "ray", "address": self.address, "owner": self.owner}

    # -- release -------------------------------------------------------------------------
    async def release(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None and self.listener is None and driver.returncode is None:
            # never connected (or never got further): it holds nothing on the cluster,
            # and a Ray that is imported takes seconds to exit
            with contextlib.suppress(ProcessLookupError):
                driver.kill()
        if driver is not None:
            if driver.returncode is None and driver.stdin is not None:
                with contextlib.suppress(Exception):
                    driver.stdin.write(b'{"op": "stop"}\n')
                    driver.stdin.close()
            try:
                await asyncio.wait_for(driver.wait(), RELEASE_S)
            except asyncio.TimeoutError:
                log.warning("ray: the driver did not stop within %.0f s; killing it", RELEASE_S)
                with contextlib.suppress(ProcessLookupError):
                    driver.kill()  # Ray removes a dead driver's actors and placement group
                await driver.wait()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        if self.listener is not None:
            await self.listener.close()
            self.listener = None


class RayLauncher(DialBackLauncher):
    """Node ``node`` of a session on Ray: the agent its actor's dial-back process runs."""

    kind: ClassVar[str] = "ray"
    link_name = "the connection the node's Ray actor dialled in on"

    def __init__(self, placement: RayPlacement, node: int) -> None:
        assert placement.listener is not None
        super().__init__(placement.listener, node)
        self.held = placement
        self.info = placement.nodes[node] if node < len(placement.nodes) else {}

    @classmethod
    def placement(cls, spec: SessionSpec, env: Mapping[str, str]) -> RayPlacement:
        if spec.ray is None:
            raise SpecError("launcher 'ray': the session has no Ray options")
        return RayPlacement(spec, env)

    @property
    def host(self) -> str:
        return str(self.info.get("ip") or super().host)

    @property
    def label(self) -> str | None:
        """Ray's address of the node: nodes in containers often share a hostname."""
        return str(self.info["ip"]) if self.info.get("ip") else super().label

    def peer_address(self) -> str | None:
        """Node 0's address as Ray knows it is the rendezvous: the node holds it, where the
        address its connection came from may be a NAT's."""
        return str(self.info["ip"]) if self.info.get("ip") else super().peer_address()

    async def describe_exit(self) -> str:
        how = await super().describe_exit()
        news = await self.held.exit_news(self.node)
        return f"{how}; {news}" if news else how

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "kind": self.kind,
            "ray_address": self.held.address,
            "owner": self.held.owner,
            "ip": self.info.get("ip"),
        }


__all__ = ["RayLauncher", "RayPlacement", "bundles", "owner_id"]
