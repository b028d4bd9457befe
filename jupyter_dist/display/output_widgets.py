"""A rank's ipywidgets ``Output`` widgets, filled as a browser fills them.

Inside ``with out:`` a kernel sets the widget's ``msg_id`` to its cell's request, and the
browser puts every output of that request into the widget instead of the cell: rich's live
display in a notebook is such a widget, cleared and drawn again at each refresh (Lightning's
default progress bar is rich's). A rank's request is not one the browser sent, so the
browser never takes the rank's outputs for the widget. `OutputWidgets` does it on the
notebook side: it follows each rank's Output models (the relayed `WidgetComm` messages)
and, while one of a rank's widgets captures, takes that rank's outputs as JupyterLab's
``OutputModel`` does (streams of one name run together, ``clear_output(wait=True)`` clears
at the next output). The cell view sends a widget's ``outputs`` to the browser
(`display.widget_relay`); the text view shows them as a display updated in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.common.events import CellEvent, ClearOut, RichOut, StreamOut, WidgetComm
from jupyter_dist.display.rich_text import readable_text

OUTPUT_MODEL = "OutputModel"
#: outputs a widget keeps (the oldest go first), and characters of its stream text
MAX_OUTPUTS = 100
STREAM_CHARS = 100_000
#: the display id a text view shows an Output widget's content under
DISPLAY_PREFIX = "jd-output-"


@dataclass
class Captured:
    """One Output widget of a rank: what it holds, and how often that changed."""

    rank: int
    comm_id: str
    outputs: list[dict[str, Any]] = field(default_factory=list)
    clear_next: bool = False  # ``clear_output(wait=True)``: cleared when the next output comes
    version: int = 0
    shown: int = 0  # the version a text view showed

    def add(self, output: dict[str, Any]) -> None:
        if self.clear_next:
            self.outputs, self.clear_next = [], False
        last = self.outputs[-1] if self.outputs else None
        if (
            output["output_type"] == "stream"
            and last is not None
            and last["output_type"] == "stream"
            and last["name"] == output["name"]
        ):
            text = (last["text"] + output["text"])[-STREAM_CHARS:]
            self.outputs[-1] = {**last, "text": text}
        else:
            self.outputs.append(output)
            del self.outputs[:-MAX_OUTPUTS]
        self.version += 1

    def clear(self, wait: bool) -> None:
        if wait:
            self.clear_next = True
            return
        self.outputs, self.clear_next = [], False
        self.version += 1

    def bundle(self) -> dict[str, Any]:
        """What the widget shows, as one display's data: its one rich output's, or text."""
        if len(self.outputs) == 1 and "data" in self.outputs[0]:
            return dict(self.outputs[0]["data"])
        return {"text/plain": "\n".join(output_text(o) for o in self.outputs).rstrip("\n")}


def output_text(output: dict[str, Any]) -> str:
    """One Jupyter output dict as text."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    data = output.get("data")
    return readable_text(data) if isinstance(data, dict) and data else ""


class OutputWidgets:
    """The Output widgets of a cell's ranks, and which of them captures each rank's
    output now."""

    def __init__(self) -> None:
        self.models: dict[str, Captured] = {}
        #: rank -> its widgets inside ``with``, innermost last
        self._capturing: dict[int, list[str]] = {}

    def watch(self, event: WidgetComm) -> bool:
        """Follow a rank's widget message: an Output model opened, its ``msg_id`` set or
        cleared (``with out:`` entered or left), the model closed. True when the message
        only moved ``msg_id``: the browser, which cannot capture a rank's output, need not
        hear it (rich sets it twice at each refresh)."""
        content = event.content
        comm_id = str(content.get("comm_id", ""))
        data = content.get("data") or {}
        state = data.get("state") or {}
        if event.msg_type == "comm_open":
            if state.get("_model_name") == OUTPUT_MODEL:
                self.models[comm_id] = Captured(event.rank, comm_id)
                self._set_msg_id(comm_id, state.get("msg_id"))
        elif event.msg_type == "comm_msg" and comm_id in self.models:
            if data.get("method") == "update" and "msg_id" in state:
                self._set_msg_id(comm_id, state["msg_id"])
                return set(state) == {"msg_id"}
        elif event.msg_type == "comm_close" and comm_id in self.models:
            self._set_msg_id(comm_id, "")
        return False

    def _set_msg_id(self, comm_id: str, msg_id: Any) -> None:
        rank = self.models[comm_id].rank
        stack = self._capturing.setdefault(rank, [])
        if comm_id in stack:
            stack.remove(comm_id)
        if msg_id:
            stack.append(comm_id)

    def capture(self, event: CellEvent) -> Captured | None:
        """The widget that takes ``event`` (a rank's output while one of its widgets
        captures), ``event`` put in it; None when the event is not captured."""
        if not isinstance(event, (StreamOut, RichOut, ClearOut)):
            return None
        stack = self._capturing.get(event.rank)
        if not stack:
            return None
        model = self.models[stack[-1]]
        if isinstance(event, ClearOut):
            model.clear(event.wait)
        elif isinstance(event, StreamOut):
            model.add({"output_type": "stream", "name": event.name, "text": event.text})
        elif event.msg_type in ("display_data", "execute_result"):
            output: dict[str, Any] = {
                "output_type": "display_data",
                "data": event.data,
                "metadata": event.metadata,
            }
            model.add(output)
        else:  # update_display_data: the browser does not capture it either
            return None
        return model

    def is_output_model(self, model_id: str) -> bool:
        return model_id in self.models

    def as_display(self, model: Captured) -> RichOut | None:
        """The widget's content as a display of its rank updated in place (for a text
        view, which draws no widgets); None when it did not change since last asked."""
        if model.version == model.shown:
            return None
        kind = "update_display_data" if model.shown else "display_data"
        model.shown = model.version
        transient = {"display_id": DISPLAY_PREFIX + model.comm_id}
        return RichOut(model.rank, kind, model.bundle(), {}, transient)
