"""The ``local`` launcher: the agent is a subprocess of this process, on this machine."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from jupyter_dist.common.agent_protocol import describe_returncode
from jupyter_dist.control.launchers.base import (
    AGENT_MODULE,
    AgentStreams,
    Launcher,
    with_install_hint,
)
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)
STREAM_LIMIT = 16 * 1024 * 1024


class SubprocessLauncher(Launcher):
    """A launcher whose agent is a child process of this one (``python -m
    jupyter_dist.node`` itself, or ``srun`` running it): its streams, its stderr tail,
    signals and liveness."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._stderr_task: asyncio.Task[None] | None = None

    async def _spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> AgentStreams:
        """Start ``argv`` in its own process session (the notebook kernel's interrupt, sent
        to its whole process group, must not reach the agent: jupyter_dist forwards
        interrupts itself); raises OSError when it cannot be started."""
        self.process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
            limit=STREAM_LIMIT,
        )
        assert self.process.stdout and self.process.stdin and self.process.stderr
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(self.process.stderr))
        return AgentStreams(self.process.stdout, self.process.stdin)

    def _keeps(self, line: str) -> bool:
        """Whether a line of the agent's stderr belongs in `stderr_tail`."""
        return True

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            if self._keeps(text):
                self._stderr.append(text)
            log.debug("node %s agent stderr: %s", self.host, text)

    async def _stderr_drained(self) -> None:
        if self._stderr_task:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._stderr_task, 1.0)

    async def signal(self, signum: int) -> None:
        if self.process and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def describe_exit(self) -> str:
        if self.process is None:
            return "the agent was never started"
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.process.wait(), 1.0)
        if self.process.returncode is None:
            return "the agent closed its output but still runs"
        return f"the agent exited ({describe_returncode(self.process.returncode)})"


class LocalLauncher(SubprocessLauncher):
    """Runs ``python -m jupyter_dist.node`` in its own process session."""

    kind: ClassVar[str] = "local"

    def __init__(self, python: str | None = None) -> None:
        super().__init__()
        self.python = python or sys.executable

    @property
    def host(self) -> str:
        return socket.gethostname()

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        argv = [self.python, "-m", AGENT_MODULE, "--session", session]
        try:
            return await self._spawn(
                [*argv, "--parent-pid", str(os.getpid())], {**os.environ, **env}
            )
        except OSError as err:
            raise AgentError(f"cannot start the agent with {self.python!r}: {err}") from err

    def stderr_tail(self) -> str:
        return with_install_hint("\n".join(self._stderr))

    async def stop(self, timeout: float = 5.0) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.returncode is None:
            if proc.stdin and not proc.stdin.is_closing():
                proc.stdin.close()  # EOF: the agent kills its ranks and exits
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                await self.signal(signal.SIGKILL)
                await proc.wait()
        await self._stderr_drained()

    def to_dict(self) -> dict[str, Any]:
        pid = self.process.pid if self.process else None
        return {"kind": self.kind, "host": self.host, "pid": pid, "python": self.python}
