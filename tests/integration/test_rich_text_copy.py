"""What libraries that detect a notebook display reads as text: a rank's
``display(HTML(...), display_id=True)`` updated step after step, as transformers' progress
table is, shows its text once and its last state at the end, never the bare
``<IPython.core.display.HTML object>``."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


def test_an_updated_html_display_reads_as_text(run: Any) -> None:
    out = run(
        "%%distributed --session richtext --procs 2 --output text\n"
        "from IPython.display import HTML, display\n"
        "handle = display(HTML('<div><progress value=0 max=4></progress> step 0/4</div>'), "
        "display_id=True)\n"
        "for step in range(1, 5):\n"
        "    handle.update(HTML(f'<div><progress value={step} max=4></progress> "
        "step {step}/4</div><table><tr><th>Step</th><th>Loss</th></tr>"
        "<tr><td>{step}</td><td>{1 / step:.2f}</td></tr></table>'))\n"
    )
    try:
        assert out.ok, out.stdout + out.stderr
        assert "IPython.core.display.HTML object" not in out.stdout, out.stdout
        # each rank's display as it came, the label on a line of its own
        for rank in (0, 1):
            assert f"[rank {rank}]\n[--------------------] step 0/4" in out.stdout, out.stdout
        # the last update, once for both ranks, when the cell ended
        assert "[ranks 0-1]\n[####################] step 4/4" in out.stdout, out.stdout
        assert "Step  Loss" in out.stdout and "4     0.25" in out.stdout, out.stdout
        assert "step 2/4" not in out.stdout  # the updates between are not repeated
    finally:
        run("%dist shutdown --session richtext")
