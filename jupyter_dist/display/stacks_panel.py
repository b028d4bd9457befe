"""The cell view's "stacks" button: where every rank is now, grouped, shown under it.

The click is handled on the notebook kernel's click subshell (`display.busy_clicks`), beside the
cell that still runs, so the button answers while ranks hang, which is when it is wanted.
``read`` does the work (ask each node's agent for its ranks' stack dumps, group
them) and may take seconds; the button is disabled meanwhile.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable

import ipywidgets as widgets

from jupyter_dist.display.busy_clicks import click_subshell, route_clicks


class StacksPanel:
    """A button that shows every rank's current stack, and the text it shows."""

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read
        self.button = widgets.Button(
            description="stacks",
            icon="search",
            tooltip="show where every rank is now: its Python stack, ranks at the same "
            "place grouped (like %dist stacks)",
            layout=widgets.Layout(width="auto"),
        )
        self.button.add_class("jd-stacks-button")
        self.text = widgets.HTML()
        self.text.add_class("jd-stacks")
        self.button.on_click(lambda _button: self.show_stacks())
        self.reads = 0

    @classmethod
    def where_answerable(cls, read: Callable[[], str]) -> StacksPanel | None:
        """A panel whose clicks are answered while a cell runs; None where this kernel
        cannot do that (no subshells), as a button that answers late is worse than none."""
        if click_subshell() is None:
            return None
        panel = cls(read)
        if route_clicks(panel.button):
            return panel
        panel.button.close()
        panel.text.close()
        return None

    def show_stacks(self) -> None:
        self.button.disabled = True
        self.text.value = "<pre style='margin:0'>reading every rank's stack ...</pre>"
        started = time.monotonic()
        try:
            where = self._read()
        except Exception as err:
            body = f"could not read the ranks' stacks: {type(err).__name__}: {err}"
        else:
            took = time.monotonic() - started
            body = f"where the ranks were at {time.strftime('%H:%M:%S')} ({took:.1f} s):\n{where}"
        finally:
            self.button.disabled = False
        self.reads += 1
        self.text.value = f"<pre style='margin:0'>{html.escape(body)}</pre>"
