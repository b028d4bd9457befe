"""Grouping faulthandler dumps into "where each rank is"."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from jupyter_dist.common.stacks import describe, main_thread, one_line, parse_dump, place_of

WORKER = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap
"""


def dump(*frames: tuple[str, int, str]) -> str:
    lines = [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]
    return (
        WORKER
        + "\nCurrent thread 0x00007f0000000001 (most recent call first):\n"
        + ("\n".join(lines) + "\n")
    )


REDUCE = dump(
    ("/x/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
    ("/x/torch/distributed/c10d_logger.py", 83, "wrapper"),
    ("/tmp/ipykernel_7/123.py", 4, "<module>"),
    ("/x/IPython/core/interactiveshell.py", 3577, "run_code"),
    ("/x/jupyter_dist/agent.py", 500, "main"),
)
SLEEP = dump(
    ("/tmp/ipykernel_7/123.py", 9, "<module>"),
    ("/x/IPython/core/interactiveshell.py", 3577, "run_code"),
)
IDLE = dump(
    ("/usr/lib/python3.11/selectors.py", 468, "select"),
    ("/usr/lib/python3.11/asyncio/base_events.py", 1898, "_run_once"),
    ("/x/jupyter_dist/agent.py", 500, "main"),
)


def test_the_main_thread_is_the_one_not_started_by_threading() -> None:
    threads = parse_dump(REDUCE)
    assert len(threads) == 2
    assert main_thread(threads)[0].func == "all_reduce"


def test_ranks_at_the_same_place_are_grouped_biggest_first() -> None:
    text = describe({0: REDUCE, 1: REDUCE, 2: SLEEP, 3: REDUCE, 4: IDLE, 5: ""})
    lines = text.splitlines()
    assert lines[0] == "ranks 0-1,3: in all_reduce (distributed_c10d.py:3252), cell line 4"
    assert lines[1:4] == [
        '    File "/tmp/ipykernel_7/123.py", line 4, in <module>',
        '    File "/x/torch/distributed/c10d_logger.py", line 83, in wrapper',
        '    File "/x/torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
    ]
    assert "rank 2: at cell line 9" in lines
    assert "rank 4: idle (waiting for a cell)" in lines
    assert "rank 5: no stack dump (the process may be gone)" in lines
    assert one_line({0: REDUCE, 1: IDLE}).startswith("rank 0: in all_reduce")


def test_a_real_faulthandler_dump_parses() -> None:
    code = textwrap.dedent(
        """
        import faulthandler, sys, threading, time
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        def deep():
            faulthandler.dump_traceback(sys.stdout, all_threads=True)
        deep()
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = run.stdout
    threads = parse_dump(out)
    assert len(threads) == 2
    assert main_thread(threads)[0].func == "deep"
    assert place_of(out).text == "in deep (<string>:5)"


def test_a_rank_running_its_loop_between_cells_is_idle() -> None:
    """Caught as its event loop runs a callback of C code (no frame of its own), a rank
    that reads its requests on its main thread is between cells: idle, not "in _run"."""
    in_callback = dump(
        ("/usr/lib/python3.11/asyncio/events.py", 80, "_run"),
        ("/usr/lib/python3.11/asyncio/base_events.py", 1922, "_run_once"),
        ("/x/jupyter_dist/agent.py", 500, "main"),
    )
    assert place_of(in_callback).text == "idle (waiting for a cell)"
    # the same loop running a cell is the cell's place
    in_cell = dump(
        ("/tmp/ipykernel_7/123.py", 2, "<module>"),
        ("/usr/lib/python3.11/asyncio/events.py", 80, "_run"),
    )
    assert place_of(in_cell).text == "at cell line 2"
