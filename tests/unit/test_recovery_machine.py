"""The session's recovery state machine, its words, and the rank's interrupt
acknowledgement, without processes."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from jupyter_dist.common import stacks
from jupyter_dist.common.wire_names import INTERRUPT_ACK_MSG_TYPE
from jupyter_dist.control.recovery import (
    MOVES,
    FailedRestart,
    Fault,
    Recovery,
    SessionState,
    check_move,
    heal_report,
)
from jupyter_dist.errors import SessionError
from jupyter_dist.rank import interrupt_ack


def test_every_state_has_its_moves_and_stopped_is_final() -> None:
    assert set(MOVES) == set(SessionState)
    assert MOVES[SessionState.STOPPED] == frozenset()
    check_move("s", SessionState.READY, SessionState.DEGRADED)
    check_move("s", SessionState.DEGRADED, SessionState.HEALING)
    check_move("s", SessionState.HEALING, SessionState.READY)
    with pytest.raises(SessionError, match="no move from stopped to ready"):
        check_move("s", SessionState.STOPPED, SessionState.READY)
    with pytest.raises(SessionError, match="no move from starting to healing"):
        check_move("s", SessionState.STARTING, SessionState.HEALING)


def test_dead_ranks_heal_themselves_lost_nodes_only_when_asked() -> None:
    book = Recovery()
    assert not book.heals_itself()
    book.record(Fault(1, "died", "exit code 3", 0))
    assert book.heals_itself()
    book.record(Fault(2, "lost", "node 'b' unreachable", 1))
    assert not book.heals_itself()
    book.auto_heal = True
    assert book.heals_itself()
    book.record(Fault(1, "stuck", "later news", 0))  # the first fault of a rank is kept
    assert book.faults[1].kind == "died"


def test_a_heal_counts_the_generation_and_says_what_to_rebuild() -> None:
    book = Recovery()
    book.record(Fault(1, "died", "killed by signal SIGKILL (9)", 0))
    plan = book.plan(lost_nodes=[], also=[3])
    assert plan.replace == (1, 3) and plan.nodes == ()
    said = book.healed(plan, {0: ["ddp (a DDP model)"], 2: ["ddp (a DDP model)"]})
    assert book.generation == 1 and not book.faults
    assert said.startswith(
        "ranks 1,3 replaced by fresh rank kernels: rank 1 died (killed by signal SIGKILL (9)). "
        "They start empty; every other rank kept its variables. All ranks joined a new "
        "process group (generation 1)."
    ), said
    assert "rebuild on every rank: ddp (a DDP model)." in said
    assert "`%dist sync NAME[,NAME...] --from RANK` copies variables" in said


def test_a_lost_node_is_named_as_started_again() -> None:
    plan = Recovery().plan(lost_nodes=[1], also=[2, 3])
    said = heal_report(plan, 4, {})
    assert "ranks 2-3 replaced by fresh rank kernels (node 1 started again)" in said
    assert "generation 4" in said and "rebuild" not in said


DUMP = """Thread 0x1 (most recent call first):
  File "{file}", line {line} in {func}
  File "/tmp/ipykernel_1/2.py", line 3 in <module>
"""


def test_a_rank_at_one_place_in_two_dumps_is_outside_python() -> None:
    one = DUMP.format(file="distributed_c10d.py", line=4000, func="barrier")
    two = DUMP.format(file="distributed_c10d.py", line=4000, func="barrier")
    moved = DUMP.format(file="loop.py", line=12, func="step")
    assert stacks.same_place(one, two)
    assert not stacks.same_place(one, moved)
    assert not stacks.same_place("", two)  # no dump: nothing to compare


class FakeSession:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, str, dict[str, Any], Any, Any]] = []

    def send(
        self, socket: Any, kind: str, content: dict[str, Any], parent: Any, ident: Any
    ) -> None:
        self.sent.append((socket, kind, content, parent, ident))


class FakeKernel:
    def __init__(self) -> None:
        self.session = FakeSession()
        self.iopub_socket = object()
        self.parent = {"header": {"msg_id": "cell-1"}}

    def get_parent(self, channel: str) -> Any:
        return self.parent if channel == "shell" else {}

    def _topic(self, name: str) -> bytes:
        return f"kernel.x.{name}".encode()


def test_the_sigint_handler_says_so_for_the_running_request_then_raises() -> None:
    kernel = FakeKernel()
    saved = interrupt_ack.install(kernel)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between two bytecodes
                pass
    finally:
        signal.signal(signal.SIGINT, saved)
    ((socket, kind, content, parent, _ident),) = kernel.session.sent
    assert socket is kernel.iopub_socket and kind == INTERRUPT_ACK_MSG_TYPE
    assert parent == kernel.parent and content["pid"] == os.getpid()
    assert "test_recovery_machine.py" in content["where"]


def test_an_acknowledgement_that_cannot_be_sent_never_stops_the_interrupt() -> None:
    kernel = FakeKernel()
    kernel.session = None  # type: ignore[assignment]
    handler = interrupt_ack.handler_for(kernel)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)


def test_a_tracker_tells_ranks_handling_an_interrupt_from_silent_ones() -> None:
    from jupyter_dist.control.cell_tracker import CellTracker

    async def main() -> None:
        run = CellTracker({0: ("a", 0), 1: ("a", 1)}, None)
        assert run.silent_after_interrupt(0.0) == []  # nothing was interrupted
        run.interrupt_sent([0, 1])
        ack = {"msg_type": INTERRUPT_ACK_MSG_TYPE, "content": {"where": "step (loop.py:3)"}}
        run.on_message(0, "iopub", ack)
        assert run.handling() == [0] and run.progress[0].ack_where == "step (loop.py:3)"
        assert run.silent_after_interrupt(0.0) == [1]
        assert run.silent_after_interrupt(60.0) == []  # not silent for long enough yet
        run.progress[1].checked = run.progress[1].interrupted_at  # looked into once
        assert run.silent_after_interrupt(0.0) == []
        run.interrupt_sent([0, 1])  # a second stop: both are asked again
        assert run.handling() == [] and run.silent_after_interrupt(0.0) == [0, 1]

    import asyncio

    asyncio.run(main())


def test_an_interrupts_traceback_ends_on_the_users_line_not_in_the_handler() -> None:
    """What a frontend shows of an interrupted cell (a rank's console) ends where the
    interrupt landed, as Python's own handler leaves it: no frontend tries to open this
    package's file (`RankShell._get_exc_info` applies it)."""
    import traceback

    handler = interrupt_ack.handler_for(FakeKernel())

    def users_loop() -> None:
        handler(signal.SIGINT, None)  # as Python calls it between two of these bytecodes

    try:
        users_loop()
    except KeyboardInterrupt as err:
        tb = err.__traceback__
    frames = [f.name for f in traceback.extract_tb(tb)]
    assert frames[-1] == "on_sigint"
    kept = [f.name for f in traceback.extract_tb(interrupt_ack.without_handler(tb))]
    assert kept == frames[:-1] and kept[-1] == "users_loop"
    assert interrupt_ack.without_handler(None) is None


def test_a_new_group_alone_says_why_that_no_rank_was_replaced_and_what_was_rebuilt() -> None:
    book = Recovery()
    plan = book.plan(lost_nodes=[])
    said = book.healed(
        plan,
        {
            0: ["ddp (a DDP model, rebuilt)", "mesh (a DeviceMesh)"],
            1: ["ddp (a DDP model, rebuilt)"],
        },
        new_group="rank 0 was blocked in a collective; shutting its connections freed it",
    )
    assert said == (
        "Rank 0 was blocked in a collective; shutting its connections freed it. Every rank "
        "kept its variables and all joined a new process group (generation 1). Rebuilt on "
        "the new group in place: ddp (a DDP model). Built on the old group, rebuild on every "
        "rank: mesh (a DeviceMesh)."
    ), said
    assert book.replaced == () and book.generation == 1


def test_a_restart_keeps_the_agents_only_while_every_one_runs() -> None:
    book = Recovery()
    assert not book.plan_restart([True, True]).fresh_agents
    assert book.plan_restart([True, False, False]).gone == (1, 2)


def test_a_failed_restart_says_what_must_come_first_until_one_works() -> None:
    book = Recovery()
    book.record(Fault(1, "lost", "node 'b' unreachable", 1))
    failed = book.restart_failed([("b", "node 'b': no SSH answer within 10 s")])
    assert book.failed_restart is failed
    assert failed.advice("s") == (
        "A restart cannot work until node 'b' (no SSH answer within 10 s) can be started "
        "again: then `%dist restart --session s` starts the session's agents afresh, and "
        "every rank; `%dist shutdown --session s` ends the session."
    )
    book.restarted()
    assert book.failed_restart is None and not book.faults
    two = FailedRestart((("a", "node 'a' unreachable since 10:00:00"), ("b", "gone")))
    assert two.advice("s").startswith(
        "A restart cannot work until nodes 'a' (unreachable since 10:00:00); 'b' (gone) can "
        "be started again"
    )
    placed = FailedRestart((("pod-1", "node 'pod-1': no pod"),), cluster="Kubernetes")
    assert placed.advice("s") == (
        "Node 'pod-1' (no pod) could not be started: `%dist restart --session s` asks "
        "Kubernetes for the session's nodes again and starts every rank afresh; "
        "`%dist shutdown --session s` ends the session."
    )
    assert FailedRestart().advice("s") == (
        "`%dist restart --session s` tries again, starting every rank afresh; "
        "`%dist shutdown --session s` ends the session."
    )
