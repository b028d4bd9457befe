"""The stacks button's own logic, without a kernel (the real click, answered while a cell
runs, is tested in tests/integration/test_stacks_button.py)."""

from __future__ import annotations

import html

from jupyter_dist.display.busy_clicks import route_clicks
from jupyter_dist.display.cell_view import CellView
from jupyter_dist.display.stacks_panel import StacksPanel


def test_a_click_shows_what_was_read_and_the_button_is_usable_again() -> None:
    seen_disabled = []
    panel: StacksPanel

    def read() -> str:
        seen_disabled.append(panel.button.disabled)
        return "ranks 0,1: in all_reduce (distributed_c10d.py:2806), cell line 4 <here>"

    panel = StacksPanel(read)
    panel.button.click()
    assert seen_disabled == [True], "the button must be disabled while the stacks are read"
    assert not panel.button.disabled
    assert "where the ranks were at" in panel.text.value
    assert "in all_reduce (distributed_c10d.py:2806), cell line 4 &lt;here&gt;" in panel.text.value
    assert panel.reads == 1


def test_a_failed_read_is_shown_with_its_reason() -> None:
    def read() -> str:
        raise TimeoutError("node 1 did not answer")

    panel = StacksPanel(read)
    panel.button.click()
    shown = html.unescape(panel.text.value)
    assert "could not read the ranks' stacks: TimeoutError: node 1 did not answer" in shown
    assert not panel.button.disabled


def test_without_a_kernel_the_button_is_left_out() -> None:
    """A click could not be answered while the cell runs, so no button is shown."""
    assert StacksPanel.where_answerable(lambda: "") is None
    assert not route_clicks(StacksPanel(lambda: "").button)
    view = CellView(
        "s",
        1,
        {0: ("h", 0), 1: ("h", 0)},
        read_stacks=lambda: "",
        display=_no_display,
        live_after=0,
    )
    view.show()
    assert view.live is not None and view.live.stacks is None
    assert view.state()["stacks"] is None
    view.finish()


def _no_display(*args: object, **kwargs: object) -> None:
    return None
