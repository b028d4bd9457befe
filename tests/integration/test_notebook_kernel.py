"""The magic inside a real notebook kernel: interrupts and the ranks' lifecycle."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.manager import KernelManager

from jupyter_dist.text import strip_ansi
from tests.conftest import ready_client

pytestmark = pytest.mark.slow


@dataclass
class NotebookKernel:
    km: KernelManager
    kc: Any
    text: list[str] = field(default_factory=list)

    def execute(self, code: str, timeout: float = 120) -> dict[str, Any]:
        """Run a cell, collecting its stream output; return the execute_reply content."""

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                self.text.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                self.text.append("\n".join(msg["content"]["traceback"]))

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return reply["content"]  # type: ignore[no-any-return]

    def our_pids(self) -> list[int]:
        """Pids of every agent and rank of every session in the kernel."""
        self.text.clear()
        self.execute(
            "import json\nfrom jupyter_dist.notebook.owners import embedded_owner\n"
            "print('PIDS', json.dumps(embedded_owner().manager.status()))"
        )
        line = next(t for t in "".join(self.text).splitlines() if t.startswith("PIDS"))
        pids = []
        for s in json.loads(line[5:]):
            pids += [n["agent_pid"] for n in s["nodes"]] + [r["pid"] for r in s["ranks"]]
        return pids


@pytest.fixture
def nbk(kernel_name: str, tmp_path: Any) -> Iterator[NotebookKernel]:
    km = KernelManager(kernel_name=kernel_name)
    # these tests follow the stream messages of the text output
    km.start_kernel(cwd=str(tmp_path), env={**os.environ, "JUPYTER_DIST_OUTPUT": "text"})
    kc = ready_client(km, timeout=60)
    kernel = NotebookKernel(km, kc)
    reply = kernel.execute("%load_ext jupyter_dist")
    assert reply["status"] == "ok"
    yield kernel
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


#: seconds processes may take to exit once told to (seconds more on a busy machine)
EXIT_S = 60


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_interrupt_stops_every_rank_and_the_session_stays_usable(nbk: NotebookKernel) -> None:
    assert nbk.execute("%%distributed --procs 2\nimport time\nn = 0")["status"] == "ok"
    msg_id = nbk.kc.execute(
        "%%distributed\nprint('looping', flush=True)\nwhile True:\n    n += 1\n    time.sleep(0.01)"
    )
    deadline = time.monotonic() + 60
    seen = ""
    while "looping" not in seen and time.monotonic() < deadline:
        msg = nbk.kc.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
    assert "looping" in seen
    asked = time.monotonic()
    nbk.km.interrupt_kernel()
    reply = nbk.kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert time.monotonic() - asked < 10
    assert reply["content"]["status"] == "error"
    # one short block saying where the ranks were, without jupyter_dist's own frames
    assert reply["content"]["ename"] == "CellInterrupted"
    shown = strip_ansi("\n".join(reply["content"]["traceback"]))
    assert shown.startswith("CellInterrupted: interrupted on ranks 0-1 in session 'default'")
    assert "cell line 4" in shown
    assert "jupyter_dist/" not in shown and "Traceback" not in shown

    nbk.text.clear()
    # ipykernel aborts requests that reach the notebook kernel before it has finished
    # handling the interrupted cell's error; a person's next cell comes later than that
    time.sleep(0.5)
    first = nbk.execute("%dist pull n")
    time.sleep(0.5)
    again = nbk.execute("%dist pull n")
    assert first["status"] == again["status"] == "ok"
    nbk.text.clear()
    assert nbk.execute("%%distributed\nprint('after', n > 0)")["status"] == "ok"
    assert "[ranks 0-1] after True" in "".join(nbk.text)


def test_interrupt_frees_a_rank_stuck_in_a_collective_and_keeps_every_rank(
    nbk: NotebookKernel,
) -> None:
    """Rank 0 loops in Python, rank 1 waits for it in all_reduce: the interrupt stops
    rank 0, but rank 1 is deaf to it (the wait is in C++). Rank 1 is freed from the
    all_reduce (its group's connections shut) and the notebook says so; no rank is
    replaced, and the next cell works on a new group with both ranks' variables."""
    nbk.execute(
        "import os\nos.environ['JUPYTER_DIST_ABORT_AFTER_S'] = '1'\n"
        "os.environ['JUPYTER_DIST_INTERRUPT_ACK_S'] = '3'"
    )
    setup = "%%distributed --procs 2\nimport time, torch, torch.distributed as dist\nx = 1"
    assert nbk.execute(setup)["status"] == "ok"
    pids = nbk.our_pids()
    msg_id = nbk.kc.execute(
        "%%distributed\nprint('in', flush=True)\n"
        "if dist.get_rank() == 0:\n    while True:\n        time.sleep(0.01)\n"
        "dist.all_reduce(torch.ones(1))"
    )
    seen = ""
    while "] in" not in seen:  # identical lines of both ranks are folded into one
        msg = nbk.kc.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
            seen += msg["content"]["text"]
    time.sleep(1)  # rank 1 is in all_reduce by now
    nbk.text.clear()
    nbk.km.interrupt_kernel()
    reply = nbk.kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "CellInterrupted"
    shown = strip_ansi("\n".join(reply["content"]["traceback"]))
    flat = " ".join(shown.split())
    assert "Rank 1 was blocked in a collective the other ranks were not in" in flat, shown
    assert "freed it" in flat and "Every rank kept its variables" in flat, shown
    assert "replaced" not in flat, shown
    stderr = ""
    while True:  # the notebook's own messages about the cell, up to its idle status
        msg = nbk.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            stderr += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert "blocked in a collective" not in stderr  # said once, in the error
    # both ranks were interrupted at once: no second round of interrupts for rank 1
    assert "interrupting rank 1" not in stderr
    assert nbk.our_pids() == pids  # the same agent and ranks
    nbk.text.clear()
    time.sleep(0.5)  # ipykernel aborts a request that comes before the error is handled
    again = (
        "%%distributed\nt = torch.ones(1); dist.all_reduce(t)\nprint('x' in globals(), t.item())"
    )
    assert nbk.execute(again)["status"] == "ok"
    out = "".join(nbk.text)
    assert "[ranks 0-1] True 2.0" in out, out


def test_counter_stops_after_interrupt(nbk: NotebookKernel) -> None:
    nbk.execute("%%distributed --procs 2\nimport time\nn = 0")
    msg_id = nbk.kc.execute(
        "%%distributed\nimport os\nprint('looping', os.environ['RANK'], flush=True)\n"
        "while True:\n    n += 1\n    time.sleep(0.01)"
    )
    heard, deadline = "", time.monotonic() + 60
    while not ("looping 0" in heard and "looping 1" in heard):  # the counter loop runs
        assert time.monotonic() < deadline, f"the ranks did not start the loop: {heard!r}"
        msg = nbk.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            heard += msg["content"]["text"]
    nbk.km.interrupt_kernel()
    nbk.kc.get_shell_msg(timeout=30)
    counts = []
    for _ in range(2):
        nbk.text.clear()
        nbk.execute("%%distributed\nprint('n', n)")
        counts.append("".join(nbk.text).splitlines()[0])  # not the timing summary
        time.sleep(0.3)
    assert counts[0] == counts[1], counts


def test_shutdown_stops_ranks(nbk: NotebookKernel) -> None:
    nbk.execute("%%distributed --procs 2\nx = 1")
    pids = nbk.our_pids()
    assert len(pids) == 3
    assert nbk.execute("%dist shutdown")["status"] == "ok"
    assert wait_gone(pids, EXIT_S) == []


def test_kernel_exit_stops_ranks(nbk: NotebookKernel) -> None:
    nbk.execute("%%distributed --procs 2\nx = 1")
    pids = nbk.our_pids()
    nbk.km.shutdown_kernel(now=False)
    assert wait_gone(pids, EXIT_S) == []


def test_killed_kernel_leaves_no_rank(nbk: NotebookKernel) -> None:
    nbk.execute("%%distributed --procs 2\nx = 1")
    nbk.execute("%%distributed --session second --procs 1\ny = 2")
    pids = nbk.our_pids()
    assert len(pids) == 5
    os.kill(nbk.km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
    assert wait_gone(pids, EXIT_S) == []


def test_output_streams_while_the_cell_runs(nbk: NotebookKernel, tmp_path: Path) -> None:
    """The ranks print 'late' only once the test has seen 'early': the cell ends only if
    what they print comes while it runs, not when it ends (else no IOPub message comes
    for a minute, and the wait fails)."""
    go = tmp_path / "go"
    nbk.execute("%%distributed --procs 2\nimport os, time")
    msg_id = nbk.kc.execute(
        "%%distributed\nprint('early', flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
        "print('late')"
    )
    seen: list[str] = []
    while not any("late" in text for text in seen):
        msg = nbk.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
            if "early" in seen[-1]:
                go.touch()
    assert any("early" in text for text in seen), seen  # and it came before 'late' did


def test_a_profile_of_the_jupyter_config_folder_starts_the_ranks(
    nbk: NotebookKernel, tmp_path: Path
) -> None:
    """``%%distributed --profile NAME``: the profile's settings, the cell's flags over
    them; ``%dist profiles`` lists the file's profiles; a bad field is named in the
    cell's error by file, profile and field."""
    config = tmp_path / "jupyter-config"
    config.mkdir()
    path = config / "jupyter_dist_profiles.yaml"
    path.write_text(
        "cpu:\n  procs: 3\n  framework: none\n  session: from-profile\n"
        "bad:\n  procs: 1\n  nodes: zero\n"
    )
    nbk.execute(f"import os\nos.environ['JUPYTER_CONFIG_DIR'] = {str(config)!r}")
    nbk.text.clear()
    assert nbk.execute("%dist profiles")["status"] == "ok"
    listed = "".join(nbk.text)
    assert f"profiles in {path}" in listed
    assert "cpu  local       procs=3, framework=none, session=from-profile" in listed, listed
    nbk.text.clear()
    reply = nbk.execute("%%distributed --profile bad\npass")
    shown = strip_ansi("".join(nbk.text))  # a UsageError: its words, on stderr
    assert f"{path}: profile 'bad', field 'nodes': --nodes: 'zero': expected" in shown, shown
    nbk.text.clear()
    reply = nbk.execute(
        "%%distributed --profile cpu --procs 2\n"
        "import os\nprint('on', os.environ['JUPYTER_DIST_SESSION'], os.environ['WORLD_SIZE'])"
    )
    assert reply["status"] == "ok", reply
    assert "[ranks 0-1] on from-profile 2" in "".join(nbk.text), nbk.text
