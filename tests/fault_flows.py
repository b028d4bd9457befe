"""The fault scenarios a cluster launcher's live session goes through, in its own tests.

Each flow runs notebook cells through a `Cell` (the launcher's notebook: a real notebook
kernel, or the test's IPython shell) on a session of two ranks, one a node, and checks
what a fault may cost: only what it touched. A survivor's variable is unchanged, an
all_reduce over the new process group is right, and the group's generation counts on.

* `hang_is_freed`: rank 0 waits in a barrier rank 1 never joins; the stop frees it (its
  process group's connections are shut), it is not replaced.
* `ddp_goes_on_bitwise`: a deterministic DDP loop loses rank 1 at step 10; the next cell
  replaces it, ``%dist sync model,opt --from 0`` gives it rank 0's state, and step 20's
  weights are bitwise those of an unbroken run.
* `resize_two_three_two`: ``%dist resize --nodes 3``, then ``--nodes 2``.

The local versions are in tests/integration (test_stop_hang.py, test_recovery.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.rank_lines import with_start
from tests.integration.test_recovery import DDP_SETUP

#: runs a notebook cell: whether it succeeded, and all it showed (output, errors)
Cell = Callable[[str], tuple[bool, str]]

#: per rank: an all_reduce of rank+1 over the session's group, the world size, the
#: group's generation, what it kept of ``kept``, its pid
SUM = (
    "import os, torch, torch.distributed as dist, jupyter_dist\n"
    "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
    "print('sum', int(t.item()), 'world', dist.get_world_size(), 'generation', "
    "jupyter_dist.info().generation, 'kept', globals().get('kept'), 'pid', os.getpid())\n"
)


def flat(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces."""
    return " ".join(text.split())


def sums(cell: Cell, session: str) -> tuple[dict[int, dict[str, str]], str]:
    """What each rank said running `SUM` (``sum``, ``world``, ``generation``, ``kept``,
    ``pid``), and the cell's text."""
    ok, text = cell(f"%%distributed --session {session}\n{SUM}")
    assert ok, text
    said = {}
    for rank, lines in with_start(text, "sum ").items():
        words = lines[0].split()
        said[rank] = dict(zip(words[::2], words[1::2], strict=True))
    return said, text


def check_sums(
    cell: Cell, session: str, generation: int, kept: dict[int, object]
) -> dict[int, dict[str, str]]:
    """`sums`, checked: every rank of ``kept`` (and no other) answered, the all_reduce is
    right for that many, the group is ``generation``, and each kept ``kept[rank]``."""
    said, text = sums(cell, session)
    world = len(kept)
    want = {
        r: {"sum": str(world * (world + 1) // 2), "world": str(world),
            "generation": str(generation), "kept": str(k)}
        for r, k in kept.items()
    }  # fmt: skip
    got = {r: {k: v for k, v in s.items() if k != "pid"} for r, s in said.items()}
    assert got == want, text
    return said


def _when_files(paths: list[Path], then: Callable[[], None]) -> threading.Thread:
    """A started thread that calls ``then`` once every one of ``paths`` exists (it gives up
    after two minutes; the caller's cell then runs on and the caller's checks say so)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(p.exists() for p in paths):
                then()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def hang_is_freed(cell: Cell, session: str, stop: Callable[[], None], mark: Path) -> int:
    """Rank 0 waits in ``dist.barrier()``, rank 1 finished the cell; ``stop`` (the stop
    button, or ``%dist interrupt``) ends the cell. Rank 0 took no interrupt (its wait is in
    C++): it is freed, not replaced, and both ranks keep their processes and variables.
    Needs ``JUPYTER_DIST_INTERRUPT_ACK_S`` set low where the session started. The new
    generation."""
    on = f"%%distributed --session {session}\nimport torch.distributed as dist\n"
    assert cell(f"{on}kept = 70 + dist.get_rank()")[0]
    before = sums(cell, session)[0]
    generation = int(before[0]["generation"])
    # each rank leaves a file: rank 0 as it enters the barrier, rank 1 as it ends the cell
    hang = (
        f"{on}open({str(mark)!r} + '-' + str(dist.get_rank()), 'w').close()\n"
        "if dist.get_rank() == 0:\n    dist.barrier()\n"
    )
    stopper = _when_files([Path(f"{mark}-0"), Path(f"{mark}-1")], stop)
    ok, text = cell(hang)
    stopper.join()
    said = flat(text)
    assert not ok, f"the hang was not stopped: {text}"
    assert "Rank 0 was blocked in a collective the other ranks were not in" in said, text
    assert "shutting the process group's connections freed it" in said, text
    assert "Every rank kept its variables" in said, text
    assert "replaced" not in said and "could not be stopped" not in said, text
    after = check_sums(cell, session, generation + 1, {0: 70, 1: 71})
    pids = {r: s["pid"] for r, s in after.items()}
    assert pids == {r: s["pid"] for r, s in before.items()}, "a freed rank's process changed"
    return generation + 1


def ddp_goes_on_bitwise(cell: Cell, session: str) -> int:
    """An unbroken 20-step DDP run on both ranks, then the same run that loses rank 1
    (SIGKILL) after step 10: the next cell replaces rank 1 alone (rank 0 keeps its
    variables and process), ``%dist sync model,opt --from 0`` copies rank 0's model and
    optimizer to it, and after step 20 rank 0's weights are bitwise the unbroken run's and
    both ranks agree. The new generation."""
    on = f"%%distributed --session {session}\n"
    assert cell(f"{on}import torch.distributed as dist\nkept = 80 + dist.get_rank()")[0]
    before = sums(cell, session)[0]
    generation = int(before[0]["generation"])
    ok, text = cell(f"{on}{DDP_SETUP}")
    assert ok, text
    ok, text = cell(
        f"{on}ref_model = net(); ref_opt = torch.optim.SGD(ref_model.parameters(), 0.05, 0.9)\n"
        "train(DDP(ref_model), ref_opt, range(20))\n"
        "ref = [p.detach().clone() for p in ref_model.parameters()]"
    )
    assert ok, f"the unbroken run: {text}"
    ok, text = cell(
        f"{on}model = net(); opt = torch.optim.SGD(model.parameters(), 0.05, 0.9)\n"
        "ddp = DDP(model); train(ddp, opt, range(10))"
    )
    assert ok, f"steps 0-9: {text}"
    ok, text = cell(
        f"%%distributed --session {session} --ranks 1\n"
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    )
    assert not ok and "rank 1" in text, f"rank 1 was not lost: {text}"
    # the next cell replaces rank 1; it defines the functions again (rank 1 is empty)
    ok, text = cell(f"{on}{DDP_SETUP}")
    said = flat(text)
    assert ok, text
    assert "rank 1 replaced by a fresh rank kernel: rank 1 died (killed by signal SIGKILL" in (
        said
    ), text
    assert "Built on the old group, rebuild on every rank: ddp (a DDP model)" in said, text
    healed = check_sums(cell, session, generation + 1, {0: 80, 1: None})
    assert healed[0]["pid"] == before[0]["pid"], "rank 0 was replaced too"
    assert healed[1]["pid"] != before[1]["pid"], "rank 1 was not replaced"
    ok, text = cell(f"%dist sync model,opt --from 0 --session {session}")
    assert ok and "model, opt copied from rank 0 to rank 1" in text, text
    ok, text = cell(
        f"{on}ddp = DDP(model); train(ddp, opt, range(10, 20))\n"
        "ref = globals().get('ref', [])\n"
        "same = bool(ref) and all(torch.equal(a, b) for a, b in zip(model.parameters(), ref))\n"
        "w = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "ws = [torch.zeros_like(w) for _ in range(2)]; dist.all_gather(ws, w)\n"
        "print('bitwise', same, 'ranks agree', torch.equal(ws[0], ws[1]))"
    )
    assert ok, f"steps 10-19: {text}"
    # rank 1 was replaced, so only rank 0 kept the unbroken run's weights to compare
    assert with_start(text, "bitwise") == {
        0: ["bitwise True ranks agree True"],
        1: ["bitwise False ranks agree True"],
    }, text
    return generation + 1


def resize_two_three_two(cell: Cell, session: str) -> tuple[str, str]:
    """``%dist resize --nodes 3`` adds rank 2 (empty) on a third node; ``--nodes 2`` removes
    it. Ranks 0 and 1 keep their variables and processes throughout; each new group's
    all_reduce is right. What the two resizes said."""
    on = f"%%distributed --session {session}\nimport torch.distributed as dist\n"
    assert cell(f"{on}kept = 50 + dist.get_rank()")[0]
    before = sums(cell, session)[0]
    generation = int(before[0]["generation"])
    ok, grew = cell(f"%dist resize --nodes 3 --session {session}")
    assert ok and "rank 2 added (empty); world size 3" in flat(grew), grew
    grown = check_sums(cell, session, generation + 1, {0: 50, 1: 51, 2: None})
    ok, shrank = cell(f"%dist resize --nodes 2 --session {session}")
    assert ok and "rank 2 removed; world size 2" in flat(shrank), shrank
    shrunk = check_sums(cell, session, generation + 2, {0: 50, 1: 51})
    for r in (0, 1):
        assert before[r]["pid"] == grown[r]["pid"] == shrunk[r]["pid"], f"rank {r} was replaced"
    return grew, shrank


__all__ = [
    "SUM",
    "Cell",
    "check_sums",
    "ddp_goes_on_bitwise",
    "flat",
    "hang_is_freed",
    "resize_two_three_two",
    "sums",
]
