"""``python -m jupyter_dist.control.launchers.ray_driver``: one session's Ray driver.

The ``ray`` launcher (``ray.py``) runs this as a child process of the session's owner, so
that Ray's client, its threads and its logging stay out of the notebook kernel and the
Jupyter server, and so that whatever this session holds on the cluster is tied to one
process: Ray removes a driver's actors and placement groups when the driver ends, and this
driver ends when its stdin does (its owner stopped it), and with its owner (``--owner-pid``:
the kernel kills it when its owner ends, in every state, connecting included).

A node whose Ray node was lost is placed again on request: Ray reschedules the bundles of a
dead node on its own (a placement group's bundles on a node that dies are reserved again
elsewhere, before other placement groups are scheduled; with no room, the group waits,
partly placed, for a node to join); the driver waits for the node's bundle to be held
again, up to a bound, and starts a new actor in it.

It speaks JSON lines. On stdin, from the owner: the request (the cluster's address, the
bundles, the strategy, the names), then, once the driver said where it stands
(``connected``: its address), the listener the nodes dial and each node's credentials
(secret: they travel on this pipe and in the actors' arguments, never in a log, a
process title or an actor's name), then any number of ``{"op": "replace", "request": ID,
"node": N, "credentials": ..., "timeout": S}`` (node N's bundle held again and a new actor
in it, dialling the same listener with the node's fresh credentials), ``{"op": "grow",
"request": ID, "bundles": [...], "credentials": [...], "timeout": S}`` (nodes after the
current ones, one a bundle) and ``{"op": "shrink", "request": ID, "nodes": N}`` (the nodes
from N on given back), then ``{"op": "stop"}`` or the end of stdin. On stdout, events:
``connected`` (the address joined; how ``auto`` found it), ``progress``, ``placed`` (each
node's address and GPUs), ``failed`` (``unreachable``, ``not_found``: see ``ray_reach``),
``node_exited``, ``replaced`` (ID, N and the node's address and GPUs) or
``replace_failed`` (ID, N and why), ``grown`` (ID and the new nodes' addresses and GPUs)
or ``grow_failed`` (ID and why), ``shrunk`` (ID), ``released``.

A placement group cannot change its bundles, so a session that grows places its new nodes
in a group of their own, under the session's strategy as if they had been placed with the
others (``STRICT_SPREAD``: a label selector keeps them off every machine the session holds
a bundle on); one that shrinks gives such a group back once none of its nodes is left, and
keeps the bundles of its first group, which a later grow takes first.

Names: the placement group is ``jupyter_dist/OWNER/SESSION`` (a grow's
``jupyter_dist/OWNER/SESSION/grown-K``) and node N's actor ``jupyter_dist/OWNER/SESSION/N``,
in the ``jupyter_dist`` namespace, where OWNER is the owning process (``user@host/pid``).
Before placing, what an earlier run of the same name left (a restart of the session, a
driver that did not end) is removed; with ``--sweep`` the driver removes everything of an
owner prefix (a dead server's) and exits. Nothing else on the cluster is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jupyter_dist._version import __version__
from jupyter_dist.common.parent_death import die_with_parent
from jupyter_dist.control.launchers import ray_reach

log = logging.getLogger(__name__)
#: the Ray namespace of every session's actors and placement groups
NAMESPACE = "jupyter_dist"
#: the first word of every name this project gives on a cluster
NAME_PREFIX = "jupyter_dist/"
#: the node-side actor class, by module (the nodes import it; so must they have jupyter_dist)
HOST_CLASS = "jupyter_dist.node.ray_host:RayNodeHost"
#: seconds between looks at the cluster while the placement group waits for room; what it
#: sees is said when it changed, or again after `PROGRESS_REPEAT_S`
PROGRESS_EVERY_S = 3.0
PROGRESS_REPEAT_S = 30.0
#: the most bytes of one line the owner sends
MAX_LINE = 4 << 20
#: seconds between looks at a lost node's bundle and its new actor while they are awaited
REPLACE_POLL_S = 1.0
_emitting = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields}) + "\n"
    with _emitting:  # the watch and a replacement's thread both speak
        sys.stdout.write(line)
        sys.stdout.flush()


def read_line() -> dict[str, Any] | None:
    """The owner's next message, or None at the end of stdin."""
    line = sys.stdin.readline(MAX_LINE)
    if not line:
        return None
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


# -- what is asked and what the cluster has ------------------------------------------------
def bundle_text(bundle: Mapping[str, float]) -> str:
    """``{"GPU": 4, "CPU": 1}`` -> ``"4 GPUs, 1 CPU"``."""
    parts = []
    for key in ("GPU", "CPU"):
        count = bundle.get(key, 0)
        if count:
            parts.append(f"{_num(count)} {key}{'s' if count != 1 else ''}")
    parts += [f"{_num(v)} {k}" for k, v in bundle.items() if k not in ("GPU", "CPU") and v]
    return ", ".join(parts) or "nothing"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def ask_text(bundles: Sequence[Mapping[str, float]], strategy: str) -> str:
    """``"2 bundles of 4 GPUs, 1 CPU (STRICT_SPREAD: one machine each)"``."""
    texts = [bundle_text(b) for b in bundles]
    if len(set(texts)) == 1:
        what = f"{len(bundles)} bundle{'s' if len(bundles) != 1 else ''} of {texts[0]}"
    else:
        what = "bundles of " + "; ".join(texts)
    how = {"STRICT_SPREAD": "one machine each", "PACK": "as few machines as fit"}
    return f"{what} ({strategy}{': ' + how[strategy] if strategy in how else ''})"


def node_text(node: Mapping[str, Any], key: str = "Resources") -> str:
    resources = node.get(key) or {}
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU")}
    return f"{node.get('NodeManagerAddress', '?')} ({bundle_text(shown)})"


def cluster_text(nodes: Sequence[Mapping[str, Any]]) -> str:
    alive = [n for n in nodes if n.get("Alive")]
    listed = "; ".join(node_text(n) for n in alive[:16])
    more = f"; and {len(alive) - 16} more" if len(alive) > 16 else ""
    return f"the cluster has {len(alive)} node{'s' if len(alive) != 1 else ''}: {listed}{more}"


def fits(bundle: Mapping[str, float], resources: Mapping[str, float]) -> bool:
    return all(resources.get(k, 0) >= v for k, v in bundle.items() if v)


def infeasible(
    bundles: Sequence[Mapping[str, float]], strategy: str, nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no placement could ever hold the bundles on these nodes (their totals), or None."""
    totals = [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive")]
    for index, bundle in enumerate(bundles):
        if not any(fits(bundle, t) for t in totals):
            return f"no node can hold bundle {index} ({bundle_text(bundle)})"
    if strategy == "STRICT_SPREAD":
        # one machine each: match the largest bundles first, each to a free node it fits
        free = list(range(len(totals)))
        order = sorted(range(len(bundles)), key=lambda i: -sum(bundles[i].values()))
        for index in order:
            home = next((n for n in free if fits(bundles[index], totals[n])), None)
            if home is None:
                holding = sum(1 for t in totals if fits(bundles[index], t))
                return (
                    f"{len(bundles)} bundles need {len(bundles)} machines, and "
                    f"{holding} can hold one"
                )
            free.remove(home)
        return None
    for key in {k for b in bundles for k in b}:
        want = sum(b.get(key, 0) for b in bundles)
        have = sum(t.get(key, 0) for t in totals)
        if want > have:
            return f"{_num(want)} {key} asked in all, {_num(have)} in the cluster"
    return None


def free_nodes(bundles: Sequence[Mapping[str, float]], nodes: Sequence[Mapping[str, Any]]) -> int:
    """How many alive nodes could take one more bundle now (from what Ray says is free)."""
    from ray._private.state import available_resources_per_node

    available: dict[str, dict[str, float]] = available_resources_per_node()  # type: ignore[no-untyped-call]
    count = 0
    for node in nodes:
        if not node.get("Alive"):
            continue
        free = available.get(str(node.get("NodeID")), {})
        if any(fits(b, free) for b in bundles):
            count += 1
    return count


def cluster_nodes() -> list[dict[str, Any]]:
    """Ray's list of the cluster's nodes (``Alive``, ``Resources``, ``NodeManagerAddress``)."""
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def node_ip() -> str:
    """This process's address as Ray sees it."""
    import ray

    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return ip


# -- names ---------------------------------------------------------------------------------
def owner_prefix(owner: str) -> str:
    """The prefix of every name ``owner`` gives on a cluster: ``jupyter_dist/OWNER/``."""
    return f"{NAME_PREFIX}{owner}/"


def group_name(owner: str, session: str) -> str:
    return f"{owner_prefix(owner)}{session}"


def actor_name(owner: str, session: str, node: int) -> str:
    return f"{group_name(owner, session)}/{node}"


def remove_named(prefix: str, exact_group: str | None = None) -> list[str]:
    """Kill this namespace's actors named under ``prefix`` and remove its placement groups
    named ``exact_group`` or under ``prefix``; what was removed, by name."""
    import ray
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    removed = []
    for name in ray.util.list_named_actors(all_namespaces=False):
        if not name.startswith(prefix):
            continue
        with contextlib.suppress(ValueError):  # gone in between
            ray.kill(ray.get_actor(name), no_restart=True)
            removed.append(name)
    for pg_id, info in placement_group_table().items():
        name = str(info.get("name", ""))
        wanted = name == exact_group or name.startswith(prefix)
        if wanted and info.get("state") not in ("REMOVED",):
            pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id)))
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
                removed.append(name)
    return removed


# -- the session ---------------------------------------------------------------------------
class Driver:
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
        why = infeasible(self.bundles, self.strategy, nodes)
        if why is not None:
            raise PlacementError(f"cannot place {ask}: {why}; {cluster_text(nodes)}")
        self.group = placement_group(self.bundles, strategy=self.strategy, name=name)
        self.homes = [(self.group, index) for index in range(len(self.bundles))]
        self._wait_ready(self.group, self.bundles, ask, self.timeout)

    def _wait_ready(
        self,
        group: Any,
        bundles: Sequence[Mapping[str, float]],
        ask: str,
        timeout: float,
        apart: Collection[str] = (),
    ) -> None:
        """Until ``group`` is placed, saying how many nodes have room (none of ``apart``,
        Ray node ids) while it waits; `PlacementError` after ``timeout`` seconds."""
        import ray

        deadline = time.monotonic() + timeout
        looked = said = 0.0
        last = ""

        def room(nodes: list[dict[str, Any]]) -> int:
            return free_nodes(bundles, [n for n in nodes if str(n.get("NodeID")) not in apart])

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
                    f"waited {timeout:.0f} s for {ask}: {room(nodes)} node(s) have room "
                    f"now; {cluster_text(nodes)}"
                )
            if now - looked >= PROGRESS_EVERY_S:
                looked = now
                nodes = cluster_nodes()
                text = f"waiting for {ask}: {room(nodes)} node(s) have room now; " + cluster_text(
                    nodes
                )
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

    # -- a lost node placed again ----------------------------------------------------------
    def replace(self, request: Mapping[str, Any]) -> None:
        """Node ``request["node"]`` again: its old actor killed, its bundle held again (Ray
        reschedules a dead node's bundles on its own; this waits for it), a new actor in
        it started with the node's fresh credentials; says ``replaced`` or
        ``replace_failed``, with the request's id."""
        ident, index = request.get("request"), int(request["node"])
        try:
            if not 0 <= index < len(self.actors):
                raise PlacementError(f"node {index}: the session has {len(self.actors)} nodes")
            info = self._replace(index, str(request["credentials"]), float(request["timeout"]))
        except Exception as err:
            why = str(err) if isinstance(err, PlacementError) else f"Ray: {explain(err)}"
            emit("replace_failed", request=ident, node=index, error=why)
            return
        emit("replaced", request=ident, node=index, info=info)

    def _replace(self, index: int, credentials: str, timeout: float) -> dict[str, Any]:
        import ray

        deadline = time.monotonic() + timeout
        with self.lock:
            old = self.actors[index]
            for ref in [r for r, n in self.waits.items() if n == index]:
                del self.waits[ref]
        with contextlib.suppress(Exception):  # gone with its node, most often
            ray.kill(old, no_restart=True)
        self._await_bundle(index, deadline, timeout)
        actor = self._named_actor(index, deadline)
        with self.lock:
            self.actors[index] = actor  # released with the session from now on
        try:
            info = self._started(index, actor, credentials, deadline, timeout)
        except BaseException:
            with contextlib.suppress(Exception):  # it must not dial in later
                ray.kill(actor, no_restart=True)
            raise
        with self.lock:
            self.placed[index] = info
            self.waits[actor.wait.remote()] = index
        return info

    def _started(
        self, index: int, actor: Any, credentials: str, deadline: float, timeout: float
    ) -> dict[str, Any]:
        """What node ``index``'s new actor says of its node once it started the node's
        dial-back process, waited for until ``deadline``."""
        import ray

        ref = actor.start.remote(self.listener, credentials, self.python)
        said = 0.0
        while not ray.wait([ref], timeout=REPLACE_POLL_S)[0]:
            if self.stopping.is_set():
                raise PlacementError("stopped while the node's new actor started")
            now = time.monotonic()
            if now >= deadline:
                raise PlacementError(
                    f"node {index}: its new actor did not start within {timeout:.0f} s (a "
                    "runtime environment still being prepared, or Ray not yet aware that "
                    "the node it waits on is gone?)"
                )
            if now - said >= PROGRESS_REPEAT_S:
                said = now
                emit("progress", text=f"node {index}: waiting for its new Ray actor to start")
        return self._result(index, ref)

    def _await_bundle(self, index: int, deadline: float, timeout: float) -> None:
        """Until bundle ``index`` is held on a node that is alive, saying what it waits for;
        `PlacementError` naming the bundle and the cluster at ``deadline``."""
        bundle = self.bundles[index]
        ask = f"bundle {index} ({bundle_text(bundle)}, {self.strategy}"
        ask += ": apart from the other nodes' bundles)" if self.strategy == "STRICT_SPREAD" else ")"
        lost = str(self.placed[index].get("node_id", "")) if index < len(self.placed) else ""
        looked = said = 0.0
        last = ""
        while True:
            home, state = self.bundle_home(index)
            nodes = cluster_nodes()
            if any(n.get("Alive") and str(n.get("NodeID")) == home for n in nodes):
                if home != lost:
                    emit("progress", text=f"node {index}: Ray placed {ask} again")
                return
            if self.stopping.is_set():
                raise PlacementError(f"stopped while waiting for Ray to place {ask} again")
            now = time.monotonic()
            if now >= deadline:
                raise PlacementError(
                    f"node {index}: waited {timeout:.0f} s for Ray to place {ask} again "
                    f"(the placement group is {state}): "
                    f"{free_nodes([bundle], nodes)} node(s) have room now; {cluster_text(nodes)}"
                )
            if now - looked >= PROGRESS_EVERY_S:
                looked = now
                text = (
                    f"node {index}: waiting for Ray to place {ask} again (its Ray node is "
                    f"gone): {free_nodes([bundle], nodes)} node(s) have room now; "
                    f"{cluster_text(nodes)}"
                )
                if text != last or now - said >= PROGRESS_REPEAT_S:
                    emit("progress", text=text)
                    last, said = text, now
            time.sleep(REPLACE_POLL_S)

    def bundle_home(self, index: int) -> tuple[str, str]:
        """The id of the Ray node holding bundle ``index`` (``""`` while none does) and the
        placement group's state (``CREATED``, ``RESCHEDULING``, ...)."""
        from ray.util import placement_group_table

        group, in_group = self.homes[index]
        table = placement_group_table(group)
        home = table.get("bundles_to_node_id", {}).get(in_group)
        return str(home or ""), str(table.get("state", "?"))

    def _named_actor(self, index: int, deadline: float) -> Any:
        """A new actor for node ``index`` under its usual name, once the old one let go
        of it (Ray frees a killed actor's name a moment later)."""
        while True:
            try:
                return self._new_actor(index)
            except ValueError:  # the name is still the old actor's
                if time.monotonic() >= deadline or self.stopping.is_set():
                    raise
                time.sleep(0.2)

    # -- a live session resized --------------------------------------------------------------
    def grow(self, request: Mapping[str, Any]) -> None:
        """Nodes after the current ones, one a bundle of ``request["bundles"]``: held (a
        bundle a shrink left idle, else a new placement group, `_place_more`) and an actor
        started in each with its credentials; says ``grown`` with what each node's actor
        said of it, or ``grow_failed`` why, holding no more than before."""
        ident = request.get("request")
        try:
            infos = self._grow(
                [{k: float(v) for k, v in b.items()} for b in request["bundles"]],
                [str(c) for c in request["credentials"]],
                float(request["timeout"]),
            )
        except Exception as err:
            why = str(err) if isinstance(err, PlacementError) else f"Ray: {explain(err)}"
            emit("grow_failed", request=ident, error=why)
            return
        emit("grown", request=ident, nodes=infos)

    def _grow(
        self, bundles: list[dict[str, float]], credentials: list[str], timeout: float
    ) -> list[dict[str, Any]]:
        import ray
        from ray.util import remove_placement_group

        deadline = time.monotonic() + timeout
        first = len(self.actors)
        homes: list[tuple[Any, int] | None] = []
        taken = []
        for bundle in bundles:
            held = next((h for h in self.idle if h[2] == bundle), None)
            if held is not None:
                self.idle.remove(held)
                taken.append(held)
            homes.append(None if held is None else (held[0], held[1]))
        need = [i for i, home in enumerate(homes) if home is None]
        group: Any = None
        actors: list[Any] = []
        try:
            if need:
                group = self._place_more([bundles[i] for i in need], first, timeout)
                for in_group, i in enumerate(need):
                    homes[i] = (group, in_group)
            with self.lock:
                self.homes += [h for h in homes if h is not None]
                self.bundles += bundles
            for i in range(len(bundles)):
                actors.append(self._named_actor(first + i, deadline))
            infos = self._start_actors(
                first, actors, credentials, max(deadline - time.monotonic(), 1.0)
            )
        except BaseException:
            for actor in actors:
                with contextlib.suppress(Exception):  # it must not dial in later
                    ray.kill(actor, no_restart=True)
            with self.lock:
                del self.homes[first:], self.bundles[first:]
            self.idle += taken
            if group is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(group)
            raise
        if group is not None:
            self.grown.append(group)
        with self.lock:
            self.actors += actors
            self.placed += infos
            for i, actor in enumerate(actors):
                self.waits[actor.wait.remote()] = first + i
        return infos

    def _place_more(self, bundles: list[dict[str, float]], first: int, timeout: float) -> Any:
        """A new placement group for nodes ``first``... (their ``bundles``), under the
        session's strategy as if they had been placed with the others: apart from every
        machine the session holds a bundle on (``STRICT_SPREAD``), on its one machine
        (``STRICT_PACK``); waited for, saying what for."""
        from ray.util import placement_group_table
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

        held = sorted(
            {
                str(node_id)
                for group in [self.group, *self.grown]
                for node_id in placement_group_table(group).get("bundles_to_node_id", {}).values()
                if node_id
            }
        )
        nodes = cluster_nodes()
        ask = ask_text(bundles, self.strategy)
        selector: list[dict[str, str]] | None = None
        others = nodes
        if self.strategy == "STRICT_SPREAD" and held:
            ask += f" apart from the {len(held)} machine(s) the session holds"
            selector = [{NODE_ID_LABEL_KEY: f"!in({','.join(held)})"}] * len(bundles)
            others = [n for n in nodes if str(n.get("NodeID")) not in held]
        elif self.strategy == "STRICT_PACK" and held:
            ask += " beside the session's other nodes"
            selector = [{NODE_ID_LABEL_KEY: held[0]}] * len(bundles)
            others = [n for n in nodes if str(n.get("NodeID")) == held[0]]
        why = infeasible(bundles, self.strategy, others)
        if why is not None:
            raise PlacementError(f"cannot place {ask}: {why}; {cluster_text(nodes)}")
        self.grows += 1
        name = f"{group_name(self.owner, self.session)}/grown-{self.grows}"
        group = placement_group(
            bundles, strategy=self.strategy, name=name, bundle_label_selector=selector
        )
        emit("progress", text=f"nodes {first}-{first + len(bundles) - 1}: asking Ray for {ask}")
        try:
            self._wait_ready(group, bundles, ask, timeout, apart=held if selector else ())
        except BaseException:
            from ray.util import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(group)
            raise
        return group

    def shrink(self, request: Mapping[str, Any]) -> None:
        """Only the first ``request["nodes"]`` nodes from now on: the others' actors are
        killed (their agents stopped already), their bundles given back with their
        placement group where a grow made it for them alone, else kept for a later grow;
        says ``shrunk``."""
        import ray
        from ray.util import remove_placement_group

        ident, count = request.get("request"), int(request["nodes"])
        with self.lock:
            actors, gone = self.actors[count:], self.homes[count:]
            bundles = self.bundles[count:]
            del self.actors[count:], self.placed[count:], self.homes[count:], self.bundles[count:]
            for ref in [r for r, n in self.waits.items() if n >= count]:
                del self.waits[ref]  # their ends are no news
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self.idle += [(group, i, b) for (group, i), b in zip(gone, bundles, strict=True)]
        for group in list(self.grown):
            if not any(home[0] is group for home in self.homes):
                self.grown.remove(group)
                self.idle = [h for h in self.idle if h[0] is not group]
                with contextlib.suppress(Exception):
                    remove_placement_group(group)
        emit("shrunk", request=ident, nodes=count)

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


def serve(request: Mapping[str, Any]) -> int:
    import ray

    driver = Driver(request)

    def stdin_ended() -> None:
        with contextlib.suppress(Exception):
            while True:
                message = read_line()
                if message is None or message.get("op") == "stop":
                    break
                op = message.get("op")
                work = {"replace": driver.replace, "grow": driver.grow, "shrink": driver.shrink}
                if op in work:
                    threading.Thread(
                        target=work[op], args=(message,), name=str(op), daemon=True
                    ).start()
        driver.stopping.set()

    connected = ray_reach.connect(str(request["address"]), NAMESPACE)
    if connected.pop("failed", False):
        emit("failed", **connected)
        return 1
    try:
        emit("connected", **connected)
        nodes = read_line()
        if nodes is None:
            return 0
        threading.Thread(target=stdin_ended, name="stdin", daemon=True).start()
        driver.place()
        placed = driver.start_nodes(str(nodes["listener"]), list(nodes["credentials"]))
        emit("placed", nodes=placed)
        driver.watch()
        return 0
    except PlacementError as err:
        emit("failed", error=str(err))
        return 1
    except Exception as err:
        emit("failed", error=f"Ray: {explain(err)}")
        return 1
    finally:
        driver.release()
        emit("released")
        with contextlib.suppress(Exception):
            ray.shutdown()


def sweep(address: str, prefix: str) -> int:
    """Remove everything named under ``prefix`` (a dead owner's) and say what, as JSON."""
    import ray

    if not prefix.startswith(NAME_PREFIX) or prefix.count("/") < 3:
        print(f"--sweep {prefix!r}: expected {NAME_PREFIX}USER@HOST/PID/", file=sys.stderr)
        return 2
    ray.init(
        address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING
    )
    try:
        emit("swept", removed=remove_named(prefix))
    finally:
        ray.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_dist.control.launchers.ray_driver")
    parser.add_argument("--sweep", default=None, help="remove what this owner prefix left")
    parser.add_argument("--address", default="auto", help="with --sweep: the cluster")
    parser.add_argument(
        "--owner-pid", type=int, default=None, help="end with this process (this one's parent)"
    )
    args = parser.parse_args(argv)
    if args.owner_pid is not None:
        # in every state, connecting included (blocked inside Ray, where no thread of ours
        # runs): Ray removes what a driver that ended held
        die_with_parent(args.owner_pid)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    ray_reach.bound_environment(os.environ)  # before Ray is imported: it reads them once
    if args.sweep is not None:
        return sweep(args.address, args.sweep)
    try:
        request = read_line()
    except ValueError as err:
        emit("failed", error=f"bad request: {err}")
        return 2
    if request is None:
        return 0
    return serve(request)


if __name__ == "__main__":
    sys.exit(main())
