"""The notebook thread's side of a running cell: draw events, forward interrupts.

The control plane runs the cell on its loop thread; this module waits in the notebook's
main thread, rendering events as they come. A KeyboardInterrupt (the user pressed
stop) interrupts every rank, keeps drawing while they wind down, then re-raises. Ranks'
input requests are asked here too, in the notebook's own input box
(`notebook.input_desk`), drawing the cell while a prompt is open.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

from jupyter_dist.common.events import (
    CallDone,
    CellEvent,
    CellFinished,
    CellResult,
    Notice,
    RankFinished,
)
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.rank_group import RankGroup
from jupyter_dist.errors import CellInterrupted, RanksFailed
from jupyter_dist.notebook.input_desk import InputDesk, stdin_kernel
from jupyter_dist.notebook.owners import SessionOwner
from jupyter_dist.text import ranks_label

#: seconds to keep drawing after an interrupt before giving control back: the control
#: plane ends a stopped cell itself (ranks that do not stop within a few seconds are
#: restarted, which this waits for, so that its message is seen); a second interrupt stops
#: waiting at once
INTERRUPT_WAIT_S = 120.0
#: seconds a stopped cell's call may take to return after its CellFinished event
FINISH_WAIT_S = 5.0
POLL_S = 0.05


class Renderer(Protocol):
    def handle(self, event: CellEvent) -> None: ...

    def tick(self) -> None: ...

    def finish(self) -> None: ...


def drive(
    future: concurrent.futures.Future[Any],
    sink: queue.SimpleQueue[CellEvent],
    renderer: Renderer,
    on_interrupt: Callable[[], None] | None = None,
    desk: InputDesk | None = None,
) -> bool:
    """Render events until ``future`` is done; return whether the user interrupted.
    ``desk``: where the ranks' input requests are asked (none: nobody answers them).

    Events that came in while the renderer was busy (a slow redraw) are all handled before
    its next tick: a tick must not judge a rank late (and stop waiting to fold its lines
    with the others') only because the notebook thread had not read them yet.
    """
    try:
        return _drive(future, sink, renderer, on_interrupt, desk)
    finally:
        if isinstance(sink, EventQueue):
            sink.close()  # events still to come (an interrupted cell's) go nowhere


class _Events:
    """The events read from the sink and not handled yet, and how each is handled."""

    def __init__(
        self, sink: queue.SimpleQueue[CellEvent], renderer: Renderer, desk: InputDesk | None
    ) -> None:
        self.sink = sink
        self.renderer = renderer
        self.desk = desk
        self.backlog: collections.deque[CellEvent] = collections.deque()
        self.last_tick = time.monotonic()

    def take(self, wait: float) -> None:
        """Read what the sink holds, waiting up to ``wait`` for a first event."""
        sink, backlog = self.sink, self.backlog
        with contextlib.suppress(queue.Empty):
            backlog.append(sink.get(timeout=wait) if wait else sink.get_nowait())
        if isinstance(sink, EventQueue):
            backlog.extend(sink.take_all())
        else:
            for _ in range(sink.qsize()):
                backlog.append(sink.get_nowait())

    def show(self, event: CellEvent) -> None:
        if self.desk is not None:
            self.desk.note(event)
        self.renderer.handle(event)

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last_tick >= POLL_S:  # steady output must not starve the redraws
            self.last_tick = now
            self.renderer.tick()

    def pump(self) -> bool:
        """While a prompt is open: draw what came, leaving the cell's end to `_drive`;
        False once the cell ended."""
        self.take(0)
        backlog = self.backlog
        while backlog and not isinstance(backlog[0], CellFinished | CallDone):
            self.show(backlog.popleft())
        self.tick()
        return not backlog


def _drive(
    future: concurrent.futures.Future[Any],
    sink: queue.SimpleQueue[CellEvent],
    renderer: Renderer,
    on_interrupt: Callable[[], None] | None,
    desk: InputDesk | None = None,
) -> bool:
    interrupted_at: float | None = None
    future.add_done_callback(lambda _: sink.put(CallDone()))
    events = _Events(sink, renderer, desk)
    backlog = events.backlog
    call_done = False
    while True:
        try:
            if not backlog:
                events.take(POLL_S)
            while backlog:
                event = backlog.popleft()
                if isinstance(event, CallDone):
                    call_done = True
                    continue
                events.show(event)
                if isinstance(event, CellFinished):
                    if interrupted_at is not None:
                        # the loop puts CellFinished just before the call returns: the
                        # caller reads how the stopped cell ended from its result
                        concurrent.futures.wait([future], timeout=FINISH_WAIT_S)
                        return True
                    return False
            if desk is not None and interrupted_at is None and desk.ready():
                renderer.tick()  # what the rank printed before it asked, above the prompt
                desk.serve(events.pump)
                continue
            if call_done and sink.empty():
                return interrupted_at is not None
            events.tick()
            if interrupted_at and time.monotonic() - interrupted_at > INTERRUPT_WAIT_S:
                return True
        except KeyboardInterrupt:
            if interrupted_at is not None or on_interrupt is None:
                return True  # a second interrupt: stop waiting for the ranks
            interrupted_at = time.monotonic()
            if desk is not None:
                desk.drop()  # the ranks asking are interrupted too
            on_interrupt()


def run_cell(
    control: SessionOwner,
    session: RankGroup,
    code: str,
    ranks: list[int] | None,
    timeout: float | None,
    renderer: Renderer,
    sink: queue.SimpleQueue[CellEvent],
    execution_count: int | None = None,
) -> CellResult | None:
    """Run ``code`` and draw it; raise the cell's aggregated error, or KeyboardInterrupt.
    ``execution_count`` is the notebook's for this cell: rank tracebacks name it.

    The result is read from the cell's `CellFinished` event, which the loop puts just
    before its call returns, without waiting for the loop thread to hand the call's end
    over as well (a thread switch, half a millisecond of a quick cell)."""
    kernel = stdin_kernel()
    future = control.loop.submit(
        session.execute(code, ranks, sink, timeout, execution_count, kernel is not None)
    )

    def interrupt() -> None:
        control.loop.submit(session.stop_cell(ranks))
        sink.put(
            Notice(f"stopping the cell on {ranks_label(ranks or sorted(session.ranks))}", True)
        )

    finished = _FinishNoted(renderer)
    desk = None
    if kernel is not None:
        loop = control.loop.loop

        def answer(rank: int, value: str) -> None:
            loop.call_soon_threadsafe(session.answer_input, rank, value)

        chosen = ranks if ranks is not None else sorted(session.ranks)
        desk = InputDesk(kernel, chosen, answer, finished.handle)
    interrupted = drive(future, sink, finished, interrupt, desk)
    if interrupted:
        renderer.finish()
        raise interrupted_error(control, session, future, ranks).shown_above(finished.failed)
    result = finished.result if finished.result is not None else future.result()
    try:
        session.raise_for(result)
    except RanksFailed as err:  # the renderer showed the tracebacks: the error names them
        err.shown_above(finished.failed)
        raise
    return result


class _FinishNoted:
    """A renderer that keeps the result its `CellFinished` event carried, and which ranks'
    failures it was given (both renderers show their tracebacks with the ranks' output)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.result: CellResult | None = None
        self.failed: set[int] = set()

    def handle(self, event: CellEvent) -> None:
        if isinstance(event, CellFinished):
            self.result = event.result
        elif isinstance(event, RankFinished) and event.failure is not None:
            self.failed.add(event.rank)
        self.renderer.handle(event)

    def tick(self) -> None:
        self.renderer.tick()

    def finish(self) -> None:
        self.renderer.finish()


def interrupted_error(
    control: SessionOwner,
    session: RankGroup,
    future: concurrent.futures.Future[CellResult],
    ranks: list[int] | None,
) -> CellInterrupted:
    """What the notebook cell raises when the user stopped it: where each rank was, in
    one short block (`CellInterrupted`, a KeyboardInterrupt), and what became of the
    session (the control plane restarted it if a rank could not be stopped)."""
    world = session.spec.world_size
    if not future.done() or future.exception() is not None:
        running = sorted(ranks or session.ranks)
        return CellInterrupted(session.name, world, [], still_running=running)
    result = future.result()
    if result.withdrawn:
        return CellInterrupted(
            session.name,
            world,
            [],
            "withdrawn before it started; the cell that was running on the ranks went on",
        )
    failed = {f.rank for f in result.failures}
    note = "\n".join(t for t in (result.stopped_by, result.note) if t)
    return CellInterrupted(
        session.name,
        world,
        result.failures,
        note,
        finished=[r for r in result.ranks if r not in failed],
    )


def wait_with_notices(
    future: concurrent.futures.Future[Any], sink: queue.SimpleQueue[CellEvent], renderer: Renderer
) -> Any:
    """Wait for a control-plane call (start, restart), drawing its progress notices."""
    interrupted = drive(future, sink, renderer)
    if interrupted:
        future.cancel()
        raise KeyboardInterrupt
    renderer.finish()
    return future.result()
