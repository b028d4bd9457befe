"""Widgets a rank creates (tqdm progress bars, HTML, ...) shown in the notebook.

A rank kernel's widget messages (``comm_open``, ``comm_msg``, ``comm_close``) are
re-published on the notebook kernel's IOPub, so the browser builds the same models, and
the rank's ``display_data`` that names them renders in the rank's view. The relay goes one
way: input from the browser does not reach the rank, so a widget made for input (a slider,
a button) is shown with a note saying so. What an Output widget of a rank holds is set
from here (`WidgetRelay.update`), as the browser cannot take a rank's output into it
(`display.output_widgets`).
"""

from __future__ import annotations

from typing import Any

from jupyter_dist.common.events import WidgetComm

#: widget models that only display: nothing is lost when input cannot flow back
DISPLAY_MODELS = frozenset(
    {
        "BoxModel", "HBoxModel", "VBoxModel", "GridBoxModel", "LayoutModel",
        "HTMLModel", "HTMLMathModel", "LabelModel", "ImageModel", "OutputModel",
        "IntProgressModel", "FloatProgressModel", "ProgressStyleModel",
        "DescriptionStyleModel", "HTMLStyleModel", "HTMLMathStyleModel", "LabelStyleModel",
        "StyleModel",
    }
)  # fmt: skip


#: models whose state a cell keeps for its snapshot; past that, their text stands in
MAX_TRACKED = 2000


class WidgetRelay:
    """Re-publishes rank widget messages through the notebook kernel."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._warned: set[str] = set()
        #: each relayed model's latest state (comm id -> state), for the cell's snapshot
        self.states: dict[str, dict[str, Any]] = {}

    def relay(self, event: WidgetComm) -> str | None:
        """Send one message on; returns a note for the user when input cannot flow back."""
        kernel = self.kernel
        kernel.session.send(
            kernel.iopub_socket,
            event.msg_type,
            event.content,
            parent=kernel.get_parent(),
            buffers=list(event.buffers) or None,
            metadata=event.metadata,  # the widget protocol version travels here
        )
        self._track(event)
        if event.msg_type != "comm_open":
            return None
        state = event.content.get("data", {}).get("state", {})
        model = str(state.get("_model_name", ""))
        module = str(state.get("_model_module", ""))
        interactive = module == "@jupyter-widgets/controls" and model not in DISPLAY_MODELS
        if not interactive or model in self._warned:
            return None
        self._warned.add(model)
        return (
            f"rank {event.rank} shows a {model.removesuffix('Model')} widget: it is displayed, "
            "but input from it does not reach the rank (widgets from ranks are display-only, "
            "like progress bars)"
        )

    def update(self, comm_id: str, state: dict[str, Any]) -> None:
        """Set ``state`` on a relayed model from here, as its rank would (the notebook side
        fills a rank's Output widgets: `display.output_widgets`)."""
        kernel = self.kernel
        data = {"method": "update", "state": state, "buffer_paths": []}
        kernel.session.send(
            kernel.iopub_socket,
            "comm_msg",
            {"comm_id": comm_id, "data": data},
            parent=kernel.get_parent(),
        )
        if comm_id in self.states:
            self.states[comm_id].update(state)

    def _track(self, event: WidgetComm) -> None:
        """Keep the model's state up to date (binary state parts are left out)."""
        comm_id = str(event.content.get("comm_id", ""))
        data = event.content.get("data", {}) or {}
        if event.msg_type == "comm_open" and len(self.states) < MAX_TRACKED:
            self.states[comm_id] = dict(data.get("state", {}))
        elif (
            event.msg_type == "comm_msg"
            and data.get("method") == "update"
            and comm_id in self.states
        ):
            self.states[comm_id].update(data.get("state", {}))
        # a closed model keeps its last state: it is what the rank's view showed last


def relay_for_this_kernel() -> WidgetRelay | None:
    """A relay through the running notebook kernel; None in a terminal."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    return WidgetRelay(kernel) if kernel is not None else None
