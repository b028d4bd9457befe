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

This module is the driver's entry point and its conversation with the owner; its parts:
``ray_reach`` (reaching the cluster), ``ray_cluster`` (what is asked and what the cluster
has, in words; the names), ``ray_driver_nodes`` (the nodes placed, watched and given back)
and ``ray_driver_changes`` (a lost node placed again, a resize).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from jupyter_dist.common.parent_death import die_with_parent
from jupyter_dist.control.launchers import ray_reach
from jupyter_dist.control.launchers.ray_cluster import NAME_PREFIX, NAMESPACE, remove_named
from jupyter_dist.control.launchers.ray_driver_changes import Driver
from jupyter_dist.control.launchers.ray_driver_nodes import PlacementError, emit, explain

log = logging.getLogger(__name__)
#: the most bytes of one line the owner sends
MAX_LINE = 4 << 20


def read_line() -> dict[str, Any] | None:
    """The owner's next message, or None at the end of stdin."""
    line = sys.stdin.readline(MAX_LINE)
    if not line:
        return None
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


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
