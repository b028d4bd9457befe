"""The README's option tables say exactly what the magics accept.

Every option of the ``%%distributed`` and ``%dist`` parsers is a row of the README's tables,
every row names an option (or ``%dist`` command) that exists, and the notebooks it lists
are the notebooks in ``notebooks/``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from jupyter_dist.notebook.magics import DIST_COMMANDS, DistMagics

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
MAX_README_BYTES = 1_000_000


def readme_lines() -> list[str]:
    size = README.stat().st_size
    assert size < MAX_README_BYTES, f"README.md is {size} bytes; expected under {MAX_README_BYTES}"
    return README.read_text(encoding="utf-8").splitlines()


def table_after(marker: str) -> list[str]:
    """First cells of the table that follows the line starting with ``marker``."""
    lines = readme_lines()
    starts = [i for i, line in enumerate(lines) if line.startswith(marker)]
    assert len(starts) == 1, f"README.md: expected one line starting {marker!r}, found {starts}"
    cells: list[str] = []
    for line in lines[starts[0] + 1 :]:
        if not line.startswith("|"):
            if cells or line.startswith("#"):
                break  # the table ended, or the section did before one began
            continue  # the rest of the marker's paragraph, blank lines
        cells.append(line.split("|")[1].strip())
    assert len(cells) > 2, f"README.md: no table after {marker!r}"
    _header, rule, *rows = cells
    assert set(rule) <= {"-", " ", ":"}, f"README.md: {marker!r} table has no header rule"
    return rows


def option_in(cell: str) -> str:
    """``--backend nccl\\|gloo`` -> ``--backend``: the option a table row names."""
    found = re.findall(r"`(--[a-z][a-z0-9-]*)", cell)
    assert len(found) == 1, f"README.md row {cell!r}: expected one `--option`, found {found}"
    return str(found[0])


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {
        s
        for action in parser._actions
        for s in action.option_strings
        if s.startswith("--") and s != "--help"
    }


def documented(marker: str) -> list[str]:
    return [option_in(row) for row in table_after(marker)]


@pytest.mark.parametrize(
    ("marker", "parser"),
    [
        ("`%%distributed` (see", DistMagics.distributed.parser),
        ("`%dist` options", DistMagics.dist.parser),
    ],
    ids=["%%distributed", "%dist"],
)
def test_every_option_is_in_the_readme_and_every_row_exists(
    marker: str, parser: argparse.ArgumentParser
) -> None:
    rows = documented(marker)
    accepted = options_of(parser)
    assert accepted, "the parser accepts no options"
    assert len(rows) == len(set(rows)), f"an option is listed twice: {sorted(rows)}"
    assert sorted(accepted - set(rows)) == [], "accepted by the magic, missing from README.md"
    assert sorted(set(rows) - accepted) == [], "in README.md, not accepted by the magic"


def test_every_dist_command_is_in_the_readme_and_every_row_exists() -> None:
    rows = table_after("`%dist` subcommands")
    commands = []
    for row in rows:
        found = re.fullmatch(r"`%dist ([a-z]+)[^`]*`", row)
        assert found, f"README.md %dist row {row!r}: expected `%dist COMMAND ...`"
        commands.append(found.group(1))
    assert sorted(commands) == sorted(DIST_COMMANDS)


def test_a_row_naming_no_option_is_an_error() -> None:
    with pytest.raises(AssertionError, match="expected one `--option`"):
        option_in("`nodes N`")
    assert option_in("`--backend nccl\\|gloo`") == "--backend"


def test_the_readme_lists_every_notebook() -> None:
    rows = table_after("Tutorials in [`notebooks/`]")
    listed = set()
    for row in rows:
        found = re.fullmatch(r"\[`?([\w.]+\.ipynb)`?\]\(notebooks/\1\)", row)
        assert found, f"README.md notebooks row {row!r}: expected [name.ipynb](notebooks/...)"
        listed.add(found.group(1))
    shipped = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert sorted(shipped - listed) == [], "notebooks missing from README.md"
    assert sorted(listed - shipped) == [], "README.md lists notebooks that do not exist"


def test_the_binder_badge_opens_the_quickstart_of_the_repository() -> None:
    # Python 3.10 has no tomllib: the two lines are read as text
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    urls = dict(re.findall(r'^(Repository|Binder) = "([^"]+)"$', pyproject, re.M))
    repo = urls["Repository"].removeprefix("https://github.com/")
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo), urls["Repository"]
    binder = f"https://mybinder.org/v2/gh/{repo}/HEAD?urlpath=lab/tree/notebooks/quickstart.ipynb"
    assert urls["Binder"] == binder
    assert f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder})" in "\n".join(
        readme_lines()
    )
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", "\n".join(readme_lines())):
        assert (ROOT / image).is_file(), f"README.md shows {image}, which does not exist"


def test_every_server_option_is_in_the_readme_and_every_row_exists() -> None:
    from jupyter_dist.server.app import DistServerApp

    rows = []
    for row in table_after("starting a kernel does. Server options"):
        found = re.fullmatch(r"`([a-z_]+)`", row)
        assert found, f"README.md server option row {row!r}: expected `name`"
        rows.append(found.group(1))
    own = set(DistServerApp.class_own_traits(config=True))
    assert sorted(own - set(rows)) == [], "DistServerApp options missing from README.md"
    assert sorted(set(rows) - own) == [], "in README.md, not a DistServerApp option"
