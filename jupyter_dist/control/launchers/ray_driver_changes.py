"""A live session's nodes changed by its Ray driver: a lost node placed again, nodes added
or removed.

`Driver` is `ray_driver_nodes.PlacedSession` with the owner's requests that change the
nodes, each run in a thread of its own while the session is watched: ``replace`` (Ray
reschedules a dead node's bundles on its own; the driver waits for the node's bundle and
starts a new actor in it), ``grow`` (a placement group of their own for the new nodes,
under the session's strategy as if placed with the others) and ``shrink``.

Part of the session's driver process (``ray_driver``): Ray is imported inside functions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from jupyter_dist.control.launchers.ray_cluster import (
    ask_text,
    bundle_text,
    cluster_nodes,
    cluster_text,
    free_nodes,
    group_name,
)
from jupyter_dist.control.launchers.ray_driver_nodes import (
    PROGRESS_EVERY_S,
    PROGRESS_REPEAT_S,
    REPLACE_POLL_S,
    PlacedSession,
    PlacementError,
    emit,
    explain,
)


class Driver(PlacedSession):
    """A session's placement that the owner may change while it is watched."""

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
        scaler = self.autoscaler_for(bundles, ask, nodes, others)
        self.grows += 1
        name = f"{group_name(self.owner, self.session)}/grown-{self.grows}"
        group = placement_group(
            bundles, strategy=self.strategy, name=name, bundle_label_selector=selector
        )
        emit("progress", text=f"nodes {first}-{first + len(bundles) - 1}: asking Ray for {ask}")
        try:
            self._wait_ready(
                group, bundles, ask, timeout, apart=held if selector else (), scaler=scaler
            )
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
