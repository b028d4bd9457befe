"""A rank's output log (`rank.output_log`): bounded parts, offsets that stay true."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from jupyter_dist.rank import output_log
from jupyter_dist.rank.output_log import OutputLog, parts, read_output, remove_parts


def test_a_followed_log_reads_on_from_where_it_was(tmp_path: Path) -> None:
    base = str(tmp_path / "rank-0.out")
    assert read_output(base, 0, 1000) == ("", 0, 0)  # nothing written yet
    log = OutputLog(base)
    log.cell(3)
    log.write("hello\n")
    text, start, end = read_output(base, 0, 1000)
    assert start == 0 and text.endswith("hello\n") and "--- In [3], " in text
    log.write("more\n")
    assert read_output(base, end, 1000) == ("more\n", end, end + 5)
    assert read_output(base, end + 5, 1000) == ("", end + 5, end + 5)
    # past its end (the rank was started again): from the start
    assert read_output(base, end + 500, 1000)[1] == 0
    # cut at a line's end
    log.write("a" * 10 + "\n" + "b" * 10)
    piece, _, after = read_output(base, end + 5, 15)
    assert piece == "a" * 10 + "\n" and after == end + 5 + 11


def test_the_log_keeps_its_last_parts_and_says_what_it_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output_log, "PART_BYTES", 100)
    base = str(tmp_path / "rank-1.out")
    log = OutputLog(base)
    for i in range(100):
        log.write(f"line {i:04d} {'x' * 39}\n")  # 50 bytes a line
    found = parts(base)
    assert len(found) == output_log.PARTS
    starts = [start for start, _ in found]
    assert starts == sorted(starts) and starts[-1] == 4900 and starts[0] == 4900 - 300
    text, start, end = read_output(base, 0, 10_000)
    assert text.startswith(f"[{starts[0]:,} bytes of older output dropped")
    assert start == starts[0] and end == starts[1]
    assert text.splitlines()[1] == f"line 0092 {'x' * 39}"
    # a reader at the end sees only what comes next
    log.write("the end\n")
    last = read_output(base, 5000, 10_000)
    assert last == ("the end\n", 5000, 5008)
    remove_parts(base)
    assert parts(base) == [] and read_output(base, 0, 100) == ("", 0, 0)


def test_writes_from_many_threads_are_kept_whole(tmp_path: Path) -> None:
    base = str(tmp_path / "rank-2.out")
    log = OutputLog(base)

    def write(n: int) -> None:
        for i in range(200):
            log.write(f"thread {n} line {i}\n")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text, _, _ = read_output(base, 0, 1 << 20)
    lines = text.splitlines()
    assert len(lines) == 800 and all(line.startswith("thread ") for line in lines)
    log.close()


def test_a_failed_write_costs_the_log_only(tmp_path: Path) -> None:
    log = OutputLog(str(tmp_path / "gone" / "rank-3.out"))  # its folder does not exist
    log.write("nowhere\n")  # no error
    log.cell(1)
