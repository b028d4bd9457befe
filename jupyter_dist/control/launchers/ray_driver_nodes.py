"""One session's nodes placed on a Ray cluster by its driver, watched, and given back.

`PlacedSession` makes the session's placement group (one bundle per node) and waits for
it, saying what it waits for (Ray's autoscaler to add a node, where no live node can
hold a bundle and the cluster has one: `ray_autoscale`), starts one actor per bundle
(``node.ray_host``), whose node dials back to the owner's listener, watches the actors
until the session stops, and gives everything back. Its subclass
``ray_driver_changes.Driver`` places a lost node again and resizes a live session. The
driver speaks JSON lines on stdout (`emit`); a session that cannot be placed is a
`PlacementError`, and Ray's own errors are said by `explain`.

Part of the session's driver process (``ray_driver``): Ray is imported inside functions.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jupyter_dist._version import __version__
from jupyter_dist.control.launchers.ray_autoscale import (
    Autoscaler,
    never,
    read_autoscaler,
    types_text,
    waiting_text,
)
from jupyter_dist.control.launchers.ray_cluster import (
    actor_name,
    ask_text,
    cluster_nodes,
    cluster_text,
    free_nodes,
    group_name,
    infeasible,
    remove_named,
)

#: the node-side actor class, by module (the nodes import it; so must they have jupyter_dist)
HOST_CLASS = "jupyter_dist.node.ray_host:RayNodeHost"
#: seconds between looks at the cluster while the placement group waits for room; what it
#: sees is said when it changed, or again after `PROGRESS_REPEAT_S`
PROGRESS_EVERY_S = 3.0
PROGRESS_REPEAT_S = 30.0
#: seconds between looks at a lost node's bundle and its new actor while they are awaited
REPLACE_POLL_S = 1.0
_emitting = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields}) + "\n"
    with _emitting:  # the watch and a replacement's thread both speak
        sys.stdout.write(line)
        sys.stdout.flush()


class PlacedSession:
    """Places one session's nodes, watches them, and gives everything back."""

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.owner = str(request["owner"])
        self.session = str(request["session"])
        self.bundles: list[dict[str, float]] = [dict(b) for b in request["bundles"]]
        self.strategy = str(request["strategy"])
        self.runtime_env: dict[str, Any] | None = request.get("runtime_env")
        self.timeout = float(request["timeout"])
        self.python: str | None = request.get("python")
        self.group: Any = None
        #: each node's bundle: (its placement group, its index there); a resize that grew
        #: the session placed its new nodes in groups of their own (`grown`)
        self.homes: list[tuple[Any, int]] = []
        self.grown: list[Any] = []
        #: bundles still held for nodes a resize removed (a group cannot shrink): a later
        #: grow takes them first; each with its resources
        self.idle: list[tuple[Any, int, dict[str, float]]] = []
        self.grows = 0  # placement groups a grow made, for their names
        self.actors: list[Any] = []
        #: what each node's actor said of it once started (its Ray node's id among it)
        self.placed: list[dict[str, Any]] = []
        #: the owner's listener (``HOST:PORT``) the nodes dial
        self.listener = ""
        self.stopping = threading.Event()
        #: the watched actors' ``wait`` calls: ref -> node; guarded by ``lock``, which a
        #: replacement's thread takes to swap a node's actor
        self.waits: dict[Any, int] = {}
        self.lock = threading.Lock()

    def place(self) -> None:
        """Make the placement group and wait for it, saying why while it waits."""
        from ray.util.placement_group import placement_group

        name = group_name(self.owner, self.session)
        left = remove_named(name + "/", exact_group=name)
        if left:
            emit("progress", text=f"removed what an earlier run left: {', '.join(left)}")
        nodes = cluster_nodes()
        ask = ask_text(self.bundles, self.strategy)
        scaler = self.autoscaler_for(self.bundles, ask, nodes, nodes)
        self.group = placement_group(self.bundles, strategy=self.strategy, name=name)
        self.homes = [(self.group, index) for index in range(len(self.bundles))]
        self._wait_ready(self.group, self.bundles, ask, self.timeout, scaler=scaler)

    def autoscaler_for(
        self,
        bundles: Sequence[Mapping[str, float]],
        ask: str,
        nodes: Sequence[Mapping[str, Any]],
        among: Sequence[Mapping[str, Any]],
    ) -> Autoscaler | None:
        """None where the live nodes ``among`` could hold ``bundles``; the cluster's
        autoscaler where they cannot but one of its node types could (the placement group
        asks it); `PlacementError` naming the ask, the cluster and any node types where
        nothing could ever hold them."""
        why = infeasible(bundles, self.strategy, among)
        if why is None:
            return None
        scaler = read_autoscaler()
        if scaler is None:
            raise PlacementError(f"cannot place {ask}: {why}; {cluster_text(nodes)}")
        beyond = never(bundles, self.strategy, among, scaler)
        if beyond is not None:
            also = "" if beyond == why else f" ({beyond})"
            raise PlacementError(
                f"cannot place {ask}: {why}, nor with every node Ray's autoscaler can add"
                f"{also}; {cluster_text(nodes)}; its node types: {types_text(scaler.types)}"
            )
        emit("progress", text=f"no node can hold it now: asking Ray's autoscaler for {ask}")
        return scaler

    def _wait_ready(
        self,
        group: Any,
        bundles: Sequence[Mapping[str, float]],
        ask: str,
        timeout: float,
        apart: Collection[str] = (),
        scaler: Autoscaler | None = None,
    ) -> None:
        """Until ``group`` is placed, saying how many nodes have room (none of ``apart``,
        Ray node ids) while it waits, or, with ``scaler``, what Ray's autoscaler is asked
        to add; `PlacementError` after ``timeout`` seconds."""
        import ray

        deadline = time.monotonic() + timeout
        looked = said = 0.0
        last = ""

        def room(nodes: list[dict[str, Any]]) -> int:
            return free_nodes(bundles, [n for n in nodes if str(n.get("NodeID")) not in apart])

        def waiting(nodes: list[dict[str, Any]]) -> str:
            """``for ASK: N node(s) have room now``, or ``for Ray's autoscaler to add a
            node for ... (node type ...), to place ASK``."""
            if scaler is not None:
                among = [n for n in nodes if str(n.get("NodeID")) not in apart]
                asked = waiting_text(bundles, among, read_autoscaler() or scaler)
                return f"{asked.removeprefix('waiting ')}, to place {ask}"
            return f"for {ask}: {room(nodes)} node(s) have room now"

        while True:
            ready, _ = ray.wait([group.ready()], timeout=1.0)
            if ready:
                return
            if self.stopping.is_set():
                raise PlacementError("stopped while waiting for the placement group")
            now = time.monotonic()
            if now >= deadline:
                nodes = cluster_nodes()
                raise PlacementError(
                    f"waited {timeout:.0f} s {waiting(nodes)}; {cluster_text(nodes)}"
                )
            if now - looked >= PROGRESS_EVERY_S:
                looked = now
                nodes = cluster_nodes()
                text = f"waiting {waiting(nodes)}; {cluster_text(nodes)}"
                if text != last or now - said >= PROGRESS_REPEAT_S:
                    emit("progress", text=text)
                    last, said = text, now

    def start_nodes(self, listener: str, credentials: Sequence[str]) -> list[dict[str, Any]]:
        """One actor per bundle, each starting its node's dial-back process."""
        self.listener = listener
        self.actors = [self._new_actor(index) for index in range(len(self.bundles))]
        self.placed = self._start_actors(0, self.actors, credentials, self.timeout)
        with self.lock:
            self.waits = {a.wait.remote(): i for i, a in enumerate(self.actors)}
        return self.placed

    def _start_actors(
        self, first: int, actors: Sequence[Any], credentials: Sequence[str], timeout: float
    ) -> list[dict[str, Any]]:
        """What the actors of nodes ``first``, ``first + 1``... say of their nodes once each
        started its node's dial-back process, waited for up to ``timeout`` seconds."""
        import ray

        refs = [
            a.start.remote(self.listener, creds, self.python)
            for a, creds in zip(actors, credentials, strict=True)
        ]
        deadline = time.monotonic() + timeout
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            if self.stopping.is_set():
                raise PlacementError("stopped while the node actors started")
            if pending and time.monotonic() >= deadline:
                raise PlacementError(
                    f"{len(pending)} of {len(refs)} node actors did not start within "
                    f"{timeout:.0f} s (a runtime environment still being prepared?)"
                )
        return [self._result(first + i, ref) for i, ref in enumerate(refs)]

    def _new_actor(self, index: int) -> Any:
        """Node ``index``'s actor, in the node's bundle (`homes`)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        module, _, cls_name = HOST_CLASS.partition(":")
        host_class = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        bundle = self.bundles[index]
        group, in_group = self.homes[index]
        options: dict[str, Any] = {
            "name": actor_name(self.owner, self.session, index),
            "num_cpus": bundle.get("CPU", 0),
            "num_gpus": bundle.get("GPU", 0),
            # the bundle's custom resources are the actor's (Ray gives it their ids: TPUs)
            "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=in_group
            ),
        }
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        return ray.remote(host_class).options(**options).remote()

    def _result(self, index: int, ref: Any) -> dict[str, Any]:
        import ray

        try:
            value: dict[str, Any] = ray.get(ref)
        except Exception as err:
            raise PlacementError(f"node {index}'s actor failed: {explain(err)}") from None
        return value

    def watch(self) -> None:
        """Until stopped: say when a node's dial-back process or actor ends."""
        import ray

        while not self.stopping.is_set():
            with self.lock:
                watched = list(self.waits)
            if not watched:
                self.stopping.wait(REPLACE_POLL_S)
                continue
            done, _ = ray.wait(watched, timeout=1.0)
            for ref in done:
                try:
                    result = ray.get(ref)
                    detail = f"its dial-back process exited with {result.get('code')}"
                    if result.get("stderr"):
                        detail += f": {result['stderr'][-2000:]}"
                except Exception as err:  # the actor's worker or its Ray node is gone
                    detail = f"its Ray actor is gone ({type(err).__name__})"
                with self.lock:  # a node replaced meanwhile: its old actor's end is old news
                    node = self.waits.pop(ref, None)
                    if node is not None:
                        emit("node_exited", node=node, detail=detail)

    def release(self) -> None:
        import ray
        from ray.util import remove_placement_group

        with self.lock:
            actors = list(self.actors)
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        for group in [self.group, *self.grown]:
            if group is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(group)


class PlacementError(Exception):
    """The session cannot be placed; the message says what was asked and what there is."""


def explain(err: BaseException) -> str:
    """A Ray error in a line or a few, with what to do when the nodes lack jupyter_dist."""
    text = str(err).strip()
    if "No module named 'jupyter_dist" in text or "No module named jupyter_dist" in text:
        return (
            "the cluster's Python has no jupyter_dist: install "
            f"jupyter_dist=={__version__} on the cluster, or pass --ray-runtime-env "
            f'\'{{"pip": ["jupyter_dist=={__version__}"]}}\''
        )
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-12:]) if lines else type(err).__name__
