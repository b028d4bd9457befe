"""The ``slurm`` launcher: the agent runs as a job step of the allocation this notebook is in.

Inside ``salloc``/``sbatch`` the agent of each node starts with ``srun`` (see
`srun_command`), so Slurm knows about it, accounts it to the job, confines it to the job's
resources and cleans up after it. The step overlaps every other step and takes all of the
job's CPUs, memory and GPUs on its node, unbound, because the agent forks every rank of
that node from itself. Its stdin and stdout carry the agent protocol through ``srun``,
exactly like a local subprocess's pipes. So what the agent is sent, its spawn commands with
the session's HMAC key and each rank's environment, travels as Slurm carries a step's stdio
(``srun`` to the node's ``slurmstepd``), not over SSH: MUNGE or ``auth/slurm`` authenticate
Slurm's messages without encrypting them, and only a site that enabled Slurm's TLS
(``TLSType``) encrypts them (README, "What travels over srun").

Rank kernels listen on Unix sockets on their node: on this machine they are reached
directly, on other nodes through an SSH connection like the ``ssh`` launcher's.

Stopping closes the agent's stdin (it kills its ranks and exits, and the step ends); if
that does not end it, SIGTERM to ``srun`` makes Slurm SIGKILL the whole step, and SIGKILL
to ``srun`` leaves its cancellation to Slurm.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.control.launchers.base import (
    AGENT_MODULE,
    AgentStreams,
    install_hint,
    with_install_hint,
)
from jupyter_dist.control.launchers.local import SubprocessLauncher
from jupyter_dist.control.launchers.ssh import SSHLauncher
from jupyter_dist.errors import AgentError

log = logging.getLogger(__name__)

#: srun reads these from the environment as the step's shape; inherited from a job
#: asked with, say, ``--gpus-per-task=1``, they would shrink the agent's step to one
#: task's share. Left out of the environment srun (and so the agent) gets.
STEP_SHAPE_VARIABLES = (
    "SLURM_CPUS_PER_GPU",
    "SLURM_EXACT",
    "SLURM_GPUS",
    "SLURM_GPUS_PER_SOCKET",
    "SLURM_GPUS_PER_TASK",
    "SLURM_NTASKS_PER_CORE",
    "SLURM_NTASKS_PER_GPU",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NTASKS_PER_SOCKET",
    "SLURM_TRES_PER_TASK",
    "SRUN_CPUS_PER_TASK",
)
#: srun says so when told ``--cpu-bind=none`` on a cluster without task/affinity: noise.
_NO_BINDING_NOTICE = "lacks support for cpu binding"
_HINTS = (
    (
        r"Requested node configuration is not available|[Ii]nvalid node name",
        "node {host!r} is not part of allocation {job} (its nodes: {nodes})",
    ),
    (
        r"Unable to confirm allocation|Invalid job id specified",
        "allocation {job} has ended or is not yours; start the notebook in a new one",
    ),
    (
        r"Could not establish a configuration source",
        "srun cannot read the cluster's slurm.conf: set SLURM_CONF to its path",
    ),
    (
        r"execve\(\).*No such file or directory",
        "install jupyter_dist in that node's Python, or pass --python",
    ),
)


def srun_command(job: str, host: str, python: str, session: str, srun: str = "srun") -> list[str]:
    """The ``srun`` line that runs one node's agent as a step of allocation ``job``."""
    return [
        srun,
        f"--jobid={job}",
        f"--job-name=jupyter_dist-{session}",  # the step's name in squeue -s
        f"--nodelist={host}",
        "--nodes=1",
        "--ntasks=1",
        "--overlap",  # shares resources: never waits for, nor blocks, the user's steps
        "--mem=0",  # all of the job's memory on the node, without taking it from others
        "--cpu-bind=none",  # the ranks fork from the agent: no binding to one task's CPUs
        "--mpi=none",  # no PMI server: the ranks rendezvous through torch.distributed
        "--export=ALL",  # even when the job was submitted with --export=NONE
        "--kill-on-bad-exit=1",  # a failing agent ends its step, whatever KillOnBadExit says
        "--disable-status",  # SIGINT is forwarded, not answered with a status report
        "--unbuffered",  # protocol lines pass as soon as they are written
        "--quiet",
        python,
        "-m",
        AGENT_MODULE,
        "--session",
        session,
    ]


def is_this_machine(name: str) -> bool:
    """Whether the Slurm node ``name`` is the machine this process runs on."""
    here = socket.gethostname()
    names = {here, here.split(".", 1)[0], os.environ.get("SLURMD_NODENAME", "")}
    return name in names - {""}


class SlurmLauncher(SubprocessLauncher):
    """Starts one node's agent with ``srun`` inside the current Slurm allocation.

    Signals go to srun, which passes them to every process of the step (the agent and
    its ranks); SIGTERM, SIGHUP and SIGQUIT make Slurm SIGKILL the step."""

    kind: ClassVar[str] = "slurm"

    def __init__(
        self, host: HostSpec, python: str | None = None, ssh_config: str | None = None
    ) -> None:
        self.spec = host
        self.python = host.python or python or sys.executable  # a per-node word wins
        self.ssh_config = ssh_config
        super().__init__()
        self.job: str | None = None
        self._ssh: SSHLauncher | None = None  # holds the tunnels to another node

    @property
    def host(self) -> str:
        return self.spec.name

    async def start(self, session: str, env: Mapping[str, str]) -> AgentStreams:
        self.job = allocation_id(os.environ)
        argv = srun_command(self.job, self.spec.name, self.python, session)
        log.debug("node %s: starting agent: %s", self.host, " ".join(argv))
        try:
            return await self._spawn(argv, srun_environment(os.environ, env))
        except OSError as err:
            raise AgentError(
                f"node {self.host!r}: cannot run srun ({err}); is the Slurm client installed "
                "and on PATH?"
            ) from err

    def _keeps(self, line: str) -> bool:
        return _NO_BINDING_NOTICE not in line

    def stderr_tail(self) -> str:
        tail = "\n".join(self._stderr)
        if install_hint(tail):
            return with_install_hint(tail)
        for pattern, hint in _HINTS:
            if re.search(pattern, tail):
                nodes = os.environ.get("SLURM_JOB_NODELIST", "?")
                note = hint.format(host=self.host, job=self.job, nodes=nodes)
                return f"{tail}\n({note})"
        return tail

    async def stop(self, timeout: float = 5.0) -> None:
        proc = self.process
        if proc is not None and proc.returncode is None:
            if proc.stdin and not proc.stdin.is_closing():
                proc.stdin.close()  # EOF: the agent kills its ranks and exits
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if await _exited(proc, timeout):
                    break
                log.debug("node %s: srun still runs; sending %s", self.host, sig.name)
                await self.signal(sig)
            await proc.wait()
        await self._stderr_drained()
        if self._ssh is not None:
            await self._ssh.stop(timeout)
            self._ssh = None

    async def tunnel(self, rank: int, connection: Mapping[str, Any]) -> dict[str, Any]:
        """A rank's sockets: as they are on this machine, else forwarded over SSH."""
        if is_this_machine(self.host):
            return dict(connection)
        if self._ssh is None:
            ssh = SSHLauncher(self.spec, self.python, self.ssh_config)
            ssh.conn = await ssh.connect()
            self._ssh = ssh
        return await self._ssh.tunnel(rank, connection)

    def to_dict(self) -> dict[str, Any]:
        pid = self.process.pid if self.process else None
        return {
            "kind": self.kind,
            "host": self.host,
            "job": self.job,
            "pid": pid,
            "python": self.python,
        }


def allocation_id(env: Mapping[str, str]) -> str:
    """The job id of the allocation this process runs in, or a clear error."""
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        raise AgentError(
            "--slurm needs to run inside a Slurm allocation (salloc/sbatch); SLURM_JOB_ID is "
            "not set here. Start Jupyter from a job (e.g. `salloc -N 2` then `jupyter lab`, "
            "or in an sbatch script), or use --hosts to reach the nodes over SSH"
        )
    return job


def srun_environment(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """srun's environment: this process's with ``extra`` on top, minus the step shape."""
    env = {k: v for k, v in base.items() if k not in STEP_SHAPE_VARIABLES}
    env.update(extra)
    return env


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True
