"""The messages between a launcher and a node agent: one JSON object per line.

The agent's stdin carries commands and its stdout events. The channel is a pipe to a
child process (or, for remote nodes, an SSH channel): authenticated by construction,
and it carries JSON only, never pickles. Kernel traffic does not use it; the notebook
talks to rank kernels over the Jupyter protocol.

Commands (launcher -> agent)::

    {"op": "spawn", "rank": 0, "local_rank": 0, "env": {...}, "key": "...", "cwd": "..."}
    {"op": "signal", "rank": 0, "signal": "SIGINT"}
    {"op": "kill", "ranks": [0, 1] | null, "grace": 2.0}
    {"op": "route", "id": "r1", "addr": "10.0.0.1"}
    {"op": "probe", "id": "r2", "addr": "10.0.0.1", "port": 29500, "timeout_s": 5}
    {"op": "stacks", "id": "r3", "ranks": [0, 1] | null, "fallback": false}
        (reply: offsets of the logs)
    {"op": "read_log", "id": "r4", "rank": 0, "offset": 1234, "kind": "output"}
        (reply: text, start, end, path; kind "diagnostics", the default: the process log)
    {"op": "sample", "id": "r5"}   (reply: sample: the node's and its ranks' CPU, memory, GPUs)
    {"op": "shutdown"}
    {"op": "ping", "seq": 7, "deadline_s": 40}   (reply: pong)

Events (agent -> launcher)::

    {"event": "ready", "host": ..., "pid": ..., "python": ..., "gpus": [...], "versions": {...}}
    {"event": "spawned", "rank": 0, "pid": 123, "connection": {...ports...}, "log": "..."}
        (connection: the kernel's sockets, and ``relay_iopub``, the node's IOPub relay)
    {"event": "exited", "rank": 0, "pid": 123, "returncode": -9, "log_tail": "...", "log": "..."}
    {"event": "reply", "id": "r1", ...}    (route: ip, ifname; probe: ok, error)
    {"event": "error", "message": "...", "rank": 0 | null}
    {"event": "pong", "seq": 7}

Heartbeats go both ways (`Heartbeat`): the owner pings every `Heartbeat.interval_s` and
takes a node whose agent said nothing for `Heartbeat.deadline_s` as unreachable; the agent,
from the first ping on, stops its ranks and exits once its owner said nothing for the
ping's ``deadline_s`` (`Heartbeat.agent_deadline_s`). A link that dies without a reset
(power loss, preemption, a cable) is thus noticed on both ends, and a wedged agent too.

Each of them is a `TypedDict` in `common.payloads` (`AgentCommand`, `AgentEvent`).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from typing import Any, cast, get_args

from jupyter_dist.common.payloads import AgentCommand, AgentEvent, AgentEventKind, AgentOp

PROTOCOL_VERSION = 6
#: makes a rank's faulthandler write every thread's Python stack to its log (the fallback
#: for a rank whose own thread cannot answer: `rank.stack_dumps`)
STACKS_SIGNAL = signal.SIGUSR1


#: the longest line either end reads as one message; a longer one is not the protocol's
#: (the largest events, a ``read_log`` reply or a ``spawned`` connection, stay far below)
MAX_LINE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Heartbeat:
    """How often the owner pings a node's agent, and how long each end waits for the
    other before it gives up on it (seconds)."""

    #: the owner's silence after which a node counts as unreachable
    deadline_s: float = 20.0

    @property
    def interval_s(self) -> float:
        return self.deadline_s / 4

    @property
    def agent_deadline_s(self) -> float:
        """The agent waits longer than the owner: the owner sees the loss first and says
        so, and a notebook whose loop was held up for a moment loses nothing."""
        return 2 * self.deadline_s


#: the ``op`` of every command and the ``event`` of every event this version knows
OPS: frozenset[str] = frozenset(get_args(AgentOp))
EVENT_KINDS: frozenset[str] = frozenset(get_args(AgentEventKind))


def encode(message: AgentCommand | AgentEvent) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError(f"agent message must be a JSON object, got {type(data).__name__}")
    return data


def as_command(data: dict[str, Any]) -> AgentCommand | None:
    """A decoded message as a command, or None when its ``op`` is not one of `OPS`. Its
    other fields are as the peer wrote them: a missing one raises KeyError where read."""
    return cast(AgentCommand, data) if data.get("op") in OPS else None


def as_event(data: dict[str, Any]) -> AgentEvent | None:
    """A decoded message as an event, or None when its ``event`` is not one of
    `EVENT_KINDS` (a newer agent's: ignored)."""
    return cast(AgentEvent, data) if data.get("event") in EVENT_KINDS else None


def describe_returncode(returncode: int | None) -> str:
    """``-9`` -> ``"killed by signal SIGKILL (9)"``, ``3`` -> ``"exit code 3"``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by signal {name} ({-returncode})"
    return f"exit code {returncode}"
