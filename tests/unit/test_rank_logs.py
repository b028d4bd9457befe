"""A cell's rank logs are best effort: a write that fails (a full disk) costs the log, with
one notice naming the folder and the error, never the output; the next cell tries again.

A log file that is a link to ``/dev/full`` fails every write with ENOSPC, as a full disk
does, with no disk to fill."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from jupyter_dist.common.events import CellFinished, CellResult, RankFinished, StreamOut
from jupyter_dist.common.temp_space import unwritable
from jupyter_dist.display import rank_logs
from jupyter_dist.display.rank_logs import NOT_KEPT, RankLogs
from jupyter_dist.display.render_text import TextRenderer

FULL = Path("/dev/full")
NOTICE = "rank logs are off for this cell: no space left on device in "

pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")


def full_log(base: Path, session: str, cell: int, rank: int = 0) -> None:
    """Make ``rank``'s log of that cell a file that no write fits in."""
    folder = base / session / f"cell-{cell}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}.log").symlink_to(FULL)


def test_a_failed_write_stops_the_logs_and_says_so_once(tmp_path: Path) -> None:
    full_log(tmp_path, "s", 1)
    notices: list[str] = []
    logs = RankLogs("s", 1, base=str(tmp_path), on_failure=notices.append)
    logs.write(1, "rank 1 fits\n")
    for _ in range(100):  # more than a file buffer: the write reaches the disk
        logs.write(0, "x" * 1000 + "\n")
    logs.write(1, "and more\n")
    logs.close()  # nothing raised, here or above
    assert notices == [f"{NOTICE}{logs.folder}; free space there or point TMPDIR at another folder"]
    assert logs.failure == notices[0]
    assert not logs.kept and logs.written
    assert logs.hint(0) == logs.hint(1) == logs.folder_hint() == NOT_KEPT


def test_a_failure_at_close_is_said_too(tmp_path: Path) -> None:
    full_log(tmp_path, "s", 2)
    notices: list[str] = []
    logs = RankLogs("s", 2, base=str(tmp_path), on_failure=notices.append)
    logs.write(0, "a short line stays in the buffer\n")
    assert not notices
    logs.close()
    assert len(notices) == 1 and notices[0].startswith(NOTICE)


def test_the_next_cell_tries_again(tmp_path: Path) -> None:
    full_log(tmp_path, "s", 3)
    first = RankLogs("s", 3, base=str(tmp_path), on_failure=lambda _: None)
    first.write(0, "y" * 100_000)
    first.close()
    assert first.failure is not None
    second = RankLogs("s", 4, base=str(tmp_path))
    second.write(0, "kept\n")
    second.close()
    assert second.kept and second.path(0).read_text() == "kept\n"


def test_a_private_folder_that_cannot_be_made_is_a_notice_at_the_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setattr(rank_logs, "_root", None)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "not-a-folder"))
    notices: list[str] = []
    logs = RankLogs("s", 5, on_failure=notices.append)  # no folder, no error yet
    assert not notices
    logs.write(0, "line\n")
    logs.close()
    assert len(notices) == 1
    assert notices[0].startswith("rank logs are off for this cell: not a directory in ")
    assert str(tmp_path / "not-a-folder") in notices[0]


def test_text_output_is_shown_in_full_with_one_notice(tmp_path: Path) -> None:
    full_log(tmp_path, "text", 6)
    out, err = io.StringIO(), io.StringIO()
    logs = RankLogs("text", 6, base=str(tmp_path))
    r = TextRenderer([0, 1], out, err, limit=0, logs=logs)
    logs.on_failure = r._logs_failed
    for n in range(2000):
        r.handle(StreamOut(n % 2, "stdout", f"line {n // 2} of rank {n % 2}\n"))
    for rank in (0, 1):
        r.handle(RankFinished(rank, "ok", 0.1))
    r.handle(CellFinished(CellResult((0, 1), (), {})))
    text = out.getvalue()
    assert text.count(NOTICE) == 1
    assert all(f"[rank 0] line {n} of rank 0" in text for n in range(1000))
    assert all(f"[rank 1] line {n} of rank 1" in text for n in range(1000))


def test_a_cell_view_shows_everything_with_one_notice_and_no_log_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_dist.display.cell_view import CellView

    monkeypatch.setattr(rank_logs, "_root", tmp_path)
    full_log(tmp_path, "view", 7)
    view = CellView("view", 7, {0: ("h", 0)}, display=lambda *a, **k: None)
    for n in range(300):
        view.handle(StreamOut(0, "stdout", f"{n} " + "z" * 100 + "\n"))
    view.handle(RankFinished(0, "ok", 0.1))
    view.handle(CellFinished(CellResult((0,), (), {})))
    state = view.state()
    assert [n for n in state["notices"] if n.startswith(NOTICE)] == state["notices"]
    assert len(state["notices"]) == 1
    assert state["lines"][0].splitlines()[-1] == "299 " + "z" * 100
    assert len(state["lines"][0].splitlines()) == 300
    assert "logs: " not in view.footer_html and "done on rank 0" in view.footer_html


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.ENOSPC, "no space left on device in /t/x; free space there or point TMPDIR"),
        (errno.EDQUOT, "disk quota exceeded in /t/x; free space there or point TMPDIR"),
        (errno.EROFS, "read-only file system in /t/x; point TMPDIR at another folder"),
    ],
)
def test_unwritable_names_the_folder_the_error_and_the_fix(code: int, says: str) -> None:
    assert unwritable("/t/x", OSError(code, os.strerror(code))).startswith(says)


def test_unwritable_without_any_temporary_folder() -> None:
    err = FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp']")
    assert unwritable("", err) == (
        "No usable temporary directory found in ['/tmp', '/var/tmp']; "
        "free space in one of them or point TMPDIR at another folder"
    )


def test_a_log_holds_what_its_rank_showed_tracebacks_and_rich_output_too(tmp_path: Path) -> None:
    from jupyter_dist.common.events import RichOut
    from jupyter_dist.errors import RankFailure

    logs = RankLogs("s", 3, base=str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    text = TextRenderer([0, 1], out, err, logs=logs)
    text.handle(RichOut(0, "display_data", {"text/plain": "a table"}, {}, {}))
    traceback = ("\x1b[31mTraceback (most recent call last)\x1b[0m", "ValueError: only raised")
    failure = RankFailure(1, "h", 1, "error", "ValueError", "only raised", traceback)
    text.handle(RankFinished(0, "ok", 0.1))
    text.handle(RankFinished(1, "error", 0.1, failure))
    text.handle(CellFinished(CellResult((0, 1), (failure,), {})))
    assert logs.path(0).read_text() == "a table\n"
    expected = "Traceback (most recent call last)\nValueError: only raised\n"
    assert logs.path(1).read_text() == expected  # without colours


def test_touch_makes_an_empty_log_for_a_silent_rank(tmp_path: Path) -> None:
    logs = RankLogs("s", 4, base=str(tmp_path))
    logs.write(1, "one\n")
    logs.touch([0, 1])
    logs.close()
    assert logs.path(0).read_text() == "" and logs.path(1).read_text() == "one\n"
    assert logs.kept
