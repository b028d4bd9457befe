"""What the views gathering several ranks get for a rank's live displays."""

from __future__ import annotations

from jupyter_dist.common.events import RichOut, StreamOut
from jupyter_dist.display.live_displays import NOTE, WIDGET_MIME, LiveDisplays, is_live

BAR = {WIDGET_MIME: {"model_id": "m0"}, "text/plain": "epoch: 0%"}
TABLE = {"text/html": "<p>step 0/3</p>", "text/plain": "step 0/3"}


def test_a_widget_becomes_one_note_a_rank() -> None:
    live = LiveDisplays()
    first = live.for_gathered(RichOut(0, "display_data", BAR, {}))
    assert first == [StreamOut(0, "stdout", NOTE)]
    assert live.for_gathered(RichOut(0, "display_data", BAR, {})) == []  # said once a rank
    assert live.for_gathered(RichOut(1, "display_data", BAR, {})) == [StreamOut(1, "stdout", NOTE)]


def test_a_display_with_an_id_is_kept_for_the_end_as_its_latest_state() -> None:
    live = LiveDisplays()
    shown = live.for_gathered(RichOut(0, "display_data", TABLE, {}, {"display_id": "d"}))
    assert shown[0] == StreamOut(0, "stdout", NOTE)
    assert isinstance(shown[1], RichOut) and shown[1].msg_type == "update_display_data"
    update = RichOut(0, "update_display_data", TABLE, {}, {"display_id": "d"})
    assert live.for_gathered(update) == [update]


def test_other_output_passes_unchanged() -> None:
    live = LiveDisplays()
    for event in (
        RichOut(0, "display_data", TABLE, {}),
        RichOut(0, "execute_result", TABLE, {}, {"display_id": "d"}),
        StreamOut(0, "stdout", "text\n"),
    ):
        assert live.for_gathered(event) == [event]


def test_a_widget_as_a_cells_result_stays_in_its_ranks_view() -> None:
    result = RichOut(0, "execute_result", BAR, {})
    assert is_live(result)
    assert LiveDisplays().for_gathered(result) == [StreamOut(0, "stdout", NOTE)]
