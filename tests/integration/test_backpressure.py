"""A notebook thread that draws slower than a rank prints holds the rank back: the output
waiting between the control-plane loop and the notebook stays within the sink's bound,
and every byte still arrives, in order."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from jupyter_dist.common.events import CellFinished, StreamOut
from jupyter_dist.control.event_queue import EventQueue
from tests.conftest import CellOutput

pytestmark = pytest.mark.slow
MIB = 1024 * 1024
LIMIT = 1 * MIB
#: rank 0 prints this much, 16 times the limit; without a bound, nearly all of it would
#: wait in the sink (the slow reader takes 0.02 s an event: 64 MiB took 7.5 s)
FLOOD = 16 * MIB
#: a rank's message carries at most 256 KiB, and each of the two ranks may add one more
SLACK = 2 * 256 * 1024


def test_a_slow_notebook_holds_a_flooding_rank_back_and_loses_nothing(
    run: Callable[[str], CellOutput],
) -> None:
    from jupyter_dist.notebook.owners import embedded_owner

    assert run("%%distributed --session paced --procs 2\nimport os, sys").ok
    plane = embedded_owner()
    session = plane.manager.get("paced")
    code = (
        "import os, sys\n"
        "if int(os.environ['RANK']) == 0:\n"
        "    line = 'z' * 1023 + '\\n'\n"
        f"    for i in range({FLOOD // 1024}):\n"
        "        sys.stdout.write(line)\n"
        "print('end of rank', os.environ['RANK'])\n"
    )
    sink = EventQueue(limit=LIMIT)
    future = plane.loop.submit(session.execute(code, None, sink))
    printed = {0: [], 1: []}
    most_waiting = 0
    try:
        while True:
            most_waiting = max(most_waiting, sink.waiting)
            event = sink.get(timeout=120)
            if isinstance(event, StreamOut):
                printed[event.rank].append(event.text)
                time.sleep(0.02)  # a notebook that draws slowly
            elif isinstance(event, CellFinished):
                break
    finally:
        sink.close()
    result = future.result(timeout=60)
    assert not result.failures, result.failures
    rank0 = "".join(printed[0])
    assert len(rank0) == FLOOD + len("end of rank 0\n")
    assert rank0.count("z" * 1023 + "\n") == FLOOD // 1024 and rank0.endswith("end of rank 0\n")
    assert "".join(printed[1]) == "end of rank 1\n"
    assert sink.held > 0, "the slow reader never held the rank back"
    print(f"\nmost output waiting: {most_waiting / MIB:.2f} MiB (limit {LIMIT / MIB:.0f} MiB)")
    assert most_waiting <= LIMIT + SLACK, most_waiting
    run("%dist shutdown --session paced")
