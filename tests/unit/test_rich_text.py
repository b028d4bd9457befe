"""Rich output in text copies: what a reader gets instead of ``<... object>``."""

from __future__ import annotations

import io
from typing import Any

from jupyter_dist.common.events import CellFinished, CellResult, RankFinished, RichOut
from jupyter_dist.display.output_store import ViewOutput
from jupyter_dist.display.render_text import TextRenderer
from jupyter_dist.display.rich_text import MAX_HTML_CHARS, html_to_text, readable_text

BARE = "<IPython.core.display.HTML object>"
#: the shape of transformers' NotebookProgressCallback output (progress bar, then metrics)
PROGRESS = """
    <div>
      <progress value='5' max='10' style='width:300px; height:20px;'></progress>
      [ 5/10 00:02 < 00:02, 2.21 it/s, Epoch 0.50/1]
    </div>
    <table border="1" class="dataframe">
  <thead><tr style="text-align: left;"><th>Epoch</th><th>Training Loss</th></tr></thead>
  <tbody><tr><td>1</td><td>2.345600</td></tr><tr><td>10</td><td>0.5</td></tr></tbody>
</table><p>"""


def test_a_progress_table_reads_as_text() -> None:
    text = readable_text({"text/plain": BARE, "text/html": PROGRESS})
    assert text.splitlines() == [
        "[##########----------] [ 5/10 00:02 < 00:02, 2.21 it/s, Epoch 0.50/1]",
        "Epoch  Training Loss",
        "1      2.345600",
        "10     0.5",
    ]


def test_a_real_text_form_wins_and_other_types_are_named() -> None:
    assert readable_text({"text/plain": "   a  b", "text/html": "<b>x</b>"}) == "   a  b"
    assert readable_text({"text/plain": BARE, "image/png": "..."}) == "[image/png]"
    assert readable_text({"text/plain": BARE, "text/markdown": "# Title\n"}) == "# Title"
    assert readable_text({"text/plain": "<Foo object at 0xdeadbeef>", "text/html": ""}) == (
        "[text/html]"
    )
    assert readable_text({}) == ""


def test_html_blocks_pre_scripts_and_entities() -> None:
    markup = "<p>one</p><div>two<br>three</div><script>alert(1)</script><pre>a\n  b</pre>&amp;"
    assert html_to_text(markup) == "one\ntwo\nthree\na\n  b\n&"
    assert html_to_text("<table><tr><td>x<table><tr><td>in</td></tr></table></td></tr>") == "x in"


def test_huge_html_is_cut_before_it_is_read() -> None:
    text = html_to_text("<p>" + "x" * (MAX_HTML_CHARS + 10) + "</p>")
    assert len(text) == MAX_HTML_CHARS - 3


def test_the_saved_text_copy_of_a_view_has_no_bare_reprs() -> None:
    view = ViewOutput()
    view.add_line("stdout", "training")
    view.add_rich({"output_type": "display_data", "data": {"text/plain": BARE,
                   "text/html": PROGRESS}, "metadata": {}})  # fmt: skip
    text = view.plain_text()
    assert BARE not in text and "Epoch  Training Loss" in text, text


def test_text_output_shows_the_first_ranks_progress_display_and_the_last_update_at_the_end() -> (
    None
):
    """Every rank shows the same progress display: the first rank's as it came, and when
    the cell ends the last state, once for the ranks where it is the same."""
    out, err = io.StringIO(), io.StringIO()
    r = TextRenderer([0, 1], out, err, None)
    display = {"display_id": "d1"}
    for rank in (0, 1):
        first = {"text/plain": BARE, "text/html": "<div>step 0</div>"}
        r.handle(RichOut(rank, "display_data", first, {}, display))
    r.flush(final=True)  # the displays' row is written (as it is once their twins came)
    for step in range(1, 50):
        for rank in (0, 1):
            data: dict[str, Any] = {"text/plain": BARE, "text/html": f"<div>step {step}</div>"}
            r.handle(RichOut(rank, "update_display_data", data, {}, display))
    for rank in (0, 1):
        r.handle(RankFinished(rank, "ok", 0.1))
    r.handle(CellFinished(CellResult((0, 1), (), {})))
    shown = out.getvalue()
    assert BARE not in shown
    assert shown.count("step 0") == 1  # rank 0's display as it came, not every rank's
    assert "[ranks 0-1] step 49" in shown and "step 48" not in shown, shown


def test_a_view_shows_a_display_updated_in_place() -> None:
    view = ViewOutput()
    first = {"output_type": "display_data", "data": {"text/html": "<p>0/3</p>"}, "metadata": {}}
    view.add_rich(first, "bar")
    view.add_line("stdout", "after")
    before = view.version
    for step in (1, 2, 3):
        assert view.update_rich("bar", {"text/html": f"<p>{step}/3</p>"}, {})
    assert view.version > before
    outputs = view.as_outputs()
    assert outputs[0]["data"] == {"text/html": "<p>3/3</p>"} and len(outputs) == 2
    assert view.plain_text() == "3/3\nafter"
    assert not view.update_rich("other", {"text/plain": "x"}, {})
    view.clear()
    assert not view.update_rich("bar", {"text/plain": "x"}, {})
