"""Every ``JUPYTER_DIST_*`` environment variable, defined once, and how a number of
seconds is read from one.

* ``JUPYTER_DIST_OUTPUT`` (notebook: magics): ``auto``, ``widget`` or ``text``, the cell
  view.
* ``JUPYTER_DIST_OUTPUT_LIMIT`` (notebook: display): each rank's text a cell passes on
  (``2M`` by default; ``0``: no limit).
* ``JUPYTER_DIST_SERVER`` (notebook: server client): ``none`` keeps sessions in the kernel
  under a server.
* ``JUPYTER_DIST_STRAGGLER_S`` (control plane): seconds before ranks still running beside
  finished ones are named.
* ``JUPYTER_DIST_ABORT_AFTER_S`` (control plane): seconds the other ranks get after one
  fails, before they are interrupted.
* ``JUPYTER_DIST_MASTER_PORTS`` (control plane, node agent): ``lo-hi``, the ports
  MASTER_PORT may take.
* ``JUPYTER_DIST_MAX_RANKS_PER_NODE`` (control plane): the most ranks a session may start
  on one node (default: twice this machine's CPU count, at least 8; under a Jupyter
  server, its ``DistServerApp.max_ranks_per_node`` comes first, and its
  ``max_ranks_per_node_all_sessions``, when set, caps all its sessions together).
* ``JUPYTER_DIST_NODE_RELAY`` (control plane): ``on`` (the default) talks to a node's
  ranks through its relay (`node.relay`); ``off`` to each rank on its own sockets, to
  compare or to rule the relay out.
* ``JUPYTER_DIST_SHARED_PUSH`` (control plane): ``on`` (the default) hands a large push to
  the ranks of this machine through a file in ``/dev/shm`` (`common.shared_push`);
  ``off`` sends it through the sockets.
* ``JUPYTER_DIST_NODE_DEADLINE_S`` (control plane): seconds a node's agent may stay
  silent before the node counts as unreachable (20 by default; it is pinged every quarter
  of that, and stops its ranks after twice that without a word from the notebook side).
* ``JUPYTER_DIST_SESSION``, ``JUPYTER_DIST_DEVICE``, ``JUPYTER_DIST_BACKEND``,
  ``JUPYTER_DIST_FRAMEWORK`` (rank, set by the control plane): the session's name, ``cuda``
  or ``cpu``, the process group's backend, what the bootstrap prepares (``torch``, ``jax``
  or ``none``).
* ``JUPYTER_DIST_K8S_POD`` (control plane, ``--k8s``): the name of the pod the notebook
  runs in (default: ``HOSTNAME``, which Kubernetes sets to it); its IP is where the
  session's pods dial back, its image their default, and it owns what the session makes.
* ``JUPYTER_DIST_NODE_CREDENTIALS`` (a ``--k8s`` pod, set from the session's Secret): the
  nodes' dial-back keys, read once by `node.dial_back` and removed from its environment.
* ``JUPYTER_DIST_INTERRUPT_ACK_S`` (control plane): seconds an interrupted rank has to say
  that Python took the interrupt (10 by default) before its stack is looked at: one that
  is outside Python then (C code, a collective) is stuck and replaced.
* ``JUPYTER_DIST_GENERATION`` (rank, set by the control plane): which process group of
  the session the rank joined (0 at the start, one more at each regroup).

The first ten, ``JUPYTER_DIST_K8S_POD`` and ``JUPYTER_DIST_INTERRUPT_ACK_S`` are the
user's to set; the rest are set by
jupyter_dist (the rank's four on every rank, as torchrun's own variables are). A test
checks that no module names a ``JUPYTER_DIST_`` variable anywhere but here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

from jupyter_dist.errors import SpecError

OUTPUT_VAR = "JUPYTER_DIST_OUTPUT"
OUTPUT_LIMIT_VAR = "JUPYTER_DIST_OUTPUT_LIMIT"
SERVER_CHOICE_VAR = "JUPYTER_DIST_SERVER"
STRAGGLER_VAR = "JUPYTER_DIST_STRAGGLER_S"
ABORT_AFTER_VAR = "JUPYTER_DIST_ABORT_AFTER_S"
MASTER_PORTS_VAR = "JUPYTER_DIST_MASTER_PORTS"
MAX_RANKS_VAR = "JUPYTER_DIST_MAX_RANKS_PER_NODE"
NODE_RELAY_VAR = "JUPYTER_DIST_NODE_RELAY"
SHARED_PUSH_VAR = "JUPYTER_DIST_SHARED_PUSH"
NODE_DEADLINE_VAR = "JUPYTER_DIST_NODE_DEADLINE_S"
SESSION_VAR = "JUPYTER_DIST_SESSION"
DEVICE_VAR = "JUPYTER_DIST_DEVICE"
BACKEND_VAR = "JUPYTER_DIST_BACKEND"
FRAMEWORK_VAR = "JUPYTER_DIST_FRAMEWORK"
K8S_POD_VAR = "JUPYTER_DIST_K8S_POD"
NODE_CREDENTIALS_VAR = "JUPYTER_DIST_NODE_CREDENTIALS"
INTERRUPT_ACK_VAR = "JUPYTER_DIST_INTERRUPT_ACK_S"
GENERATION_VAR = "JUPYTER_DIST_GENERATION"

ALL_VARS = (
    OUTPUT_VAR,
    OUTPUT_LIMIT_VAR,
    SERVER_CHOICE_VAR,
    STRAGGLER_VAR,
    ABORT_AFTER_VAR,
    MASTER_PORTS_VAR,
    MAX_RANKS_VAR,
    NODE_RELAY_VAR,
    SHARED_PUSH_VAR,
    NODE_DEADLINE_VAR,
    SESSION_VAR,
    DEVICE_VAR,
    BACKEND_VAR,
    FRAMEWORK_VAR,
    K8S_POD_VAR,
    NODE_CREDENTIALS_VAR,
    INTERRUPT_ACK_VAR,
    GENERATION_VAR,
)


def seconds_from_env(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A finite positive number of seconds from the environment variable ``name``."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError(f"{name}={raw!r}: expected a positive number of seconds")
    return value


def default_max_ranks() -> int:
    """Ranks per node when nothing says otherwise: twice this machine's CPUs (trying code
    out on more ranks than cores is common), at least 8."""
    return max(8, 2 * (os.cpu_count() or 1))


def max_ranks_per_node(environ: Mapping[str, str] | None = None) -> int:
    """The most ranks a session may start on one node: ``JUPYTER_DIST_MAX_RANKS_PER_NODE``,
    else `default_max_ranks`."""
    raw = (os.environ if environ is None else environ).get(MAX_RANKS_VAR, "").strip()
    if not raw:
        return default_max_ranks()
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        raise SpecError(f"{MAX_RANKS_VAR}={raw[:40]!r}: expected a whole number of at least 1")
    return int(raw)


def node_relay(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ranks are read through their node's relay: ``JUPYTER_DIST_NODE_RELAY``."""
    return _switch(NODE_RELAY_VAR, environ)


def shared_push(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a large push to this machine's ranks goes through shared memory:
    ``JUPYTER_DIST_SHARED_PUSH``."""
    return _switch(SHARED_PUSH_VAR, environ)


def _switch(name: str, environ: Mapping[str, str] | None) -> bool:
    """``on`` (the default, also when unset) or ``off``."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if raw.lower() in ("", "on"):
        return True
    if raw.lower() == "off":
        return False
    raise SpecError(f"{name}={raw[:40]!r}: expected on or off")
