"""The launcher interface: start a node's agent and hand back its JSON-lines streams."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class AgentStreams:
    """The agent's protocol channel: we write commands, we read events."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter | Any  # an asyncio writer or anything with write/drain/close


class Launcher(abc.ABC):
    """Starts, signals and stops one node's agent.

    Implementations are serialisable (`to_dict`) so that a later process can find and
    reap what an earlier one started.
    """

    kind: ClassVar[str]

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

    @abc.abstractmethod
    def stderr_tail(self) -> str:
        """The last lines the agent wrote to stderr, for error messages."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Enough to find the agent again (kind, host, pid)."""
