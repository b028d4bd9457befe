"""Launchers start a node's agent; one module per kind, found by short name.

Kinds are registered in the ``jupyter_dist.launchers`` entry-point group, so another
package can add one (``local`` ships here; ``ssh`` and ``slurm`` come as their own modules).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from jupyter_dist.errors import SpecError
from jupyter_dist.launchers.base import AgentStreams, Launcher
from jupyter_dist.spec import SessionSpec

ENTRY_POINT_GROUP = "jupyter_dist.launchers"


def launcher_class(kind: str) -> type[Launcher]:
    """The launcher class registered as ``kind``."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if kind not in found:
        if kind == "local":  # running from a source tree that was never installed
            from jupyter_dist.launchers.local import LocalLauncher

            return LocalLauncher
        raise SpecError(f"launcher {kind!r}: expected one of {', '.join(sorted(found))}")
    cls = found[kind].load()
    if not (isinstance(cls, type) and issubclass(cls, Launcher)):
        raise SpecError(f"launcher {kind!r} does not name a jupyter_dist Launcher class")
    return cls


def launcher_for(spec: SessionSpec, node: int) -> Launcher:
    """The launcher of node ``node`` of a session: the spec's kind for listed hosts
    (``ssh`` or ``slurm``), else ``local``."""
    if spec.hosts:
        remote: Any = launcher_class(spec.launcher)
        launcher: Launcher = remote(
            spec.hosts[node], python=spec.python, ssh_config=spec.ssh_config
        )
        return launcher
    return launcher_class("local")()


__all__ = ["ENTRY_POINT_GROUP", "AgentStreams", "Launcher", "launcher_class", "launcher_for"]
