"""What the Slurm tests run inside an allocation: ``salloc ... python -m tests.slurm.inside``.

salloc gives this process the allocation's environment (``SLURM_JOB_ID``,
``SLURM_JOB_NODELIST``, ...) exactly as a notebook started from ``salloc`` or ``sbatch``
gets it. Each scenario writes what it saw as JSON to ``--out``; the test asserts on it,
so a failure shows the facts rather than a traceback from another process.

    python -m tests.slurm.inside launcher --out facts.json
    python -m tests.slurm.inside magic --out facts.json
    JD_TEST_SSH_CONFIG=ssh_config python -m tests.slurm.inside tunnel --out facts.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import psutil

from jupyter_dist.common.cluster_env import detect_slurm
from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.control.agent_client import AgentClient
from jupyter_dist.control.launchers.slurm import SlurmLauncher
from jupyter_dist.errors import AgentError
from tests.conftest import wait_until_ready

SESSION = "slurmtest"
START_TIMEOUT = 120.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True, help="where the JSON facts go")
    args = parser.parse_args()
    facts: dict[str, Any] = {"job": os.environ.get("SLURM_JOB_ID")}
    try:
        SCENARIOS[args.scenario](facts)
    except BaseException:
        facts["exception"] = traceback.format_exc()
        raise
    finally:
        with open(args.out, "w") as out:
            json.dump(facts, out, indent=1, default=str)
    return 0


# --- the launcher, through a real AgentClient -------------------------------------------------


def launcher_scenario(facts: dict[str, Any]) -> None:
    detected = detect_slurm(os.environ)
    assert detected is not None, "detect_slurm found no allocation"
    facts["detected"] = [str(h) for h in detected.hosts]
    facts["detected_gpus"] = detected.gpus_per_node
    asyncio.run(_agent_and_rank(detected.hosts[0].name, facts))
    asyncio.run(_agent_killed(detected.hosts[0].name, facts))
    asyncio.run(_node_not_in_allocation(facts))
    asyncio.run(_stop_escalates(detected.hosts[0].name, facts))


async def _agent_and_rank(host: str, facts: dict[str, Any]) -> None:
    """Agent under srun, one rank kernel from it, a cell on that rank, then stop."""
    launcher = SlurmLauncher(HostSpec(host))
    node = AgentClient(launcher, 0, on_exit=lambda *_: None)
    pids: list[int] = []
    try:
        info = await node.start(SESSION, {"JD_SLURM_TEST": "agent"}, START_TIMEOUT)
        pids.append(info.pid)
        facts["agent_ancestors"] = _ancestor_names(info.pid)
        facts["steps_running"] = _steps()
        key = uuid.uuid4().hex
        spawned = await node.spawn(0, 0, {"JD_SLURM_TEST": "rank"}, key, os.getcwd())
        pids.append(spawned.pid)
        facts["rank_ancestors"] = _ancestor_names(spawned.pid)
        connection = await launcher.tunnel(0, spawned.connection)
        facts["tunnel_unchanged"] = connection == dict(spawned.connection)
        facts["rank_says"] = await asyncio.to_thread(_execute, connection, key)
        facts["to_dict"] = launcher.to_dict()
    finally:
        await node.stop()
    facts["srun_returncode"] = launcher.process.returncode if launcher.process else None
    facts["alive_after_stop"] = _wait_gone(pids)
    facts["steps_after_stop"] = _wait_no_steps()


async def _agent_killed(host: str, facts: dict[str, Any]) -> None:
    """SIGKILL to srun: Slurm itself must take the step, agent and all, away."""
    launcher = SlurmLauncher(HostSpec(host))
    lost: list[bool] = []
    node = AgentClient(launcher, 0, on_exit=lambda *_: None, on_lost=lambda _: lost.append(True))
    try:
        info = await node.start(SESSION, {}, START_TIMEOUT)
        await launcher.signal(signal.SIGKILL)
        facts["killed_alive"] = _wait_gone([info.pid])
        facts["killed_steps_after"] = _wait_no_steps()
        await asyncio.sleep(0.5)  # the event stream's end reaches AgentClient
        facts["killed_noticed"] = bool(lost) and not launcher.alive()
    finally:
        await node.stop()


async def _node_not_in_allocation(facts: dict[str, Any]) -> None:
    node = AgentClient(SlurmLauncher(HostSpec("nosuchnode")), 0, on_exit=lambda *_: None)
    try:
        await node.start(SESSION, {}, START_TIMEOUT)
    except AgentError as err:
        facts["bad_node_error"] = str(err)
    finally:
        await node.stop()


async def _stop_escalates(host: str, facts: dict[str, Any]) -> None:
    """An agent deaf to EOF: stop() must still end srun and the step, by signals."""
    with tempfile.TemporaryDirectory() as tmp:
        deaf, started = os.path.join(tmp, "python"), os.path.join(tmp, "started")
        with open(deaf, "w") as script:
            # takes the agent's arguments, says it runs, ignores EOF
            script.write(f"#!/bin/sh\ntouch '{started}'\nexec sleep 600\n")
        os.chmod(deaf, 0o755)
        launcher = SlurmLauncher(HostSpec(host), python=deaf)
        await launcher.start(SESSION, {})
        deadline = time.monotonic() + 60  # until the step runs the deaf "agent"
        while not os.path.exists(started) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        facts["deaf_started"] = os.path.exists(started)
        began = time.monotonic()
        await launcher.stop(timeout=2)
        facts["deaf_stop_s"] = round(time.monotonic() - began, 1)
        facts["deaf_srun_returncode"] = launcher.process.returncode if launcher.process else None
        facts["deaf_steps_after"] = _wait_no_steps()


def _execute(connection: dict[str, Any], key: str) -> str:
    """Run a line on the rank kernel through its connection, as the notebook side would."""
    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient()
    client.load_connection_info({**connection, "key": key})  # type: ignore[typeddict-item]
    client.start_channels()
    try:
        wait_until_ready(client, START_TIMEOUT)  # no heartbeat guesses (tests.conftest)
        out = io.StringIO()
        code = "import os; print(os.environ['JD_SLURM_TEST'], os.environ.get('SLURM_STEP_ID'))"

        def output(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.write(msg["content"]["text"])

        client.execute_interactive(code, timeout=60, output_hook=output)
        return out.getvalue().strip()
    finally:
        client.stop_channels()


# --- the tunnel to another node, over SSH ---------------------------------------------------


def tunnel_scenario(facts: dict[str, Any]) -> None:
    """The node is taken for another machine: its rank is reached through SSH forwarding.

    ``JD_TEST_SSH_CONFIG`` names an ssh config in which this node's name leads to an sshd
    (of the multi-node test cluster) on this same machine, so the forwarded Unix sockets
    are the rank's own.
    """
    from jupyter_dist.control.launchers import slurm

    detected = detect_slurm(os.environ)
    assert detected is not None, "detect_slurm found no allocation"
    slurm.is_this_machine = lambda name: False
    asyncio.run(_tunnelled_rank(detected.hosts[0].name, os.environ["JD_TEST_SSH_CONFIG"], facts))


async def _tunnelled_rank(host: str, ssh_config: str, facts: dict[str, Any]) -> None:
    launcher = SlurmLauncher(HostSpec(host), ssh_config=ssh_config)
    node = AgentClient(launcher, 0, on_exit=lambda *_: None)
    try:
        await node.start(SESSION, {"JD_SLURM_TEST": "agent"}, START_TIMEOUT)
        key = uuid.uuid4().hex
        spawned = await node.spawn(0, 0, {"JD_SLURM_TEST": "tunnelled"}, key, os.getcwd())
        connection = await launcher.tunnel(0, spawned.connection)
        facts["rank_socket"] = spawned.connection["ip"]
        facts["local_socket"] = connection["ip"]
        facts["rank_says"] = await asyncio.to_thread(_execute, connection, key)
    finally:
        await node.stop()
    facts["forward_dir_left"] = os.path.exists(os.path.dirname(str(facts.get("local_socket"))))
    facts["steps_after_stop"] = _wait_no_steps()


# --- the magic, in an IPython shell ---------------------------------------------------------


def magic_scenario(facts: dict[str, Any]) -> None:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()  # type: ignore[no-untyped-call]
    assert shell is not None
    shell.run_line_magic("load_ext", "jupyter_dist")
    cell = (
        "%%distributed --slurm --procs 2\n"
        "import os, torch, torch.distributed as dist\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item(), 'step', os.environ.get('SLURM_STEP_ID') is not None)"
    )
    facts["cell"] = _run_cell(shell, cell)
    # a rank killed is replaced alone, in the same job step; rank 0 keeps its variables
    facts["kept"] = _run_cell(
        shell, "%%distributed\nkept = 30 + dist.get_rank()\nprint('pid', os.getpid())"
    )
    facts["killed"] = _run_cell(
        shell, "%%distributed --ranks 1\nimport signal\nos.kill(os.getpid(), signal.SIGKILL)"
    )
    facts["healed"] = _run_cell(
        shell,
        "%%distributed\nimport os, torch, torch.distributed as dist, jupyter_dist\n"
        "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
        "print('after', t.item(), jupyter_dist.info().generation, globals().get('kept'), "
        "os.getpid(), os.environ.get('SLURM_STEP_ID') is not None)",
    )
    facts["steps_running"] = _steps()
    facts["shutdown"] = _run_cell(shell, "%dist shutdown --all")
    from jupyter_dist.notebook.owners import embedded_owner

    embedded_owner().close()
    facts["leftovers"] = _wait_gone([p.pid for p in psutil.Process().children(recursive=True)])
    facts["steps_after_stop"] = _wait_no_steps()


def _run_cell(shell: Any, cell: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = shell.run_cell(cell, store_history=False)
    error = result.error_in_exec or result.error_before_exec
    return {
        "ok": bool(result.success),
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "error": f"{type(error).__name__}: {error}" if error else None,
    }


# --- helpers --------------------------------------------------------------------------------


def _ancestor_names(pid: int) -> list[str]:
    return [p.name() for p in psutil.Process(pid).parents()]


def _steps() -> list[str]:
    """``ID NAME`` of this allocation's running steps."""
    argv = ["squeue", "--steps", "--noheader", "--format=%i %j"]
    argv.append(f"--jobs={os.environ['SLURM_JOB_ID']}")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _wait_gone(pids: list[int], timeout: float = 30) -> list[int]:
    """Those of ``pids`` still alive (not zombies) after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _wait_no_steps(timeout: float = 30) -> list[str]:
    """Our agent steps still listed after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (ours := [s for s in _steps() if "jupyter_dist-" in s]) and (time.monotonic() < deadline):
        time.sleep(0.2)
    return ours


SCENARIOS: dict[str, Callable[[dict[str, Any]], None]] = {
    "launcher": launcher_scenario,
    "magic": magic_scenario,
    "tunnel": tunnel_scenario,
}

if __name__ == "__main__":
    sys.exit(main())
