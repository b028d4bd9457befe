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
from collections.abc import Mapping
from typing import Any, ClassVar

from jupyter_dist.control.launchers.base import (
    AGENT_MODULE,
    AgentStreams,
    Launcher,
    with_install_hint,
)
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)
STREAM_LIMIT = 16 * 1024 * 1024


class LocalLauncher(Launcher):
    """Runs ``python -m jupyter_dist.node`` in its own process session.

    Its own session keeps the notebook kernel's interrupt (sent to the kernel's whole
    process group) away from the ranks: jupyter_dist forwards interrupts itself.
    """

    kind: ClassVar[str] = "local"

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self.process: asyncio.subprocess.Process | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def host(self) -> str:
        return socket.gethostname()

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        try:
            self.process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                AGENT_MODULE,
                "--session",
                session,
                "--parent-pid",
                str(os.getpid()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **env},
                start_new_session=True,
                limit=STREAM_LIMIT,
            )
        except OSError as err:
            raise AgentError(f"cannot start the agent with {self.python!r}: {err}") from err
        assert self.process.stdout and self.process.stdin and self.process.stderr
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(self.process.stderr))
        return AgentStreams(self.process.stdout, self.process.stdin)

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            self._stderr.append(text)
            log.debug("agent stderr: %s", text)

    def stderr_tail(self) -> str:
        return with_install_hint("\n".join(self._stderr))

    async def signal(self, signum: int) -> None:
        if self.process and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

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
        if self._stderr_task:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._stderr_task, 1.0)

    def to_dict(self) -> dict[str, Any]:
        pid = self.process.pid if self.process else None
        return {"kind": self.kind, "host": self.host, "pid": pid, "python": self.python}
