"""What libraries that detect a notebook display reads as text: a rank's
``display(HTML(...), display_id=True)`` updated step after step, as transformers' progress
table is, shows rank 0's as text and its last state at the end, never the bare
``<IPython.core.display.HTML object>``; every rank's, the same, is not repeated."""

from __future__ import annotations

import re
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
        # rank 0's display as text, and its last state at the end; rank 1's, the same, is
        # not repeated (folded with rank 0's, or one line saying it is like it)
        assert re.search(r"^\[ranks? 0\S*\]\n\[[#-]{20}\] step \d/4", out.stdout, re.M)
        assert "[####################] step 4/4" in out.stdout, out.stdout
        assert "[rank 1]\n" not in out.stdout, out.stdout
        assert "Step  Loss" in out.stdout and "4     0.25" in out.stdout, out.stdout
        assert "step 2/4" not in out.stdout  # the updates between are not repeated
    finally:
        run("%dist shutdown --session richtext")
