"""Launchers start a node's agent; one module per kind, found by short name.

Kinds are registered in the ``jupyter_dist.launchers`` entry-point group, so another
package can add one (``local`` ships here; ``ssh``, ``slurm`` and ``ray`` come as their
own modules). A kind whose nodes a cluster manager places (``ray``) also has a
`Placement` per session.
``dial_back`` is no kind of its own: its launchers come from a session's
`dial_back.DialBackListener` (``Session(launchers=listener.launcher)``), which holds the keys.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, cast

from jupyter_dist.common.spec import SessionSpec
from jupyter_dist.control.launchers.base import AgentStreams, Launcher, Placement
from jupyter_dist.errors import SpecError

ENTRY_POINT_GROUP = "jupyter_dist.launchers"  # a public name: plug-ins register under it
#: the kinds that ship here, found without entry points (a stale or missing install's
#: metadata cannot send ``local`` to a module that no longer exists)
BUILTIN = {
    "local": "jupyter_dist.control.launchers.local:LocalLauncher",
    "ssh": "jupyter_dist.control.launchers.ssh:SSHLauncher",
    "slurm": "jupyter_dist.control.launchers.slurm:SlurmLauncher",
    "ray": "jupyter_dist.control.launchers.ray:RayLauncher",
    "k8s": "jupyter_dist.control.launchers.k8s:K8sLauncher",
}


def _load(target: str) -> object:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def launcher_class(kind: str) -> type[Launcher]:
    """The launcher class registered as ``kind``: a built-in one, else a plug-in's."""
    if kind in BUILTIN:
        cls = _load(BUILTIN[kind])
    else:
        found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        if kind not in found:
            known = sorted({*BUILTIN, *found})
            raise SpecError(f"launcher {kind!r}: expected one of {', '.join(known)}")
        cls = found[kind].load()
    if not (isinstance(cls, type) and issubclass(cls, Launcher)):
        raise SpecError(f"launcher {kind!r} does not name a jupyter_dist Launcher class")
    return cls


def placement_for(spec: SessionSpec, env: Mapping[str, str]) -> Placement | None:
    """The session-wide part of the spec's kind (``ray`` places its nodes on the
    cluster), or None for kinds that start each node on its own."""
    if spec.launcher == "local":
        return None
    return launcher_class(spec.launcher).placement(spec, env)


def launcher_for(spec: SessionSpec, node: int) -> Launcher:
    """The launcher of node ``node`` of a session: the spec's kind for listed hosts
    (``ssh`` or ``slurm``), else ``local``."""
    if spec.hosts:
        remote: Any = launcher_class(spec.launcher)
        launcher: Launcher = remote(
            spec.hosts[node], python=spec.python, ssh_config=spec.ssh_config
        )
        return launcher
    local: Any = launcher_class("local")
    return cast(Launcher, local(python=spec.python))


__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "AgentStreams",
    "Launcher",
    "Placement",
    "launcher_class",
    "launcher_for",
    "placement_for",
]
