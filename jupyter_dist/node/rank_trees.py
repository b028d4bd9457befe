"""What the agent does about the processes its ranks started: they go with their rank.

Killing a rank's process group reaches what stayed in it, not a program that started a
session of its own (``Popen(start_new_session=True)``, a daemon), and such a program
would outlive a restart or a shutdown. So whenever the agent signals a rank to stop,
`RankTrees.signal` also signals what is below the rank right then, and remembers it for
the SIGKILL that follows; and since the agent is a child subreaper
(`common.process_tree.become_subreaper`), what a dead rank leaves behind becomes the
agent's child, found by `RankTrees.rank_exited` through the ``RANK`` it inherited, or
by `RankTrees.kill_all` as the agent stops. The agent reaps them as any other child.
"""

from __future__ import annotations

import signal
from collections.abc import Collection

import psutil

from jupyter_dist.common import process_tree


class RankTrees:
    """The descendants of one agent's ranks, signalled as their rank is."""

    def __init__(self, agent_pid: int) -> None:
        self.agent_pid = agent_pid
        #: rank pid -> what was below it when it was first signalled to stop
        self.seen: dict[int, list[psutil.Process]] = {}

    def signal(self, rank_pid: int, sig: int) -> None:
        """Send ``sig`` to what is below the rank now and what was there before."""
        found = {p.pid: p for p in self.seen.get(rank_pid, ())}
        found.update((p.pid, p) for p in process_tree.descendants(rank_pid))
        self.seen[rank_pid] = list(found.values())
        process_tree.send(self.seen[rank_pid], sig)

    def rank_exited(self, rank: int, rank_pid: int, known: Collection[int]) -> None:
        """The rank's process is gone: SIGKILL what was seen below it and the orphans it
        left (children of the agent, not in ``known``, that inherited its ``RANK``)."""
        left = self.seen.pop(rank_pid, [])
        left.extend(
            p
            for p in process_tree.adopted(self.agent_pid, known)
            if process_tree.rank_of(p) == rank
        )
        process_tree.send(left, signal.SIGKILL)

    def kill_all(self, rank_pids: Collection[int], known: Collection[int]) -> None:
        """The agent stops: SIGKILL everything below its ranks and every orphan it
        adopted (children not in ``known``)."""
        for pid in rank_pids:
            self.signal(pid, signal.SIGKILL)
        process_tree.send(process_tree.adopted(self.agent_pid, known), signal.SIGKILL)
        self.seen.clear()
