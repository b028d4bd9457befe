"""Ranks' input requests, asked in the notebook's own input box, one at a time.

A rank's ``input()``, ``getpass()`` or debugger prompt reaches the notebook side as an
`InputAsked` event (`control.cell_tracker`). The notebook kernel's main thread, which waits
for the cell in `notebook.cell_loop.drive`, asks the person: it sends an ``input_request``
on the notebook kernel's own stdin channel to the frontend that sent the running cell, as
ipykernel's ``raw_input`` and ``getpass`` do (the prompt labelled ``[rank N]``, a
password stays a password), and hands the answer to the rank (`RankGroup.answer_input`,
on the loop thread).

* One prompt at a time, the lowest rank first; the prompt says how many others wait.
  Ranks tend to ask together (the same ``input()`` line on every rank), but their
  requests arrive apart: a rank's first request of the cell waits up to `GATHER_S` for
  the other running ranks' before the first prompt opens (at once when every running
  rank asks). A debugger's next prompt, from a rank that asked before, opens at once.
* While a prompt is open the cell goes on being drawn (``pump``): other ranks' output,
  their requests (queued), and their ends. A prompt whose rank ended (it died, or the
  cell ended) is withdrawn: the wait ends and the cell says so.
* The stop button raises KeyboardInterrupt in the wait, which ends the prompt and
  interrupts the cell as usual (`drive`); the queued prompts are dropped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from jupyter_dist.common.events import (
    CellEvent,
    CellFinished,
    InputAsked,
    InputEnded,
    Notice,
    RankFinished,
)

#: seconds a rank's first request of the cell waits for the other running ranks' before
#: the first prompt opens (requests that arrive together are served in rank order)
GATHER_S = 0.5
#: how often the open prompt's wait draws the cell and checks its rank
POLL_S = 0.05


def prompt_text(rank: int, prompt: str, waiting: int) -> str:
    """``[rank 1] val?``, or ``[rank 1; 2 more waiting] val?``."""
    more = f"; {waiting} more waiting" if waiting else ""
    return f"[rank {rank}{more}] {prompt}"


class InputDesk:
    """The input requests of one running cell, served on the notebook's main thread.

    ``kernel``: the notebook's ipykernel kernel (its stdin channel, the running request);
    ``answer(rank, value)`` hands an answer to the rank; ``show`` draws an event (the
    cell view's chips follow `InputAsked`/`InputEnded`)."""

    def __init__(
        self,
        kernel: Any,
        ranks: Iterable[int],
        answer: Callable[[int, str], None],
        show: Callable[[CellEvent], None],
    ) -> None:
        self.kernel = kernel
        self.answer = answer
        self.show = show
        self.running = set(ranks)
        self.pending: dict[int, InputAsked] = {}
        self.asked_before: set[int] = set()
        self._first_since: float | None = None  # a first request waits for others since
        self.open_rank: int | None = None
        self.ended = False  # the cell ended: nothing more is asked

    def note(self, event: CellEvent) -> None:
        """Follow the cell's events (before they are drawn)."""
        if isinstance(event, InputAsked):
            if event.rank in self.running and not self.ended:
                self.pending[event.rank] = event
                if event.rank not in self.asked_before and self._first_since is None:
                    self._first_since = time.monotonic()
        elif isinstance(event, RankFinished):
            self.running.discard(event.rank)
            if self.pending.pop(event.rank, None) is not None:
                self.show(InputEnded(event.rank, self.order()))
        elif isinstance(event, CellFinished):
            self.drop()

    def drop(self) -> None:
        """Ask nothing more (the cell ended or was interrupted)."""
        self.ended = True
        for rank in list(self.pending):
            del self.pending[rank]
            self.show(InputEnded(rank, self.order()))

    def order(self) -> tuple[int, ...]:
        return tuple(sorted(self.pending))

    def ready(self) -> bool:
        """Whether a prompt is to open now."""
        if not self.pending or self.ended:
            return False
        if any(r in self.asked_before for r in self.pending):
            return True
        if self.running <= set(self.pending):
            return True
        since = self._first_since
        return since is None or time.monotonic() - since >= GATHER_S

    def serve(self, pump: Callable[[], bool]) -> None:
        """Open the lowest rank's prompt and wait for its answer, drawing the cell
        meanwhile (``pump`` returns False once the cell ended); a KeyboardInterrupt
        (the stop button) ends the wait and passes on."""
        rank = min(self.pending)
        asked = self.pending.pop(rank)
        self.asked_before.add(rank)
        if not self.pending:
            self._first_since = None
        text = prompt_text(rank, asked.prompt, len(self.pending))
        self.open_rank = rank
        try:
            value = self._ask(text, asked.password, lambda: pump() and rank in self.running)
        finally:
            self.open_rank = None
        if value is None:
            self.show(
                Notice(f"rank {rank} ended while its prompt {asked.prompt!r} was open: withdrawn")
            )
        else:
            self.answer(rank, value)
        self.show(InputEnded(rank, self.order()))

    def _ask(self, prompt: str, password: bool, wanted: Callable[[], bool]) -> str | None:
        """Ask the frontend on the notebook kernel's stdin channel, as ipykernel's
        ``_input_request`` does, polling so that the cell is drawn meanwhile; None when
        ``wanted`` says the prompt is no longer (a later answer is dropped unread: stale
        replies are purged before each request, as ipykernel does)."""
        kernel = self.kernel
        socket, session = kernel.stdin_socket, kernel.session
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        while True:  # stale replies (a prompt withdrawn earlier, answered since)
            try:
                socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
        content = {"prompt": prompt, "password": password}
        ident = kernel._parent_ident["shell"]
        session.send(socket, "input_request", content, kernel.get_parent("shell"), ident=ident)
        while True:
            if socket.poll(int(POLL_S * 1000), zmq.POLLIN):
                _ident, reply = session.recv(socket, zmq.NOBLOCK)
                if reply is not None and reply.get("msg_type") == "input_reply":
                    return str(reply["content"].get("value", ""))
            if not wanted():
                return None


def stdin_kernel() -> Any | None:
    """The notebook's ipykernel kernel when its running request allows input requests
    (the frontend answers them: ``allow_stdin`` of the notebook's own execute_request),
    else None (the ranks' ``input()`` then raises as in such a frontend)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not getattr(kernel, "_allow_stdin", False):
        return None
    if getattr(kernel, "stdin_socket", None) is None or getattr(kernel, "session", None) is None:
        return None
    return kernel


__all__ = ["GATHER_S", "InputDesk", "prompt_text", "stdin_kernel"]
