"""The bench client as a widget frontend: follows one jupyter_dist cell view on IOPub.

A `%%distributed` cell in widget mode opens its widgets with `comm_open` messages
(target `jupyter.widget`) and then sends `comm_msg` updates (`data.method == "update"`);
each view (one per rank, plus "all ranks") is an `ipywidgets.Output` with the class
`jd-view` whose `outputs` are set wholesale, at most 10 times a second. The views are the
children of a `Stack`, in the order of the selector's labels (`rank 0`, `rank 1`, ...,
`all ranks`), which is how `CellViewWatcher` tells which Output widget shows which rank.

It records every update of every view (when it arrived, its size, the last line it
shows) and says when each watched view first showed the line it waits for. A cell that
ends before its view goes live shows no widgets, only its snapshot (a `display_data` of
self-contained HTML, a block per rank): the watcher reads each rank's last line there too.
"""

from __future__ import annotations

import html
import itertools
import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

WIDGET_TARGET = "jupyter.widget"
VIEW_CLASS = "jd-view"
SELECT_CLASS = "jd-select"
MODEL_PREFIX = "IPY_MODEL_"
_HIDDEN = re.compile(r"^\.\.\. (\d+) earlier lines hidden")
SNAPSHOT_CLASS = "jd-snapshot"
_RANK_BLOCK = re.compile(
    r'<details class="jd-snap-rank" data-rank="(\d+)"[^>]*>(.*?)</details>', re.S
)
_PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)

Message = dict[str, Any]


@dataclass
class ViewUpdate:
    """One `outputs` update of an Output widget."""

    at: float  # time.perf_counter() when it arrived
    comm_id: str
    nbytes: int  # size of the update's state as JSON
    n_outputs: int
    lines: int  # text lines it shows (marker included)
    last_line: str
    hidden: int  # from the "N earlier lines hidden" marker, 0 without one


@dataclass
class CellViewWatcher:
    """Call it with every IOPub message (a `NotebookKernel.execute` on_iopub hook).

    want: view label -> the line whose appearance as that view's last line is awaited.
    """

    want: dict[str, str]
    models: dict[str, str] = field(default_factory=dict)  # comm_id -> _model_name
    classes: dict[str, list[str]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)  # Stack comm_id -> children
    labels: dict[str, list[str]] = field(default_factory=dict)  # selector comm_id -> labels
    updates: list[ViewUpdate] = field(default_factory=list)
    n_comm_msgs: int = 0
    n_comm_bytes: int = 0
    # view label -> (when the cell's snapshot came, the last line its block shows)
    snapshot_lines: dict[str, tuple[float, str]] = field(default_factory=dict)
    _label_of: dict[str, str] = field(default_factory=dict)
    _seen_at: dict[str, float] = field(default_factory=dict)

    # -- following the widgets ------------------------------------------------------------
    def __call__(self, msg: Message, at: float) -> bool:
        kind = msg["header"]["msg_type"]
        content = msg["content"]
        if kind in ("display_data", "update_display_data"):
            page = (content.get("data") or {}).get("text/html")
            if not isinstance(page, str) or SNAPSHOT_CLASS not in page:
                return False
            self._snapshot(page, at)
            return True
        if kind == "comm_open":
            if content.get("target_name") != WIDGET_TARGET:
                return False
            comm_id = content["comm_id"]
            state = (content.get("data") or {}).get("state") or {}
            self.models[comm_id] = str(state.get("_model_name", ""))
            self._apply(comm_id, state, at)
            return True
        if kind == "comm_msg":
            comm_id = content.get("comm_id", "")
            if comm_id not in self.models:
                return False
            data = content.get("data") or {}
            if data.get("method") != "update":
                return True
            self._apply(comm_id, data.get("state") or {}, at)
            return True
        return False

    def _apply(self, comm_id: str, state: dict[str, Any], at: float) -> None:
        self.n_comm_msgs += 1
        if "_dom_classes" in state:
            self.classes[comm_id] = list(state["_dom_classes"])
        if "children" in state and self.models[comm_id] == "StackModel":
            self.children[comm_id] = [str(c) for c in state["children"]]
            self._label_of.clear()
        if "_options_labels" in state:
            self.labels[comm_id] = [str(x) for x in state["_options_labels"]]
            self._label_of.clear()
        if "outputs" in state and self.models[comm_id] == "OutputModel":
            self._output_update(comm_id, list(state["outputs"]), state, at)

    def _output_update(
        self, comm_id: str, outputs: list[dict[str, Any]], state: dict[str, Any], at: float
    ) -> None:
        nbytes = len(json.dumps(state))
        self.n_comm_bytes += nbytes
        text_lines: list[str] = []
        for out in outputs:
            if out.get("output_type") == "stream":
                text = out.get("text", "")
                text_lines.extend(("".join(text) if isinstance(text, list) else text).splitlines())
        hidden = 0
        if text_lines:
            m = _HIDDEN.match(text_lines[0])
            hidden = int(m.group(1)) if m else 0
        last = next((line for line in reversed(text_lines) if line.strip()), "")
        update = ViewUpdate(at, comm_id, nbytes, len(outputs), len(text_lines), last, hidden)
        self.updates.append(update)

    def _snapshot(self, page: str, at: float) -> None:
        for rank, block in _RANK_BLOCK.findall(page):
            text = "".join(html.unescape(pre) for pre in _PRE.findall(block))
            last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
            self.snapshot_lines[f"rank {rank}"] = (at, last)

    # -- which view is which ----------------------------------------------------------------
    def label_of(self, comm_id: str) -> str | None:
        if not self._label_of:
            self._label_of = self._resolve()
        return self._label_of.get(comm_id)

    def _resolve(self) -> dict[str, str]:
        """comm_id -> label, from the Stack's children and the selector's labels."""
        selectors = [c for c, cls in self.classes.items() if SELECT_CLASS in cls]
        selector = selectors[-1] if selectors else None
        labels = self.labels.get(selector or "", [])
        for stack_children in self.children.values():
            ids = [c.removeprefix(MODEL_PREFIX) for c in stack_children]
            if labels and len(ids) == len(labels) and all(i in self.models for i in ids):
                return dict(zip(ids, labels, strict=True))
        # one view only (a single rank): no selector is shown
        views = [c for c, cls in self.classes.items() if VIEW_CLASS in cls]
        if len(views) == 1 and len(self.want) == 1:
            return {views[0]: next(iter(self.want))}
        return {}

    # -- results ----------------------------------------------------------------------------
    def all_seen(self) -> bool:
        return all(self.seen_at(label) is not None for label in self.want)

    def seen_at(self, label: str) -> float | None:
        """When the view `label` first showed its awaited line last (perf_counter), live
        or in the cell's snapshot."""
        if label not in self._seen_at:
            for u in self.updates:
                if u.last_line == self.want.get(label) and self.label_of(u.comm_id) == label:
                    self._seen_at[label] = u.at
                    break
        if label not in self._seen_at and label in self.snapshot_lines:
            at, last = self.snapshot_lines[label]
            if last == self.want.get(label):
                self._seen_at[label] = at
        return self._seen_at.get(label)

    def summary(self, t0: float) -> dict[str, Any]:
        """Per view: updates, their sizes and spacing, and when the awaited line came."""
        per_view: dict[str, Any] = {}
        for comm_id, model in self.models.items():
            if model != "OutputModel" or VIEW_CLASS not in self.classes.get(comm_id, []):
                continue
            label = self.label_of(comm_id) or comm_id
            ups = [u for u in self.updates if u.comm_id == comm_id]
            times = [u.at - t0 for u in ups]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            seen = self.seen_at(label)
            per_view[label] = {
                "updates": len(ups),
                "updates_before_awaited_line": (
                    sum(1 for u in ups if u.at < seen) if seen is not None else None
                ),
                "awaited_line": self.want.get(label),
                "awaited_line_at_s": None if seen is None else seen - t0,
                "first_update_s": times[0] if times else None,
                "first_update_lines": ups[0].lines if ups else None,
                "last_update_s": times[-1] if times else None,
                "median_gap_s": statistics.median(gaps) if gaps else None,
                "min_gap_s": min(gaps) if gaps else None,
                "max_update_bytes": max((u.nbytes for u in ups), default=0),
                "total_update_bytes": sum(u.nbytes for u in ups),
                "last_shown_line": ups[-1].last_line if ups else None,
                "lines_shown_at_end": ups[-1].lines if ups else None,
                "hidden_at_end": ups[-1].hidden if ups else None,
                # every update: [seconds after sending, bytes, lines shown, last line]
                "each_update": [
                    [round(u.at - t0, 4), u.nbytes, u.lines, u.last_line[:40]] for u in ups
                ],
            }
        for label, (at, last) in self.snapshot_lines.items():
            if label not in per_view:  # shown only in the snapshot: the view never went live
                seen = self.seen_at(label)
                per_view[label] = {
                    "updates": 0,
                    "awaited_line": self.want.get(label),
                    "awaited_line_at_s": None if seen is None else seen - t0,
                    "last_shown_line": last,
                }
            per_view[label]["snapshot_at_s"] = at - t0
        return {
            "views": per_view,
            "widget_models_opened": len(self.models),
            "comm_messages_seen": self.n_comm_msgs,
            "output_update_bytes": self.n_comm_bytes,
        }
