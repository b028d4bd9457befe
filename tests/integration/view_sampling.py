"""What a cell view shows while its cell runs, read from the notebook kernel's IOPub as a
browser gets it: the widget models (relayed from ranks or the view's own), the view stack
(each rank's view, then all ranks), and each view's outputs as last drawn."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class Sampled:
    """The page's widget models as the messages so far left them."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}
        #: the Output widget of each view of the selector: rank 0, rank 1, ..., all ranks
        self.views: list[str] = []
        #: the cell's messages so far
        self.messages: list[dict[str, Any]] = []

    def take(self, msg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """Apply one message; the model it changed and how, if it is a widget message."""
        self.messages.append(msg)
        content = msg["content"]
        comm_id = str(content.get("comm_id", ""))
        state = dict((content.get("data") or {}).get("state") or {})
        if msg["msg_type"] == "comm_open":
            self.models[comm_id] = state
            if state.get("_model_name") == "StackModel":
                self.views = [ref.removeprefix("IPY_MODEL_") for ref in state["children"]]
            return comm_id, state
        if msg["msg_type"] == "comm_msg" and comm_id in self.models:
            self.models[comm_id].update(state)
            return comm_id, state
        return None

    def outputs(self, view: int) -> list[dict[str, Any]]:
        """The outputs view ``view`` (-1: all ranks) draws now."""
        if not self.views:
            return []
        return list(self.models[self.views[view]].get("outputs", []))

    def widgets_in(self, view: int) -> list[str]:
        return [
            str(o["data"][WIDGET_MIME]["model_id"])
            for o in self.outputs(view)
            if WIDGET_MIME in o.get("data", {})
        ]

    def text_in(self, view: int) -> str:
        parts = []
        for o in self.outputs(view):
            parts.append(o.get("text") or str(o.get("data", {}).get("text/plain", "")))
        return "\n".join(parts)


def run_sampled(
    kc: Any,
    code: str,
    seen: Callable[[Sampled, tuple[str, dict[str, Any]] | None], bool],
    go: Path,
    timeout: float = 300,
) -> tuple[dict[str, Any], Sampled, bool]:
    """Run ``code``; after each message of its cell, ask ``seen`` whether what the page
    shows is what the test waits for, and then create ``go`` (the cell's ranks wait for it
    to finish their loop quickly). The cell's reply, the page as the cell left it, and
    whether ``seen`` said yes while the cell ran."""
    msg_id = kc.execute(code)
    sampled = Sampled()
    said = False
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the cell did not end"
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        changed = sampled.take(msg)
        if not said and seen(sampled, changed):
            said = True
            go.touch()
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"]), sampled, said
