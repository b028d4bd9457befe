"""Shared fixtures: a real IPython shell with the extension loaded, and leak checks."""

from __future__ import annotations

import contextlib
import io
import os
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

#: the timing summary at the end of every run, and the groups tests share an xdist worker in
pytest_plugins = ["tests.timing_report", "tests.xdist_groups"]

#: each xdist worker's sessions take their rendezvous store port from ports of their own,
#: below the ephemeral range: a port found free and bound by rank 0 a moment later is not
#: taken meanwhile by another worker's session or connection (a session of another process
#: can take it, as the error it then gives says)
WORKER_MASTER_PORTS = (20000, 1000)


def _worker_master_ports() -> None:
    from jupyter_dist.settings import MASTER_PORTS_VAR

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and MASTER_PORTS_VAR not in os.environ:
        first = WORKER_MASTER_PORTS[0] + int(worker[2:]) * WORKER_MASTER_PORTS[1]
        if first + WORKER_MASTER_PORTS[1] <= 32768:
            os.environ[MASTER_PORTS_VAR] = f"{first}-{first + WORKER_MASTER_PORTS[1] - 1}"


_worker_master_ports()


@dataclass
class CellOutput:
    """What one cell printed, and how it ended."""

    result: Any
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return bool(self.result.success)

    @property
    def error(self) -> BaseException | None:
        err = self.result.error_in_exec or self.result.error_before_exec
        return err  # type: ignore[no-any-return]


def our_processes() -> list[psutil.Process]:
    """Every live agent or rank process below this test process."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


@pytest.fixture(scope="session")
def shell() -> Iterator[Any]:
    """An IPython shell (the same kind nbclient and terminals drive) with jupyter_dist."""
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "jupyter_dist")
    yield ip
    from jupyter_dist.notebook.owners import embedded_owner

    embedded_owner().close()
    _gone, alive = psutil.wait_procs(our_processes(), timeout=60)  # exits on a busy machine
    assert not alive, f"processes left after every session was shut down: {alive}"


@pytest.fixture(scope="session")
def shell_before_cluster(shell: Any) -> None:
    """For the session-scoped clusters' folders (their conftest makes it autouse): the shell
    is made before the cluster, so torn down after it, and its check for processes that
    sessions left runs once the cluster's own processes are gone. Running on one process,
    ``tests/integration`` comes first and makes the shell anyway; on several workers a
    worker may start a cluster first."""


@pytest.fixture
def run(shell: Any) -> Callable[[str], CellOutput]:
    """Run a cell in the shell and capture what it printed."""

    def _run(cell: str) -> CellOutput:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = shell.run_cell(cell, store_history=False)
        return CellOutput(result, out.getvalue(), err.getvalue())

    return _run


def ready_client(km: Any, timeout: float = 120) -> Any:
    """A client of ``km``'s kernel (a started `KernelManager`), its channels started, once
    the kernel answers (`wait_until_ready`; dead only when its process is)."""
    kc = km.client()
    kc.start_channels()
    wait_until_ready(kc, timeout, alive=km.is_alive)
    return kc


def wait_until_ready(
    kc: Any, timeout: float = 120, alive: Callable[[], bool] | None = None
) -> None:
    """Wait until the kernel of ``kc`` (its channels started) answers a kernel_info request
    on shell and is heard on IOPub: its reply, then its idle status for that request.

    jupyter_client's ``wait_for_ready`` goes by timings a loaded machine breaks: it asks
    again each second the kernel has not answered, and the answers to those repeats come
    later, on shell, where the caller's own reply is expected; a client made from
    connection info calls the kernel dead as soon as one heartbeat takes a second (a kernel
    still starting, or one starved of CPU). Here one request is out at a time, so no late
    answer is left behind; the kernel is dead only when ``alive`` says so (for a client of
    a `KernelManager`, its process), and the one limit is ``timeout``."""
    deadline = time.monotonic() + timeout

    def next_msg(get: Callable[..., dict[str, Any]], what: str, until: float) -> Any:
        """The next message ``get`` returns before ``until``; None after it."""
        while time.monotonic() < until:
            try:
                return get(timeout=min(1.0, max(0.01, until - time.monotonic())))
            except queue.Empty:
                if alive is not None and not alive():
                    raise RuntimeError(f"the kernel died before {what}") from None
        if until >= deadline:
            raise TimeoutError(f"the kernel sent no {what} in {timeout:g} s")
        return None

    while True:
        asked = kc.kernel_info()
        while True:  # nothing else was asked on this client: any other reply is older
            reply = next_msg(kc.get_shell_msg, "kernel_info_reply", deadline)
            if reply["parent_header"].get("msg_id") == asked:
                break
        # the idle after that reply is heard once IOPub's subscription reached the kernel;
        # one published before it never comes: then ask again (not a failure)
        again = min(deadline, time.monotonic() + 2)
        while (msg := next_msg(kc.get_iopub_msg, "IOPub message", again)) is not None:
            if (
                msg["parent_header"].get("msg_id") == asked
                and msg["content"].get("execution_state") == "idle"
            ):
                return


def kernel_process(km: Any) -> psutil.Process:
    """The process of ``km``'s kernel."""
    assert km.provisioner is not None
    return psutil.Process(km.provisioner.pid)


def rank_waits_for_file_cell(go: Any) -> str:
    """A 2-rank cell in which rank 0 waits in all_reduce (cell line 5) while rank 1 stays
    at cell line 4 until the file ``go`` exists; then both print 'joined'."""
    return (
        "%%distributed --procs 2\n"
        "import os, time, torch, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.05)\n"
        "dist.all_reduce(torch.ones(1))\n"
        "print('joined')"
    )


def started_session(shell: Any, name: str, flags: str = "--procs 2") -> Iterator[str]:
    """For a fixture to yield from: session ``name`` started with ``flags`` in ``shell``,
    shut down afterwards whatever the tests did."""
    result = shell.run_cell(f"%%distributed --session {name} {flags}\npass")
    assert result.success, result.error_in_exec
    try:
        yield name
    finally:
        shell.run_line_magic("dist", f"shutdown --session {name}")


def session_status(name: str) -> dict[str, Any]:
    from jupyter_dist.notebook.owners import embedded_owner

    return embedded_owner().manager.get(name).status()


KERNEL_NAME = "jupyter-dist-test"


@pytest.fixture(scope="session")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernelspec running this interpreter, so notebook kernels see this environment."""
    import json
    import os
    import sys

    root = tmp_path_factory.mktemp("jupyter-path")
    spec_dir = root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "jupyter_dist tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(root), old]))
    yield KERNEL_NAME
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old
