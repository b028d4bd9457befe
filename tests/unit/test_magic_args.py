"""``%%distributed``'s arguments are parsed once a line, and every cell gets its own copy."""

from __future__ import annotations

from jupyter_dist.notebook.magics import PARSED_LINES, DistMagics


def test_a_repeated_line_is_parsed_once_and_each_cell_gets_its_own_copy() -> None:
    magics = DistMagics(None)
    line = "--procs 2 --node-selector a=b --timeout 5"
    first = magics._cell_args(line)
    second = magics._cell_args(line)
    assert first == second and first is not second
    assert first.procs == "2" and first.timeout == 5.0 and first.node_selector == ["a=b"]
    first.node_selector.append("changed=here")  # a cell's changes stay its own
    assert magics._cell_args(line).node_selector == ["a=b"]
    assert magics._cell_args("").procs is None


def test_the_kept_lines_are_bounded() -> None:
    magics = DistMagics(None)
    for n in range(PARSED_LINES + 5):
        assert magics._cell_args(f"--procs {n}").procs == str(n)
    assert len(magics._parsed_lines) == PARSED_LINES
