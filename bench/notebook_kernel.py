"""A real notebook kernel driven the way a notebook frontend drives it.

`NotebookKernel` starts an ipykernel with jupyter_client's `KernelManager`, sends
`execute_request`s on the shell channel and reads IOPub until the cell is finished, timing
each round trip from the moment the request is sent to the moment both the `execute_reply`
and the `status: idle` for it have arrived.

Everything the kernel starts (clusters, rank kernels, spawners) inherits an environment
variable carrying a per-kernel tag; `ProcessReaper` finds those processes by that tag and
ends them by pid when the kernel is shut down, so nothing outlives a benchmark, even when
a peer's own shutdown fails or leaks.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import psutil
import zmq
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

TAG_VAR = "JUPYTER_DIST_BENCH_TAG"

Message = dict[str, Any]


class CellTimeout(TimeoutError):
    """A cell did not finish (reply + idle) within its timeout."""


class CellFailed(RuntimeError):
    """A cell finished with an error, or printed something that says it failed."""


@dataclass
class CellResult:
    """What one `execute_request` produced, as a frontend would have seen it."""

    code: str
    status: str = "pending"
    # time.perf_counter() when the execute_request was sent
    sent_at: float = float("nan")
    # seconds from sending execute_request to having both the reply and the idle status
    elapsed: float = float("nan")
    # seconds from sending to the first output that contained `marker`, if one was given
    marker_at: float | None = None
    # seconds from sending to the last output message received (within the grace period)
    last_output_at: float | None = None
    streams: dict[str, list[str]] = field(default_factory=dict)
    # latest text/plain of each transient display_id (display_data + update_display_data)
    displays: dict[str, str] = field(default_factory=dict)
    # text/plain of display_data / execute_result without a display_id
    plain: list[str] = field(default_factory=list)
    error: str | None = None
    traceback: str = ""
    n_output_msgs: int = 0
    # output messages whose parent is not this execute_request (background threads ...)
    n_foreign_msgs: int = 0

    def stream(self, name: str = "stdout") -> str:
        return "".join(self.streams.get(name, []))

    @property
    def text(self) -> str:
        """All textual output: streams, then displays, then plain results."""
        parts = [self.stream("stdout"), self.stream("stderr")]
        parts.extend(self.displays.values())
        parts.extend(self.plain)
        return "\n".join(p for p in parts if p)

    def check(self) -> CellResult:
        """Raise `CellFailed` unless the cell finished with status ok."""
        if self.status != "ok":
            detail = self.error or self.status
            raise CellFailed(f"cell failed ({detail}): {self.code[:80]!r}\n{self.tail()}")
        return self

    def tail(self, n: int = 1200) -> str:
        return (self.traceback or self.text)[-n:]


# says, from what arrived so far, whether all expected output is in
Done = Callable[[CellResult], bool]
# sees every IOPub message with its arrival time (time.perf_counter()), whatever its type
# or parent; returns True when the message counts as output for `grace` (a frontend that
# follows widgets, say)
IopubHook = Callable[[Message, float], bool]
DONE_CHECK_EVERY_S = 0.05


class ProcessReaper:
    """Finds and ends, by pid, the processes carrying one tag in their environment."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._seen: dict[int, psutil.Process] = {}

    def _tagged(self) -> list[psutil.Process]:
        found = []
        me = os.getpid()
        needle = f"{TAG_VAR}={self.tag}"
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                with open(f"/proc/{proc.pid}/environ", "rb") as f:
                    env = f.read().decode(errors="replace").split("\0")
            except OSError:
                # not Linux or not ours to read: fall back on psutil
                try:
                    env = [f"{k}={v}" for k, v in proc.environ().items()]
                except (psutil.Error, OSError):
                    continue
            if needle in env:
                found.append(proc)
        return found

    def track(self, root_pid: int | None) -> None:
        """Remember the descendants of root_pid (catches children that clear their env)."""
        if root_pid is None:
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(root_pid).children(recursive=True):
                self._seen.setdefault(child.pid, child)

    def alive(self) -> list[psutil.Process]:
        procs = {p.pid: p for p in self._tagged()}
        for pid, proc in self._seen.items():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    procs.setdefault(pid, proc)
        return list(procs.values())

    def reap(self, grace: float = 3.0) -> list[str]:
        """Terminate, then kill, every process still alive; describe what was found."""
        procs = self.alive()
        described = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                described.append(f"{proc.pid}:{' '.join(proc.cmdline())[:120]}")
                proc.terminate()
        _, left = psutil.wait_procs(procs, timeout=grace)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=grace)
        return described


class NotebookKernel:
    """One ipykernel, started and driven over the Jupyter protocol like a notebook does."""

    def __init__(
        self,
        *,
        cwd: Path,
        extra_env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        log_path: Path | None = None,
        kernel_spec: KernelSpecManager | None = None,
        kernel_name: str = "python3",
        transport: str = "tcp",
    ) -> None:
        self.cwd = cwd
        # where `kernel_name` is looked up (default: the machine's kernelspecs); transport
        # "ipc" for a kernel in another network namespace, whose loopback is not ours
        self.kernel_spec = kernel_spec
        self.kernel_name = kernel_name
        self.transport = transport
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self.tag = uuid.uuid4().hex
        self.extra_env = dict(extra_env or {})
        self.startup_timeout = startup_timeout
        self.reaper = ProcessReaper(self.tag)
        self.km: KernelManager | None = None
        self.kc: Any = None
        self.startup_seconds = float("nan")
        # processes found alive after the peer's own shutdown and the kernel's
        self.leaked: list[str] = []

    # -- lifecycle -------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # tools that spawn "python" from PATH (nbdistributed does) must find this venv's
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        pythonpath = [str(self.cwd)]
        if env.get("PYTHONPATH"):
            pythonpath.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        env[TAG_VAR] = self.tag
        return env

    def start(self) -> NotebookKernel:
        t0 = time.perf_counter()
        options: dict[str, Any] = {"kernel_name": self.kernel_name, "transport": self.transport}
        if self.kernel_spec is not None:
            options["kernel_spec_manager"] = self.kernel_spec
        if self.transport == "ipc":
            # the sockets' path prefix: absolute, as the kernel runs in cwd and we do not
            options["ip"] = str(self.cwd.absolute() / f"kernel-{self.tag[:8]}")
        self.km = KernelManager(**options)
        popen_kwargs: dict[str, Any] = {}
        if self.log_path is not None:
            # the kernel's own stdout/stderr (and whatever its children write there)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
            popen_kwargs = {"stdout": self._log, "stderr": subprocess.STDOUT}
        self.km.start_kernel(cwd=str(self.cwd), env=self.env(), **popen_kwargs)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=self.startup_timeout)
        self.startup_seconds = time.perf_counter() - t0
        self.reaper.track(self.pid)
        return self

    @property
    def connection_file(self) -> str:
        """Where a second client (another process) finds this kernel's ports and key."""
        if self.km is None:
            raise RuntimeError("kernel not started")
        return str(self.km.connection_file)

    def cpu_seconds(self, precise: bool = True) -> float:
        """CPU time (user + system, all its threads, not its children) the kernel process
        used so far.

        precise: from the process's CPU-time clock (Linux, nanoseconds); psutil's
        `cpu_times()` (user + system) counts in clock ticks, 10 ms, about what a whole
        W4 flood costs the notebook kernel. Falls back on psutil where the clock is
        unavailable.
        """
        pid = self.pid
        if pid is None:
            raise RuntimeError("kernel not started")
        if precise and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                # the process-wide CPUCLOCK_SCHED clock of another pid, as glibc's
                # clock_getcpuclockid() makes it
                return time.clock_gettime(((~pid) << 3) | 2)
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)

    @property
    def pid(self) -> int | None:
        if self.km is None or self.km.provisioner is None:
            return None
        pid = getattr(self.km.provisioner, "pid", None)
        return int(pid) if pid is not None else None

    def shutdown(
        self,
        cleanup_code: str | None = None,
        cleanup_timeout: float = 30.0,
        leak_wait: float = 5.0,
    ) -> None:
        """Run the peer's own teardown cell, stop the kernel, then reap what is left."""
        try:
            if cleanup_code and self.kc is not None:
                with contextlib.suppress(Exception):
                    self.execute(cleanup_code, timeout=cleanup_timeout)
            self.reaper.track(self.pid)
            if self.kc is not None:
                with contextlib.suppress(Exception):
                    self.kc.stop_channels()
            if self.km is not None:
                with contextlib.suppress(Exception):
                    self.km.shutdown_kernel(now=False)
                with contextlib.suppress(Exception):
                    if self.km.is_alive():
                        self.km.shutdown_kernel(now=True)
        finally:
            # give what the peer stopped a moment to exit on its own before calling it leaked
            deadline = time.perf_counter() + leak_wait
            while self.reaper.alive() and time.perf_counter() < deadline:
                time.sleep(0.2)
            self.leaked = self.reaper.reap()
            self.km = None
            self.kc = None
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> NotebookKernel:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # -- running cells ---------------------------------------------------------------------

    def execute(
        self,
        code: str,
        *,
        timeout: float = 120.0,
        marker: str | None = None,
        done: Done | None = None,
        grace: float = 0.0,
        track: bool = True,
        on_iopub: IopubHook | None = None,
    ) -> CellResult:
        """Run one cell; return when reply + idle arrived (and `done` or `grace` allows).

        marker: record when an output containing this text first arrives (`marker_at`).
        done / grace: after reply + idle, keep reading IOPub until `done(result)` is true
        or no output arrived for `grace` seconds; `last_output_at` then says when the last
        output came. on_iopub: see `IopubHook`. Raises `CellTimeout` when the cell does not
        finish in `timeout`.
        """
        kc = self.kc
        if kc is None:
            raise RuntimeError("kernel not started")
        # drop anything left over from earlier cells
        while kc.iopub_channel.msg_ready():
            kc.iopub_channel.get_msg(timeout=0)
        res = CellResult(code=code)
        next_done_check = 0.0
        poller = zmq.Poller()
        poller.register(kc.iopub_channel.socket, zmq.POLLIN)
        poller.register(kc.shell_channel.socket, zmq.POLLIN)

        t0 = res.sent_at = time.perf_counter()
        msg_id = kc.execute(code, store_history=True, allow_stdin=False)
        deadline = t0 + timeout
        reply_at: float | None = None
        idle_at: float | None = None
        last_output = t0
        while True:
            now = time.perf_counter()
            finished = reply_at is not None and idle_at is not None
            if finished:
                if done is None and grace <= 0:
                    break
                if done is not None and now >= next_done_check:
                    # throttled: a predicate may parse everything received so far
                    if done(res):
                        break
                    next_done_check = now + DONE_CHECK_EVERY_S
                if grace > 0 and now - last_output >= grace:
                    break
            if now > deadline:
                res.status = "timeout"
                res.elapsed = now - t0
                self._interrupt(msg_id)
                raise CellTimeout(
                    f"cell did not finish in {timeout:.0f}s: {code[:80]!r}\n{res.tail()}"
                )
            wait_ms = max(1, int(min(deadline - now, 0.5) * 1000))
            events = dict(poller.poll(wait_ms))
            if kc.shell_channel.socket in events:
                reply = kc.shell_channel.get_msg(timeout=0)
                if reply["parent_header"].get("msg_id") == msg_id:
                    reply_at = time.perf_counter()
                    content = reply["content"]
                    res.status = content.get("status", "error")
                    if res.status == "error":
                        res.error = f"{content.get('ename')}: {content.get('evalue')}"
            if kc.iopub_channel.socket in events:
                while kc.iopub_channel.msg_ready():
                    msg = kc.iopub_channel.get_msg(timeout=0)
                    t = time.perf_counter()
                    if on_iopub is not None and on_iopub(msg, t):
                        last_output = t
                    if self._on_iopub(msg, msg_id, res):
                        last_output = t
                        res.last_output_at = t - t0
                        if (
                            marker is not None
                            and res.marker_at is None
                            and marker in _msg_text(msg)
                        ):
                            res.marker_at = t - t0
                    elif (
                        msg["header"]["msg_type"] == "status"
                        and msg["parent_header"].get("msg_id") == msg_id
                        and msg["content"]["execution_state"] == "idle"
                    ):
                        idle_at = t
            if reply_at is not None and idle_at is not None and math.isnan(res.elapsed):
                res.elapsed = max(reply_at, idle_at) - t0
        if track:
            self.reaper.track(self.pid)
        return res

    def _interrupt(self, msg_id: str, wait: float = 10.0) -> None:
        """Interrupt a cell that overran, so the teardown cell after it can run."""
        if self.km is None or self.kc is None:
            return
        with contextlib.suppress(Exception):
            self.km.interrupt_kernel()
            deadline = time.perf_counter() + wait
            while time.perf_counter() < deadline:
                msg = self.kc.iopub_channel.get_msg(
                    timeout=max(0.01, deadline - time.perf_counter())
                )
                if (
                    msg["header"]["msg_type"] == "status"
                    and msg["parent_header"].get("msg_id") == msg_id
                    and msg["content"]["execution_state"] == "idle"
                ):
                    break
            while self.kc.shell_channel.msg_ready():
                self.kc.shell_channel.get_msg(timeout=0)

    def run(self, code: str, timeout: float = 120.0, **kwargs: Any) -> CellResult:
        """`execute` and raise `CellFailed` unless it succeeded."""
        return self.execute(code, timeout=timeout, **kwargs).check()

    @staticmethod
    def _on_iopub(msg: Message, msg_id: str, res: CellResult) -> bool:
        """Fold one IOPub message into `res`; True when it was an output message."""
        kind = msg["header"]["msg_type"]
        content = msg["content"]
        if kind not in {"stream", "display_data", "update_display_data", "execute_result"}:
            if kind == "error" and msg["parent_header"].get("msg_id") == msg_id:
                res.traceback = "\n".join(content.get("traceback", []))
            return False
        res.n_output_msgs += 1
        if msg["parent_header"].get("msg_id") != msg_id:
            res.n_foreign_msgs += 1
        if kind == "stream":
            text = content.get("text", "")
            res.streams.setdefault(content.get("name", "stdout"), []).append(text)
            return True
        text = str(content.get("data", {}).get("text/plain", ""))
        display_id = (content.get("transient") or {}).get("display_id")
        if display_id:
            res.displays[display_id] = text
        else:
            res.plain.append(text)
        return True


def _msg_text(msg: Message) -> str:
    content = msg["content"]
    if msg["header"]["msg_type"] == "stream":
        return str(content.get("text", ""))
    return str(content.get("data", {}).get("text/plain", ""))


@contextlib.contextmanager
def notebook_kernel(
    cwd: Path,
    cleanup_code: str | None = None,
    log_path: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    **options: Any,
) -> Iterator[NotebookKernel]:
    """A started kernel that is always shut down (peer teardown cell first); ``options``
    go to `NotebookKernel` (kernel_spec, kernel_name, transport, startup_timeout)."""
    nk = NotebookKernel(cwd=cwd, log_path=log_path, extra_env=extra_env, **options)
    try:
        nk.start()
        yield nk
    finally:
        nk.shutdown(cleanup_code)
