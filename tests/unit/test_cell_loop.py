"""The notebook thread's event loop: what came in during a slow redraw goes first."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Any

from jupyter_dist.common.events import CellEvent, CellFinished, CellResult, Notice
from jupyter_dist.notebook.cell_loop import drive


class SlowFirstTick:
    """Records handle/tick calls; its first tick is a slow redraw during which a rank's
    output arrives."""

    def __init__(self, sink: queue.SimpleQueue[CellEvent], future: Any) -> None:
        self.sink, self.future = sink, future
        self.calls: list[str] = []

    def handle(self, event: CellEvent) -> None:
        assert isinstance(event, Notice)
        self.calls.append(event.text)
        if event.text == "late line":
            self.future.set_result(None)

    def tick(self) -> None:
        self.calls.append("tick")
        if self.calls.count("tick") == 1:
            self.sink.put(Notice("late line"))
            time.sleep(0.3)

    def finish(self) -> None:  # pragma: no cover - part of the protocol only
        pass


def test_events_that_came_during_a_slow_tick_are_handled_before_the_next_tick() -> None:
    """A tick after a slow redraw must not see a rank's line as late (and stop waiting to
    fold it with the other ranks' lines) when the line is only waiting in the queue."""
    sink: queue.SimpleQueue[CellEvent] = queue.SimpleQueue()
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    renderer = SlowFirstTick(sink, future)
    sink.put(Notice("first line"))
    interrupted = drive(future, sink, renderer)
    assert not interrupted
    first_tick = renderer.calls.index("tick")
    assert renderer.calls[:first_tick] == ["first line"]
    assert renderer.calls[first_tick + 1] == "late line", renderer.calls


class StoppedOnFirstEvent:
    """The user stops the cell as its first event is drawn."""

    def __init__(self) -> None:
        self.stopped = False

    def handle(self, event: CellEvent) -> None:
        if not self.stopped:
            self.stopped = True
            raise KeyboardInterrupt

    def tick(self) -> None:
        pass

    def finish(self) -> None:  # pragma: no cover - part of the protocol only
        pass


def test_a_stopped_cell_is_read_from_its_call_once_it_finished() -> None:
    """The loop puts a stopped cell's CellFinished just before its call returns: the
    notebook thread waits for that return, so that it tells how the cell ended (withdrawn
    from the queue, say) and not that its ranks are still running."""
    sink: queue.SimpleQueue[CellEvent] = queue.SimpleQueue()
    future: concurrent.futures.Future[CellResult] = concurrent.futures.Future()
    result = CellResult((0, 1), (), {}, withdrawn=True)

    def stop() -> None:
        def finish() -> None:
            sink.put(CellFinished(result))
            time.sleep(0.3)  # the loop thread is slow to return from the call
            future.set_result(result)

        threading.Thread(target=finish).start()

    sink.put(Notice("a line"))
    assert drive(future, sink, StoppedOnFirstEvent(), stop) is True
    assert future.done() and future.result() is result


class NoLoop:
    """A control plane whose loop thread has taken the cell but not yet handed its call's
    end over (``future`` stays pending)."""

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self.loop = self
        self.future = future
        self.submitted: list[Any] = []

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        coro.close()
        self.submitted.append(coro)
        return self.future


class OneSession:
    def __init__(self) -> None:
        self.raised_for: list[CellResult] = []
        self.ranks = {0: None, 1: None}

    async def execute(self, *args: Any) -> None:  # pragma: no cover - closed unawaited
        pass

    async def stop_cell(self, ranks: Any) -> None:  # pragma: no cover - closed unawaited
        pass

    def raise_for(self, result: CellResult) -> None:
        self.raised_for.append(result)


class Recorder:
    def __init__(self) -> None:
        self.events: list[CellEvent] = []

    def handle(self, event: CellEvent) -> None:
        self.events.append(event)

    def tick(self) -> None:
        pass

    def finish(self) -> None:  # pragma: no cover - part of the protocol only
        pass


def test_a_finished_cell_is_read_from_its_event_without_waiting_for_its_call() -> None:
    """The loop puts CellFinished just before its call returns; the notebook thread takes
    the result from the event rather than wait for the loop thread to hand it over too."""
    from jupyter_dist.notebook.cell_loop import run_cell

    future: concurrent.futures.Future[Any] = concurrent.futures.Future()  # never done
    control, session = NoLoop(future), OneSession()
    result = CellResult((0, 1), (), {})
    sink: queue.SimpleQueue[CellEvent] = queue.SimpleQueue()
    sink.put(CellFinished(result))
    recorder = Recorder()
    got = run_cell(control, session, "x = 1", None, None, recorder, sink)  # type: ignore[arg-type]
    assert got is result and session.raised_for == [result]
    assert recorder.events == [CellFinished(result)] and not future.done()
