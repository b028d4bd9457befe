"""The launcher interface: start a node's agent and hand back its JSON-lines streams."""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from jupyter_dist.common.payloads import ClusterHold
    from jupyter_dist.common.spec import SessionSpec

from jupyter_dist._version import __version__
from jupyter_dist.errors import AgentError

#: the module every launcher runs on a node: ``python -m jupyter_dist.node``
AGENT_MODULE = "jupyter_dist.node"
_NO_PACKAGE = re.compile(r"No module named '?jupyter_dist'?(?![.\w])")
_NO_AGENT_MODULE = re.compile(r"No module named '?" + re.escape(AGENT_MODULE))


def install_hint(stderr: str) -> str | None:
    """What to do when a node's Python cannot run the agent: it has no jupyter_dist, or
    one older than this notebook's (from before the agent was ``jupyter_dist.node``)."""
    if _NO_PACKAGE.search(stderr):
        return f"install jupyter_dist=={__version__} in that node's Python, or pass --python"
    if _NO_AGENT_MODULE.search(stderr):
        return (
            f"that node's jupyter_dist is older than this notebook's {__version__}; "
            f"install jupyter_dist=={__version__} there, or pass --python"
        )
    return None


def with_install_hint(stderr: str) -> str:
    """``stderr`` with `install_hint`'s advice after it, when it applies."""
    hint = install_hint(stderr)
    return f"{stderr}\n({hint})" if hint else stderr


class LineReader(Protocol):
    """What the agent's stdout is read with: up to ``n`` bytes, ``b""`` at its end."""

    async def read(self, n: int = -1) -> bytes: ...


class LineWriter(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


@dataclass
class AgentStreams:
    """The agent's protocol channel: we write commands, we read events.

    asyncio's subprocess pipes and asyncssh's process streams both fit.
    """

    reader: LineReader
    writer: LineWriter


class Placement(abc.ABC):
    """What a cluster manager does for a whole session, around its nodes' launchers: find
    and hold the machines before any agent starts (`place`), hand out each node's
    launcher (`launcher`), and give the machines back after the last agent stopped
    (`release`). Kinds whose nodes are listed hosts need none (`Launcher.placement`)."""

    @abc.abstractmethod
    async def place(self, progress: Callable[[str], None], timeout: float) -> None:
        """Hold the session's machines, saying what it waits for; raise `AgentError`
        naming what was asked and what there is when it cannot, leaving nothing behind."""

    @abc.abstractmethod
    def launcher(self, spec: SessionSpec, node: int) -> Launcher:
        """Node ``node``'s launcher, once placed."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give back everything `place` took; safe to call twice, and after a failed place."""

    async def replace_node(
        self, node: int, progress: Callable[[str], None], timeout: float
    ) -> None:
        """Hold a machine again for node ``node``, whose machine (its Ray node, its pod)
        was lost, so that `launcher` then starts its agent there: the kind's own way of
        taking a lost node's place (another bundle, a new pod of the same index). Raise
        `AgentError` saying why when there is none; the session stays degraded."""
        raise AgentError(
            f"starting lost node {node} again on its cluster is not supported for "
            f"{type(self).__name__}"
        )

    #: whether `resize` can add and remove nodes of a live session
    resizable: ClassVar[bool] = False

    async def resize(
        self, spec: SessionSpec, progress: Callable[[str], None], timeout: float
    ) -> None:
        """Hold the machines of ``spec``'s nodes, the session resized (it kept its first
        nodes): the nodes past the current ones are placed, so that `launcher` then starts
        their agents; or the machines of the nodes past ``spec.nodes``, whose agents
        stopped, are given back. Raise `AgentError` saying why when the cluster cannot
        hold the new nodes, then holding no more than before."""
        raise AgentError(
            f"adding or removing nodes of a live session is not supported for {type(self).__name__}"
        )

    def hold(self) -> ClusterHold | None:
        """What the session holds on the cluster, by name, so that a later process can
        sweep it when this one died (None: nothing named)."""
        return None


class Launcher(abc.ABC):
    """Starts, signals and stops one node's agent.

    Implementations are serialisable (`to_dict`) so that a later process can find and
    reap what an earlier one started.
    """

    kind: ClassVar[str]

    @classmethod
    def placement(cls, spec: SessionSpec, env: Mapping[str, str]) -> Placement | None:
        """The session-wide part of this kind, made once per session (``env``: where the
        session's knobs are read), or None: nodes are started one by one."""
        return None

    @abc.abstractmethod
    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        """Start the agent for ``session`` with ``env`` on top of the node's environment."""

    @abc.abstractmethod
    async def signal(self, signum: int) -> None:
        """Send a signal to the agent process."""

    @abc.abstractmethod
    async def stop(self, timeout: float = 5.0) -> None:
        """Make sure the agent is gone (after asking it nicely through the protocol)."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the agent process still runs."""

    @property
    @abc.abstractmethod
    def host(self) -> str:
        """The node's name as users see it."""

    @property
    def label(self) -> str | None:
        """The name the user gave the node (an ssh config alias, ``user@name:port``), shown
        for it in place of the hostname its agent reports: two nodes may report one
        hostname (containers, cloned machines). None: show the reported hostname."""
        return None

    @abc.abstractmethod
    def stderr_tail(self) -> str:
        """The last lines the agent wrote to stderr, for error messages."""

    async def describe_exit(self) -> str:
        """Why the agent's stream ended, once it has: its exit status, or the link to
        its node lost (a launcher that knows tells these apart; it may wait a moment for
        the status)."""
        return "the agent exited"

    def link_lost(self) -> bool:
        """Whether the link to the node broke (the agent may still run there), rather
        than the agent ending."""
        return False

    def peer_address(self) -> str | None:
        """The node's address as this side reached it (None: this machine)."""
        return None

    async def tunnel(self, rank: int, connection: Mapping[str, Any]) -> dict[str, Any]:
        """Make a rank kernel's endpoints reachable from here; local ones already are."""
        return dict(connection)

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Enough to find the agent again (kind, host, pid)."""
