"""What agents and ranks are called in ``ps``, ``top`` and ``nvidia-smi``, and how a
command line is recognised as one of ours.

Every agent starts as ``python -m jupyter_dist.node`` and every rank (and the node's
IOPub relay) is forked from its agent, so without help they all look alike. Each sets a
title instead: ``jupyter_dist agent node 1 session train``, ``jupyter_dist rank 3/8
session train`` and ``jupyter_dist relay node 1 session train`` (``/proc/PID/cmdline``,
what ``ps`` and ``nvidia-smi`` show), and a short name, ``jd-agent-1``, ``jd-rank-3`` and
``jd-relay-1`` (``/proc/PID/comm``, at most 15 bytes, what ``top`` shows).
`setproctitle` does the work; where it cannot be imported the process keeps its command
line.

The title replaces the command line in place and is cut to its length, which every
launcher's command line exceeds; ``/proc/PID/environ`` is left as it was (``SPT_NOENV``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

#: every title starts with this word
TITLE_PREFIX = "jupyter_dist"
#: the module every launcher runs (``control.launchers.base.AGENT_MODULE``)
AGENT_MODULE_NAME = "jupyter_dist.node"
#: the agent's node rank, in its environment (the ranks get the same value anyway)
NODE_RANK_VAR = "NODE_RANK"
#: the kernel's ``comm`` holds 15 bytes and a terminating NUL
COMM_BYTES = 15

_setproctitle: Any = None
_loaded = False


def agent_title(session: str, node: int | None) -> str:
    where = f"node {node} " if node is not None else ""
    return f"{TITLE_PREFIX} agent {where}session {session}"


def agent_short_name(node: int | None) -> str:
    return f"jd-agent-{node}" if node is not None else "jd-agent"


def rank_title(rank: int, world_size: int | None, session: str) -> str:
    of = f"/{world_size}" if world_size is not None else ""
    return f"{TITLE_PREFIX} rank {rank}{of} session {session}"


def rank_short_name(rank: int) -> str:
    return f"jd-rank-{rank}"


def relay_title(session: str, node: int | None) -> str:
    where = f"node {node} " if node is not None else ""
    return f"{TITLE_PREFIX} relay {where}session {session}"


def relay_short_name(node: int | None) -> str:
    return f"jd-relay-{node}" if node is not None else "jd-relay"


def _module() -> Any:
    """`setproctitle`, loaded once; None where it is not installed or does not load."""
    global _setproctitle, _loaded
    if not _loaded:
        _loaded = True
        try:
            import setproctitle
        except Exception:  # an optional nicety: never a reason for an agent not to start
            return None
        _setproctitle = setproctitle
    return _setproctitle


def set_title(title: str, short_name: str) -> bool:
    """Show this process as ``title`` (command line) and ``short_name`` (``comm``).
    Returns whether it could; without `setproctitle` it does nothing."""
    module = _module()
    if module is None:
        return False
    # read when the first title is set: keep /proc/PID/environ intact (tools and tests
    # read it); the title is then limited to the length of the original command line
    had = os.environ.get("SPT_NOENV")
    os.environ["SPT_NOENV"] = "1"
    try:
        module.setproctitle(title)
        module.setthreadtitle(short_name[:COMM_BYTES])
    except Exception:
        return False
    finally:
        if had is None:
            os.environ.pop("SPT_NOENV", None)
        else:
            os.environ["SPT_NOENV"] = had
    return True


def command_line(argv: Sequence[str]) -> tuple[str, ...]:
    """A command line as ``/proc/PID/cmdline`` splits it, without the empty strings a
    title's padding leaves at its end."""
    args = list(argv)
    while args and not args[-1]:
        args.pop()
    return tuple(args)


def is_ours(argv: Sequence[str]) -> bool:
    """Whether a command line is one of our agents, ranks or relays: titled, or still running
    ``-m jupyter_dist.node`` (no `setproctitle`, or a rank of such an agent)."""
    args = command_line(argv)
    kinds = ("agent", "rank", "relay")
    if " ".join(args).startswith(tuple(f"{TITLE_PREFIX} {kind} " for kind in kinds)):
        return True
    return any(a == "-m" and b == AGENT_MODULE_NAME for a, b in itertools.pairwise(args))


__all__ = [
    "AGENT_MODULE_NAME",
    "NODE_RANK_VAR",
    "TITLE_PREFIX",
    "agent_short_name",
    "agent_title",
    "command_line",
    "is_ours",
    "rank_short_name",
    "rank_title",
    "relay_short_name",
    "relay_title",
    "set_title",
]
