"""The notebook thread's side of a running cell: draw events, forward interrupts.

The control plane runs the cell on its loop thread; this module waits in the notebook's
main thread, rendering events as they come. A KeyboardInterrupt (the user pressed
stop) interrupts every rank, keeps drawing while they wind down, then re-raises.
"""

from __future__ import annotations

import concurrent.futures
import queue
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from jupyter_dist.control_plane import ControlPlane
from jupyter_dist.errors import ranks_label
from jupyter_dist.events import CallDone, CellEvent, CellFinished, CellResult, Notice
from jupyter_dist.rank_group import RankGroup

#: seconds to keep drawing after an interrupt before giving control back
INTERRUPT_WAIT_S = 10.0
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
) -> bool:
    """Render events until ``future`` is done; return whether the user interrupted."""
    interrupted_at: float | None = None
    future.add_done_callback(lambda _: sink.put(CallDone()))
    last_tick = time.monotonic()
    while True:
        try:
            now = time.monotonic()
            if now - last_tick >= POLL_S:  # steady output must not starve the redraws
                last_tick = now
                renderer.tick()
            try:
                event = sink.get(timeout=POLL_S)
            except queue.Empty:
                last_tick = time.monotonic()
                renderer.tick()
                if future.done() and sink.empty():
                    return interrupted_at is not None
                if interrupted_at and time.monotonic() - interrupted_at > INTERRUPT_WAIT_S:
                    return True
                continue
            if isinstance(event, CallDone):
                if sink.empty():
                    return interrupted_at is not None
                continue
            renderer.handle(event)
            if isinstance(event, CellFinished):
                return interrupted_at is not None
        except KeyboardInterrupt:
            if interrupted_at is not None or on_interrupt is None:
                return True  # a second interrupt: stop waiting for the ranks
            interrupted_at = time.monotonic()
            on_interrupt()


def run_cell(
    control: ControlPlane,
    session: RankGroup,
    code: str,
    ranks: list[int] | None,
    timeout: float | None,
    renderer: Renderer,
    sink: queue.SimpleQueue[CellEvent],
) -> CellResult | None:
    """Run ``code`` and draw it; raise the cell's aggregated error, or KeyboardInterrupt."""
    future = control.loop.submit(session.execute(code, ranks, sink, timeout))

    def interrupt() -> None:
        control.loop.submit(session.interrupt(ranks))
        sink.put(Notice(f"interrupting {ranks_label(ranks or sorted(session.ranks))}"))

    interrupted = drive(future, sink, renderer, interrupt)
    if interrupted:
        renderer.finish()
        if future.done() and not future.exception():
            _report_interrupted(future.result())
        raise KeyboardInterrupt
    result = future.result()
    session.raise_for(result)
    return result


def _report_interrupted(result: CellResult) -> None:
    stopped = [f.rank for f in result.failures if f.kind == "interrupted"]
    if stopped:
        print(f"[jupyter_dist] interrupted {ranks_label(stopped)}", file=sys.stderr)


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
