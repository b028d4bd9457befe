"""A rank's input(), getpass(), breakpoint() and post-mortem debugger, answered through the
notebook kernel's own stdin channel as a frontend answers it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.integration.stdin_frontend import Prompt, StdinFrontend, stdin_frontend

pytestmark = pytest.mark.slow

STEPPER = """\
def twice(value):
    doubled = 2 * value
    return doubled
"""


@pytest.fixture(scope="module")
def nb(kernel_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdinFrontend]:
    folder = tmp_path_factory.mktemp("rank-debugging")
    (folder / "stepper.py").write_text(STEPPER)
    with stdin_frontend(kernel_name, folder) as frontend:
        started = frontend.run(
            "%%distributed --procs 2\n"
            "import getpass, os, sys\nimport torch\nimport torch.distributed as dist\n"
            f"sys.path.insert(0, {str(folder)!r})\nimport stepper\n"
            "rank = int(os.environ['RANK'])\nx = 10 * rank"
        )
        assert started.reply["status"] == "ok", started.text
        yield frontend


def test_input_of_two_ranks_is_asked_in_rank_order_saying_how_many_wait(
    nb: StdinFrontend,
) -> None:
    run = nb.run(
        "%%distributed\ndist.barrier()\nvalue = input('val?')\nprint('got', repr(value))",
        ["zero", "one"],
    )
    assert run.reply["status"] == "ok", run.text
    assert run.prompts == [
        Prompt("[rank 0; 1 more waiting] val?", False),
        Prompt("[rank 1] val?", False),
    ]
    assert "[rank 0] got 'zero'" in run.text and "[rank 1] got 'one'" in run.text

    secret = nb.run(
        "%%distributed\ndist.barrier()\npw = getpass.getpass('token?')\nprint('length', len(pw))",
        ["abc", "abcdef"],
    )
    assert secret.reply["status"] == "ok", secret.text
    assert secret.prompts == [
        Prompt("[rank 0; 1 more waiting] token?", True),
        Prompt("[rank 1] token?", True),
    ]
    assert "[rank 0] length 3" in secret.text and "[rank 1] length 6" in secret.text
    assert "abcdef" not in secret.text


def test_breakpoint_on_rank_1_steps_through_the_cell_and_a_module(nb: StdinFrontend) -> None:
    run = nb.run(
        "%%distributed\n"
        "if rank == 1:\n"
        "    breakpoint()\n"
        "    y = stepper.twice(x)\n"
        "else:\n"
        "    y = stepper.twice(x)\n"
        "total = torch.tensor([float(y)])\n"
        "dist.all_reduce(total)\n"
        "print('total', total.item())",
        ["p x", "s", "n", "n", "l", "p doubled", "w", "up", "p x + 1", "c"],
    )
    assert run.reply["status"] == "ok", run.text
    assert [p.text for p in run.prompts] == ["[rank 1] ipdb> "] * 10
    text = run.text
    assert "[rank 1] 10" in text  # p x
    assert re.search(r"\[rank 1\] .*stepper\.py\(2\)twice\(\)", text), text  # s
    assert "[rank 1] ----> 3     return doubled" in text  # l, in the module
    assert "[rank 1] 20" in text  # p doubled, after n
    assert re.search(r"\[rank 1\] .*<module>\(\)", text), text  # w: the cell's frame too
    assert "[rank 1] 11" in text  # up, then p x + 1 in the cell's frame
    # rank 0 went on until the all_reduce, which waited for rank 1; the cell view said who
    assert "rank 1 in the debugger" in text
    assert "rank 0 runs on until it waits for it" in text
    assert "[ranks 0-1] total 20.0" in text


def test_pdb_ipdb_and_torchs_breakpoint_open_the_debugger_on_their_rank(
    nb: StdinFrontend,
) -> None:
    plain = nb.run(
        "%%distributed\nimport pdb\nif rank == 1:\n    pdb.set_trace()\n    w = x\n"
        "print('after pdb')",
        ["p x + 3", "c"],
    )
    assert plain.reply["status"] == "ok", plain.text
    assert [p.text.split("]")[0] for p in plain.prompts] == ["[rank 1"] * 2, plain.prompts
    assert "[rank 1] 13" in plain.text, plain.text
    assert "[rank 0] after pdb" in plain.text and "[rank 1] after pdb" in plain.text

    ipdb = nb.run(
        "%%distributed\nimport ipdb\nif rank == 1:\n    ipdb.set_trace()\n    w = x\n"
        "print('after ipdb')",
        ["p x + 4", "c"],
    )
    assert ipdb.reply["status"] == "ok", ipdb.text
    assert [p.text for p in ipdb.prompts] == ["[rank 1] ipdb> "] * 2, ipdb.prompts
    assert "[rank 1] 14" in ipdb.text, ipdb.text
    assert "[rank 0] after ipdb" in ipdb.text and "[rank 1] after ipdb" in ipdb.text

    # torch's: the debugger on rank 1, the other ranks held at its barrier until it goes on
    held = nb.run(
        "%%distributed\ndist.breakpoint(rank=1)\nprint('after torch', rank)",
        ["p rank * 5", "c"],
    )
    assert held.reply["status"] == "ok", held.text
    assert [p.text.split("]")[0] for p in held.prompts] == ["[rank 1"] * 2, held.prompts
    assert "[rank 1] 5" in held.text
    assert "[rank 0] after torch 0" in held.text and "[rank 1] after torch 1" in held.text


def test_q_ends_the_cell_as_an_interrupt_and_the_variables_stay(nb: StdinFrontend) -> None:
    run = nb.run("%%distributed\nif rank == 1:\n    breakpoint()\n    x = -1\nz = 1", ["q"])
    assert run.reply["status"] == "error"
    assert run.reply["ename"] == "RanksFailed"
    assert "interrupted on rank 1" in run.text, run.text
    assert "rank 1: in the debugger, which was quit (q)" in run.text
    # PYTHONBREAKPOINT=0 turns breakpoint() off as in any Python
    after = nb.run(
        "%%distributed\nos.environ['PYTHONBREAKPOINT'] = '0'\nbreakpoint()\n"
        "del os.environ['PYTHONBREAKPOINT']\nprint('x is', x)"
    )
    assert after.reply["status"] == "ok", after.text
    assert after.prompts == []
    # the cell ended on rank 1 at its breakpoint: x kept, the lines after it not run
    assert "[rank 0] x is 0" in after.text and "[rank 1] x is 10" in after.text


def test_the_stop_button_ends_the_debugging_session_and_the_cell(nb: StdinFrontend) -> None:
    def stop(prompt: Prompt) -> None:
        nb.km.interrupt_kernel()

    run = nb.run("%%distributed\nif rank == 1:\n    breakpoint()\n    x = -1", on_prompt=stop)
    assert run.reply["status"] == "error"
    assert run.reply["ename"] == "CellInterrupted", run.text
    assert "rank 1: the cell was interrupted while the rank was in the debugger" in run.text
    deadline = time.monotonic() + 60
    while True:  # ipykernel aborts requests that come while it handles the interrupt
        after = nb.run("%%distributed\nprint('x is', x)")
        if after.reply["status"] != "aborted" or time.monotonic() > deadline:
            break
    assert after.reply["status"] == "ok", after.text
    assert "[rank 1] x is 10" in after.text


def test_a_frontend_without_stdin_gets_the_clear_error(nb: StdinFrontend) -> None:
    run = nb.run("%%distributed --ranks 1\ninput('val?')", allow_stdin=False)
    assert run.reply["status"] == "error"
    assert run.prompts == []
    assert (
        "StdinNotImplementedError: raw_input was called, but this frontend does not support "
        "input requests." in run.text
    )


def test_dist_debug_opens_pdb_on_the_failing_rank(nb: StdinFrontend) -> None:
    failed = nb.run(
        "%%distributed\ndef divide(a):\n    kept = a + 7\n    return 1 / (a - rank)\ndivide(1)"
    )
    assert failed.reply["status"] == "error"
    assert "root cause on rank 1" in failed.text
    run = nb.run("%dist debug", ["p kept", "q"])
    assert run.reply["status"] == "ok", run.text
    assert [p.text for p in run.prompts] == ["[rank 1] ipdb> "] * 2
    assert "return 1 / (a - rank)" in run.text
    assert "[rank 1] 8" in run.text
    again = nb.run("%dist debug --rank 1", ["p a", "q"])
    assert "[rank 1] 1" in again.text, again.text
