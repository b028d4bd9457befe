"""%%distributed and %dist through a real IPython shell, with real rank kernels (gloo)."""

from __future__ import annotations

import contextlib
import io
import os
import queue
import re
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from jupyter_dist.common.gpus import discover_gpus
from jupyter_dist.errors import PullError, RanksFailed, SessionError
from jupyter_dist.settings import INTERRUPT_ACK_VAR
from jupyter_dist.text import strip_ansi
from tests.conftest import CellOutput, session_status, wait_until_ready

Run = Callable[[str], CellOutput]


@pytest.fixture(scope="module", autouse=True)
def two_ranks(shell: Any) -> Any:
    """The default session, 2 CPU ranks, shared by this module's tests."""
    result = shell.run_cell("%%distributed --procs 2\nimport torch, torch.distributed as dist")
    assert result.success, result.error_in_exec
    yield
    shell.run_line_magic("dist", "shutdown --all")


def test_all_reduce_across_two_ranks(run: Run) -> None:
    out = run(
        "%%distributed\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item(), 'world', dist.get_world_size())"
    )
    assert out.ok, out.stdout
    assert "[ranks 0-1] sum 3.0 world 2" in out.stdout


def test_state_lives_across_cells(run: Run) -> None:
    assert run("%%distributed\nmine = dist.get_rank() * 10").ok
    out = run("%%distributed\nprint('mine', mine)")
    assert "[rank 0] mine 0" in out.stdout
    assert "[rank 1] mine 10" in out.stdout


def test_ranks_subset_runs_only_there(run: Run) -> None:
    out = run("%%distributed --ranks 1\nonly_one = True\nprint('here', dist.get_rank())")
    assert out.ok
    assert out.stdout.splitlines()[-2:] == ["[rank 1] here 1", out.stdout.splitlines()[-1]]
    assert out.stdout.splitlines()[-1].startswith("[jupyter_dist] done on rank 1 in ")
    assert "[rank 0]" not in out.stdout
    out = run("%%distributed\nprint('only_one' in globals())")
    assert "[rank 0] False" in out.stdout
    assert "[rank 1] True" in out.stdout


def test_rank_info_helpers(run: Run) -> None:
    out = run(
        "%%distributed\n"
        "import jupyter_dist\n"
        "i = jupyter_dist.info()\n"
        "print(i.rank, i.local_rank, i.world_size, i.node_rank, i.is_head)\n"
        "print(jupyter_dist.shard(list(range(10))))"
    )
    assert "[rank 0] 0 0 2 0 True" in out.stdout
    assert "[rank 1] 1 1 2 0 False" in out.stdout
    assert "[rank 0] [0, 1, 2, 3, 4]" in out.stdout
    assert "[rank 1] [5, 6, 7, 8, 9]" in out.stdout


def test_push_a_notebook_function_and_pull_results(shell: Any, run: Run) -> None:
    shell.run_cell("def scale(x):\n    return x * 3\nbase = 7")
    out = run("%%distributed --push scale,base\nresult = scale(base + dist.get_rank())")
    assert out.ok, out.stdout
    assert shell.run_line_magic("dist", "pull result") == [21, 24]


def test_dist_push_sends_arrays_as_buffers(shell: Any, run: Run) -> None:
    shell.run_cell("import numpy as np\narr = np.arange(1_000_000, dtype=np.float64)")
    shell.run_line_magic("dist", "push arr")
    out = run("%%distributed\narr[0] = dist.get_rank() + 100\nprint(arr.sum() - arr[0])")
    assert out.ok, out.stdout
    pulled = shell.run_line_magic("dist", "pull arr")
    assert [a[0] for a in pulled] == [100, 101]
    assert pulled[1][1:].sum() == shell.user_ns["arr"][1:].sum()


def test_pull_of_a_missing_name_names_it(shell: Any) -> None:
    with pytest.raises(PullError, match="'nope' is not defined on rank 0"):  # not a PushError
        shell.run_line_magic("dist", "pull nope")


def test_identical_errors_merge_and_each_traceback_is_shown_once(run: Run) -> None:
    """Text output: the ranks' traceback is shown once, with their output and their rank
    label, after what they printed; the cell's error names it and points there."""
    out = run("%%distributed\nprint('first')\nraise ValueError('same on every rank')")
    assert not out.ok
    assert isinstance(out.error, RanksFailed)
    assert [g.ranks for g in out.error.groups] == [[0, 1]]
    shown = strip_ansi(out.stdout + out.stderr)
    assert shown.count("Traceback (most recent call last)") == 1, shown
    assert "[ranks 0-1] ValueError: same on every rank" in strip_ansi(out.stderr)
    assert "[ranks 0-1] ----> 2 raise ValueError('same on every rank')" in strip_ansi(out.stderr)
    assert shown.index("[ranks 0-1] first") < shown.index("Traceback (most recent call last)")
    said = strip_ansi("\n".join(out.error._render_traceback_()))
    assert "root cause on rank 0" in said or "root cause on rank 1" in said
    assert "(the traceback is above, in the ranks' output)" in said and "Traceback" not in said


def test_one_failing_rank_is_the_root_cause(run: Run) -> None:
    out = run("%%distributed\nif dist.get_rank() == 1:\n    1 / 0\nprint('fine')")
    assert isinstance(out.error, RanksFailed)
    assert out.error.failed_ranks == [1]
    assert "root cause on rank 1" in str(out.error)
    assert "ZeroDivisionError" in out.stdout
    assert "[rank 1] ZeroDivisionError: division by zero" in strip_ansi(out.stderr)
    assert "[rank 0] fine" in out.stdout
    assert run("%%distributed\nprint('still', 'usable')").ok


@pytest.mark.parametrize(
    ("cell", "fragment"),
    [
        ("%%distributed --procs 0\nx", "--procs 0: expected a whole number of at least 1"),
        ("%%distributed --procs two\nx", "--procs 'two': expected a whole number"),
        ("%%distributed --ranks 1-x\nx", "'1-x' is not a rank or a range"),
        ("%%distributed --ranks 5\nx", "rank 5 does not exist"),
        ("%%distributed --backend mpi\nx", "--backend 'mpi': expected one of gloo, nccl"),
        ("%%distributed --push undefined_thing\nx", "'undefined_thing' is not defined"),
        ("%%distributed --session 'a b'\nx", "--session"),
        ("%%distributed --timeout -1\nx", "--timeout -1"),
        ("%%distributed\nfor x in\n", "syntax error at line 1"),
        ("%%distributed --procs 3\nx", "is running 2 CPU ranks (gloo)"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(run: Run, cell: str, fragment: str) -> None:
    before = session_status("default")["cells_run"]
    out = run(cell)
    assert not out.ok
    assert fragment in str(out.error) + out.stdout + out.stderr
    assert session_status("default")["cells_run"] == before


def test_unpicklable_push_is_refused(shell: Any, run: Run) -> None:
    shell.run_cell("import threading\nlock = threading.Lock()")
    out = run("%%distributed --push lock\nprint(lock)")
    assert not out.ok
    assert "cannot send an object of type dict" in str(out.error)


def test_timeout_interrupts_and_keeps_the_session(run: Run) -> None:
    out = run("%%distributed --timeout 2\nimport time\ntime.sleep(120)")
    assert not out.ok
    assert type(out.error).__name__ == "CellTimeout"
    # one short block: where the ranks were, not the KeyboardInterrupt that stopped them
    assert "timed out after 2 s on ranks 0-1" in out.stdout
    assert "ranks 0-1: at cell line 2: time.sleep(120)" in out.stdout
    assert "Traceback" not in out.stdout
    assert run("%%distributed\nprint('after timeout')").ok


def test_a_timeout_tells_a_frozen_kernel_from_a_slow_cell(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank whose kernel never took the cell up (here: stopped by SIGSTOP) is named as
    such, apart from a rank that is still inside its cell."""
    # the frozen rank is given this long to take the interrupt (10 s by default); the other
    # must take it within it, on a loaded machine too. Read when the session starts.
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "3")
    assert run("%%distributed --session frozen --procs 2\nimport time").ok
    frozen = session_status("frozen")["ranks"][1]["pid"]
    os.kill(frozen, signal.SIGSTOP)
    try:
        out = run("%%distributed --session frozen --timeout 3\ntime.sleep(60)")
    finally:
        with contextlib.suppress(ProcessLookupError):  # the stuck rank is replaced
            os.kill(frozen, signal.SIGCONT)
    assert isinstance(out.error, RanksFailed)
    assert type(out.error).__name__ == "CellTimeout"
    failures = {f.rank: f for f in out.error.failures}
    assert failures[1].headline() == (
        "CellTimeout: still running 3.0 s after the cell started, and did not take an "
        "interrupt within 3 s; its kernel never reported starting the cell"
    )
    # rank 0 was inside its cell: the interrupt stopped it there
    assert failures[0].ename == "KeyboardInterrupt"
    # the frozen rank alone was replaced: rank 0 kept its variables
    said = " ".join(str(out.error).split())
    assert "rank 1 replaced by a fresh rank kernel" in said, said
    assert "every other rank kept its variables" in said, said
    assert not psutil.pid_exists(frozen) or psutil.Process(frozen).status() == "zombie"
    out = run("%%distributed --session frozen\nprint('fresh', 'time' in globals())")
    assert "[rank 0] fresh True" in out.stdout and "[rank 1] fresh False" in out.stdout, out.stdout
    assert run("%dist shutdown --session frozen").ok


def test_status_is_a_table_of_sessions_then_ranks(run: Run) -> None:
    out = run("%dist status")
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("session "))
    assert lines[header].split()[:4] == ["session", "state", "shape", "owner"]
    row = lines[header + 1]
    assert row.startswith("default") and "ready" in row and "2 CPU ranks (gloo)" in row
    assert "this kernel" in row
    column = lines[header].index("cells run")  # columns are aligned under their names
    cells_run = int(row[column:].split()[0])
    assert cells_run >= 1  # the module's setup cell, at least
    up = row[lines[header].index(" up ") + 1 :].split()[0]
    assert up != "-"  # how long the session has been ready
    ranks = next(line for line in lines if line.strip().startswith("rank  node"))
    assert "memory" in ranks and "last error" in ranks
    rank_1 = next(line for line in lines if line.strip().startswith("1 ") and "idle" in line)
    assert "MiB" in rank_1  # a local rank's memory is read off its process


def test_rich_output_per_rank(run: Run) -> None:
    out = run("%%distributed\ndist.get_rank() * 2")
    assert "[rank 0] Out: 0" in out.stdout
    assert "[rank 1] Out: 2" in out.stdout


def test_second_session_side_by_side(run: Run) -> None:
    out = run(
        "%%distributed --session other --procs 1 --no-init\n"
        "import torch.distributed as dist\nprint(dist.is_initialized())"
    )
    assert out.ok, out.stdout
    assert "[rank 0] False" in out.stdout
    # a cell that names no session runs on the one the notebook last used, saying so
    out = run("%%distributed\nprint(dist.is_initialized())")
    assert out.ok and "[rank 0] False" in out.stdout, out.stdout
    assert "running on session 'other', the one this notebook last used" in out.stdout
    assert "this notebook's session: 'other'" in run("%dist status").stdout
    assert run("%dist shutdown").ok  # the notebook's session: 'other'
    with pytest.raises(SessionError):
        session_status("other")
    # then the notebook's own session again, which kept running all along
    out = run("%%distributed\nprint(dist.get_world_size())")
    assert out.ok and "[ranks 0-1] 2" in out.stdout, out.stdout
    assert "no longer running" not in out.stdout and "ready" not in out.stdout, out.stdout


@pytest.mark.skipif(discover_gpus() != [], reason="machine has GPUs")
def test_gpus_without_cuda_points_to_procs(run: Run) -> None:
    out = run("%%distributed --session gpus --gpus 2\nprint('never')")
    assert not out.ok
    message = str(out.error)
    assert "--gpus 2" in message
    assert "has 0 CUDA devices" in message
    assert "use --procs 2" in message
    assert "never" not in out.stdout


def test_rich_display_from_a_rank(shell: Any, run: Run) -> None:
    published: list[dict[str, Any]] = []
    pub = shell.display_pub
    original = pub.publish

    def record(data: dict[str, Any], metadata: Any = None, **kwargs: Any) -> None:
        published.append(data)

    pub.publish = record
    try:
        out = run(
            "%%distributed --ranks 1\nfrom IPython.display import HTML, display\n"
            "display(HTML('<b>from rank one</b>'))"
        )
    finally:
        pub.publish = original
    assert out.ok
    assert "[rank 1]" in out.stdout
    assert published[0]["text/html"] == "<b>from rank one</b>"


def test_dist_alone_lists_its_commands(run: Run) -> None:
    out = run("%dist")
    assert out.ok, out.stdout + out.stderr
    assert out.stdout.startswith("usage: %dist COMMAND"), out.stdout
    for command in ("status", "stacks", "attach NAME", "shutdown", "restart", "interrupt",
                    "push NAMES", "pull NAME"):  # fmt: skip
        assert f"  %dist {command} " in out.stdout, command
    assert "required" not in out.stdout + out.stderr
    wrong = run("%dist stauts")
    assert "%dist stauts: unknown command" in wrong.stdout + wrong.stderr
    assert "%dist status" in wrong.stdout + wrong.stderr


def test_help_is_a_real_manual(shell: Any) -> None:
    doc = shell.find_cell_magic("distributed").__doc__
    for flag in (
        "--nodes",
        "--gpus",
        "--procs",
        "--backend",
        "--ranks",
        "--session",
        "--push",
        "--timeout",
        "--no-init",
    ):
        assert flag in doc
    assert "status" in shell.find_line_magic("dist").__doc__


def test_master_port_comes_from_the_allowed_range(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_dist.common.ports import PORTS_VAR, free_port

    lo = free_port()
    monkeypatch.setenv(PORTS_VAR, f"{lo}-{lo + 2}")
    out = run(
        "%%distributed --session ports --procs 1\n"
        "import os\nprint('port', os.environ['MASTER_PORT'])"
    )
    assert out.ok, out.stdout
    port = int(out.stdout.split("port ")[1].split()[0])
    assert lo <= port <= lo + 2
    assert run("%dist shutdown --session ports").ok
    monkeypatch.setenv(PORTS_VAR, "9-x")
    out = run("%%distributed --session ports --procs 1\nprint(1)")
    assert not out.ok and "JUPYTER_DIST_MASTER_PORTS '9-x'" in out.stderr + out.stdout


def test_stacks_show_idle_ranks_and_where_a_hang_is(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = run("%dist stacks")
    assert out.ok, out.stdout
    assert "ranks 0-1: idle (waiting for a cell)" in out.stdout

    monkeypatch.setenv("JUPYTER_DIST_STRAGGLER_S", "1")
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "2")  # deaf ranks: 10 s by default
    assert run("%%distributed --session hang --procs 3\nimport torch, torch.distributed as dist").ok
    out = run(
        "%%distributed --session hang --timeout 4\n"
        "if dist.get_rank() != 2:\n"
        "    dist.all_reduce(torch.ones(1))  # rank 2 never joins\n"
    )
    assert not out.ok
    text = out.stdout + out.stderr
    # the watchdog names the stragglers and where they wait, before the timeout
    assert re.search(
        r"ranks 0-1 still running 1 s after the other ranks finished: "
        r"ranks 0-1: in all_reduce \(distributed_c10d\.py:\d+\), cell line 2",
        text,
    )
    # the timeout reads the stacks before interrupting, and says where ranks were once
    assert re.search(
        r"timed out after 4 s; interrupting: ranks 0-1: in all_reduce \(distributed_c10d\.py",
        text,
    )
    assert "CellTimeout" in text
    # the two ranks deaf in the all_reduce were freed from it: none replaced
    assert isinstance(out.error, RanksFailed)
    assert sorted(f.rank for f in out.error.failures) == [0, 1], out.error.failures
    said = " ".join(str(out.error).split())
    assert "Ranks 0-1 were blocked in a collective the other ranks were not in" in said, said
    assert "Every rank kept its variables" in said and "replaced" not in said, said
    assert run("%dist shutdown --session hang").ok


def test_asking_where_ranks_are_never_kills_one(run: Run) -> None:
    """Stack dumps taken while a rank's threads start and end. faulthandler's all-threads
    dump crashes such a process now and then (it reads thread states without the GIL);
    the rank's own thread answers instead, and every rank lives through every dump."""
    churn = (
        "%%distributed\n"
        "import threading\n"
        "_churning = threading.Event()\n"
        "def _churn():\n"
        "    while not _churning.is_set():\n"
        "        t = threading.Thread(target=sum, args=(range(50),)); t.start(); t.join()\n"
        "for _ in range(3):\n"
        "    threading.Thread(target=_churn, daemon=True).start()\n"
    )
    assert run(churn).ok
    try:
        for _ in range(40):
            out = run("%dist stacks")
            assert out.ok, out.stdout
            assert "ranks 0-1: idle (waiting for a cell)" in out.stdout, out.stdout
    finally:
        run("%%distributed\n_churning.set()")
    out = run("%%distributed\nprint('alive', dist.get_rank())")
    assert out.ok and "[rank 0] alive 0" in out.stdout and "[rank 1] alive 1" in out.stdout


def test_a_rank_whose_gil_is_held_still_says_where_it_is(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank stuck in C code that holds the GIL cannot answer from a thread of its own;
    faulthandler's signal handler, which needs no GIL, says where it is instead."""
    monkeypatch.setenv("JUPYTER_DIST_ABORT_AFTER_S", "1")
    monkeypatch.setenv(INTERRUPT_ACK_VAR, "2")  # a deaf rank: 10 s by default
    assert run("%%distributed --session gil --procs 1\nx = 1").ok
    out = run(
        "%%distributed --session gil --timeout 3\n"
        "x = 2\n"
        "sum(range(10**12))  # C code, GIL held, deaf to an interrupt\n"
    )
    assert not out.ok
    text = out.stdout + out.stderr
    assert re.search(r"timed out after 3 s; interrupting: rank 0: at cell line 2", text), text
    assert run("%dist shutdown --session gil").ok


def test_rank_tracebacks_name_the_notebooks_cell_count(shell: Any, run: Run) -> None:
    """The ranks run each cell under the notebook's execution count, so a rank's
    traceback says ``Cell In[N]`` for the N the notebook shows, not the rank's own."""
    cell = "%%distributed{}\ndef f():\n    raise ValueError('counted')\nf()"
    shell.execution_count = 41
    out = run(cell.format(""))
    assert isinstance(out.error, RanksFailed)
    text = strip_ansi("\n".join(out.error.failures[0].traceback))
    assert "Cell In[41], line 3" in text and "Cell In[41], line 2, in f()" in text, text
    # a cell that goes into the history, as a notebook's do: IPython counts past it
    # before it runs, and the notebook shows the number it had
    shell.execution_count = 7
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = shell.run_cell(cell.format(" --ranks 1"), store_history=True)
    assert result.execution_count == 7 and shell.execution_count == 8
    assert isinstance(result.error_in_exec, RanksFailed)
    shown = strip_ansi("\n".join(result.error_in_exec.failures[0].traceback))
    assert "Cell In[7], line 3" in shown, shown


@contextlib.contextmanager
def _console_on_rank_0() -> Iterator[Any]:
    """A client of the default session's rank 0 kernel, as a console on it would be."""
    from jupyter_client.blocking import BlockingKernelClient

    from jupyter_dist.notebook.owners import embedded_owner

    session = embedded_owner().manager.get("default")
    rec = session.ranks[0]
    assert rec.connection is not None
    console = BlockingKernelClient()
    console.load_connection_info({**rec.connection, "key": session.key})
    console.start_channels()
    try:
        wait_until_ready(console)
        yield console
    finally:
        console.stop_channels()


def test_ranks_echo_the_code_of_other_clients_but_not_the_notebooks_cells(run: Run) -> None:
    """A rank does not echo the notebook side's cells on IOPub (it has their code, and
    at many ranks the echo would be a quarter of a cell's messages); a console on the
    rank still gets the echo of its own requests, as with any kernel."""
    with _console_on_rank_0() as console:
        while console.iopub_channel.msg_ready():
            console.get_iopub_msg(timeout=1)
        out = run("%%distributed --ranks 0\necho_marker = 1")
        assert out.ok, out.stdout
        seen: list[str] = []
        msg_id = console.execute("echo_marker + 1")
        while True:
            msg = console.get_iopub_msg(timeout=30)
            seen.append(msg["msg_type"])
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
                assert msg["content"]["code"] == "echo_marker + 1"
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["content"].get("execution_state") == "idle"
            ):
                break
        echoes = [t for t in seen if t == "execute_input"]
        # the notebook's cell ran first on this rank: busy, idle and no echo; then the
        # console's request, echoed once
        assert echoes == ["execute_input"], seen


def _notebook_cell_messages(
    console: Any, out_of: Callable[[], CellOutput]
) -> list[tuple[str, Any]]:
    """What a console on rank 0 saw on IOPub of the notebook's cell ``out_of`` runs:
    ``(msg_type, content)`` of each message whose parent is an execute_request of the
    notebook side, up to its reply and, if a status follows, that too."""
    from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE

    while console.iopub_channel.msg_ready():
        console.get_iopub_msg(timeout=1)
    out = out_of()
    seen: list[tuple[str, Any]] = []

    def ended() -> bool:
        """The reply came, and the idle that follows it where busy was said."""
        kinds = [(kind, content.get("execution_state")) for kind, content in seen]
        said_busy = ("status", "busy") in kinds
        return (EXECUTE_REPLY_MSG_TYPE, None) in kinds and (
            not said_busy or ("status", "idle") in kinds
        )

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            msg = console.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            if ended():
                break  # and nothing more came
            continue
        if msg["parent_header"].get("msg_type") == "execute_request":
            seen.append((msg["msg_type"], msg["content"]))
    assert out is not None
    return seen


def test_a_notebook_cell_is_answered_on_iopub_behind_its_output(run: Run) -> None:
    """A rank answers the notebook side's cell with one IOPub message after the cell's
    output (`rank.iopub_reply`): a short cell costs its output and that reply, with no
    busy, idle or shell reply; a cell that runs long says busy, then its output, its
    reply and idle, for the other clients of the rank; an error's reply says what it was.

    What is short is the rank's to say (`BUSY_AFTER_S`), and a loaded machine may keep
    any cell past it: the short cells run with the rank's limit raised, the long one
    prints only once its rank has said busy."""
    from jupyter_dist.common.wire_names import EXECUTE_REPLY_MSG_TYPE
    from jupyter_dist.rank.iopub_reply import BUSY_AFTER_S

    notice = "get_ipython().kernel._iopub_replies.busy"
    with _console_on_rank_0() as console:
        assert run(f"%%distributed\n{notice}.after_s = 3600").ok
        try:
            for _ in range(3):
                short = _notebook_cell_messages(
                    console, lambda: run("%%distributed\nprint('short')")
                )
                assert [kind for kind, _ in short] == ["stream", EXECUTE_REPLY_MSG_TYPE], short
                output, reply = short
                assert output[1]["text"] == "short\n" and reply[1]["status"] == "ok", short
            failed = _notebook_cell_messages(console, lambda: run("%%distributed\n1/0"))
            assert [kind for kind, _ in failed] == ["error", EXECUTE_REPLY_MSG_TYPE], failed
            reply = failed[-1]
            assert reply[1]["status"] == "error", failed
            assert reply[1]["ename"] == "ZeroDivisionError" and reply[1]["traceback"], reply
        finally:  # the limit back, and its watcher woken from its wait for the old one
            reset = f"{notice}.after_s = {BUSY_AFTER_S!r}\nwith {notice}._changed:\n"
            assert run(f"%%distributed\n{reset}    {notice}._changed.notify()").ok
        long = _notebook_cell_messages(
            console,
            lambda: run(
                "%%distributed\nimport time\ndeadline = time.monotonic() + 60\n"
                f"while not {notice}.said_busy and time.monotonic() < deadline:\n"
                "    time.sleep(0.01)\nprint('long')"
            ),
        )
        kinds = [(kind, c.get("execution_state")) for kind, c in long]
        assert kinds == [
            ("status", "busy"),
            ("stream", None),
            (EXECUTE_REPLY_MSG_TYPE, None),
            ("status", "idle"),
        ], long
        assert long[1][1]["text"] == "long\n" and long[2][1]["status"] == "ok", long
        # the console's own request takes ipykernel's usual way: a reply on shell
        msg_id = console.execute("2 + 2")
        answer = console.get_shell_msg(timeout=30)
        assert answer["parent_header"]["msg_id"] == msg_id
        assert answer["msg_type"] == "execute_reply" and answer["content"]["status"] == "ok"


def test_every_ranks_iopub_comes_through_the_sessions_one_subscriber(run: Run) -> None:
    """The ranks' IOPub (statuses and output, most of a cell's messages) is read through
    one SUB socket of the session, from one relay a node, and each message still reaches
    its own rank."""
    from jupyter_dist.notebook.owners import embedded_owner

    session = embedded_owner().manager.get("default")
    clients = [rec.client for rec in session.ranks.values()]
    assert all(c is not None and "iopub" not in c.sockets for c in clients)
    fan_in = session._iopub
    assert fan_in is not None and set(fan_in._urls) == set(clients)
    # through the node's relay: one endpoint for both ranks
    assert len(fan_in.endpoints) == 1 and next(iter(fan_in.endpoints)).endswith("relay-iopub")
    dropped, batched = fan_in.unknown, fan_in.batched  # before: earlier kernels' last words
    out = run("%%distributed\nprint('I am', dist.get_rank(), 'of', dist.get_world_size())")
    assert out.ok, out.stdout
    assert "[rank 0] I am 0 of 2" in out.stdout and "[rank 1] I am 1 of 2" in out.stdout
    assert fan_in.unknown == dropped, fan_in.last_unknown
    assert fan_in.batched >= batched + 2 * 2  # output and reply of each rank


def test_rank_kernels_skip_what_no_one_reads(run: Run) -> None:
    """A rank's kernel builds no debug log records only to drop them, does not sleep
    between a cell's output and its reply (the notebook side waits for both anyway), and
    reads its shell requests on its main thread, without a hand-off from another."""
    out = run(
        "%%distributed\n"
        "import logging\n"
        "k = get_ipython().kernel\n"
        "print('debug', k.log.isEnabledFor(logging.DEBUG), 'warn',"
        " k.log.isEnabledFor(logging.WARNING), 'sleep', k._execute_sleep,"
        " 'shell thread', k.shell_channel_thread)"
    )
    assert out.ok, out.stdout
    assert "[ranks 0-1] debug False warn True sleep 0.0 shell thread None" in out.stdout


def test_ranks_keep_no_copy_of_what_they_print(run: Run) -> None:
    """IPython 9 appends every piece a cell prints to its history's ``outputs`` for good;
    a rank printing for hours would hold all of it. A rank keeps none of it (the notebook
    side has it), while its results (``Out``) are kept as in any kernel."""
    out = run(
        "%%distributed\n"
        "for i in range(2000):\n"
        "    print(f'step {i} loss {i * 1e-6:.6f}')\n"
        "import sys\n"
        "sys.stderr.write('a warning\\n')\n"
        "6 * 7"
    )
    assert out.ok, out.stdout
    # folded into one line when both ranks' copies arrive together (not on a busy machine)
    last = "step 1999 loss 0.001999"
    assert f"[ranks 0-1] {last}" in out.stdout or all(
        f"[rank {rank}] {last}" in out.stdout for rank in (0, 1)
    ), out.stdout[-2000:]
    out = run(
        "%%distributed\n"
        "ip = get_ipython()\n"
        "kept = sum(len(o.bundle['stream']) for outs in ip.history_manager.outputs.values()\n"
        "           for o in outs if o.output_type in ('out_stream', 'err_stream'))\n"
        "print('shell', type(ip).__qualname__, 'as', type(ip).__name__, 'printed pieces kept',\n"
        "      kept, 'results kept', 42 in ip.user_ns['Out'].values())"
    )
    assert out.ok, out.stdout
    # a notebook kernel's shell to libraries that look at its name (rich's live displays)
    shell = "shell RankShell as ZMQInteractiveShell"
    assert f"[ranks 0-1] {shell} printed pieces kept 0 results kept True" in out.stdout
