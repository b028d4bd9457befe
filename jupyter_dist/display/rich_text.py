"""The text a person reads for a rich output, where only text can be shown.

A rank's rich output (``display(HTML(...))``, a progress table of a library that detected
a notebook) reaches text copies too: the prefixed text of ``--output text``, the text a
saved cell keeps beside its HTML snapshot, the all-ranks view. Its ``text/plain`` is often
only the object's repr, ``<IPython.core.display.HTML object>``; `readable_text` prefers
what the richer types say: HTML as text (tables as aligned columns, a progress bar as a
bar), Markdown or LaTeX as written, and otherwise names the types that were displayed.
What rich's console prints in a notebook kernel is a display too; `printed_text` gives
it back as the lines it is, so that the views gathering ranks fold it as printed lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from html.parser import HTMLParser
from typing import Any

#: HTML longer than this is cut before it is read (a text copy needs no more)
MAX_HTML_CHARS = 1 << 20
#: a table wider than this many columns, or a cell longer than this, is not padded
MAX_COLUMNS = 64
MAX_CELL_CHARS = 200
BAR_CHARS = 20

#: how rich's console starts the HTML of what it prints in a notebook (``rich.jupyter``)
_RICH_PRE = '<pre style="white-space:pre;overflow-x:auto;line-height:normal;font-family:Menlo,'
#: the repr Python gives an object without a text form of its own
_BARE_REPR = re.compile(r"<[A-Za-z_][\w.]* object(?: at 0x[0-9a-fA-F]+)?>")
_SPACE = re.compile(r"\s+")
_SPACES = re.compile(r" {2,}")
_BLOCK = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "br",
        "caption",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "summary",
        "table",
        "tbody",
        "thead",
        "tfoot",
        "ul",
    ]
)
_SKIP = frozenset({"script", "style", "head", "title", "template", "noscript"})


def is_bare_repr(text: str) -> bool:
    """``<IPython.core.display.HTML object>`` and the like: says nothing to a reader."""
    return bool(_BARE_REPR.fullmatch(text.strip()))


def printed_text(data: Mapping[str, Any]) -> str | None:
    """What rich's console printed, when ``data`` is that: in a notebook kernel rich
    prints each piece as a display of its own ``<pre>`` with the same text as text/plain
    (colours as escape codes, which an output shows). None for any other display."""
    markup, text = data.get("text/html"), data.get("text/plain")
    if set(data) != {"text/html", "text/plain"} or not isinstance(text, str):
        return None
    if not isinstance(markup, str) or not markup.startswith(_RICH_PRE):
        return None
    return text if text.endswith("\n") else text + "\n"


def readable_text(data: Mapping[str, Any]) -> str:
    """The text to show for a rich output's mime bundle ``data``."""
    plain = data.get("text/plain")
    plain = plain if isinstance(plain, str) else ""
    if plain and not is_bare_repr(plain):
        return plain
    markup = data.get("text/html")
    if isinstance(markup, str):
        text = html_to_text(markup)
        if text:
            return text
    for kind in ("text/markdown", "text/latex"):
        value = data.get(kind)
        if isinstance(value, str) and value.strip():
            return value.strip()
    richer = sorted(k for k in data if k != "text/plain")
    if richer:
        return f"[{', '.join(richer)}]"
    return plain


def html_to_text(markup: str) -> str:
    """HTML as lines of text: blocks on lines of their own, tables as aligned columns,
    ``<progress>`` as a bar; scripts and styles left out."""
    parser = _TextOf()
    parser.feed(markup[:MAX_HTML_CHARS])
    parser.close()
    return parser.text()


class _TextOf(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.line: list[str] = []
        self.skipping = 0
        self.pre = 0
        self.rows: list[list[str]] | None = None  # the table being read
        self.cell: list[str] | None = None
        self.depth = 0  # tables inside the one being read: their text joins its cells

    # -- where text goes ----------------------------------------------------------------
    def _put(self, text: str) -> None:
        if self.cell is not None:
            self.cell.append(text)
        else:
            self.line.append(text)

    def _break(self) -> None:
        if self.cell is not None:
            self.cell.append(" ")
            return
        line = "".join(self.line).rstrip()
        self.line = []
        if self.pre:
            self.lines.append(line)
        elif line.strip():
            self.lines.append(_SPACES.sub(" ", line.strip()))

    # -- the parser's callbacks ---------------------------------------------------------
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self.skipping += 1
            return
        if tag == "table":
            if self.rows is not None:
                self.depth += 1
                return
            self._break()
            self.rows = []
            return
        if self.rows is not None and self.depth and tag in ("td", "th", "tr"):
            self._put(" ")  # an inner table's cells: words of the outer table's cell
            return
        if self.rows is not None and self.depth == 0:
            if tag == "tr":
                self.rows.append([])
                return
            if tag in ("td", "th"):
                if not self.rows:
                    self.rows.append([])
                self.cell = []
                return
        if tag == "progress":
            self._put(_bar(dict(attrs)) + " ")
        elif tag in _BLOCK:
            self._break()
        if tag == "pre":
            self.pre += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in ("br", "hr", "progress"):
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skipping = max(0, self.skipping - 1)
            return
        if tag == "table" and self.rows is not None:
            if self.depth:
                self.depth -= 1
                return
            self._end_cell()
            rows, self.rows = self.rows, None
            self.lines.extend(_columns(rows))
            return
        if self.rows is not None and self.depth == 0 and tag in ("td", "th", "tr"):
            self._end_cell()
            return
        if tag in _BLOCK:
            self._break()
        if tag == "pre":
            self.pre = max(0, self.pre - 1)

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        if self.pre and self.cell is None:
            pieces = data.split("\n")
            for piece in pieces[:-1]:
                self.line.append(piece)
                self._break()
            self.line.append(pieces[-1])
            return
        self._put(_SPACE.sub(" ", data))

    def _end_cell(self) -> None:
        if self.cell is not None and self.rows is not None:
            self.rows[-1].append(_SPACE.sub(" ", "".join(self.cell)).strip())
        self.cell = None

    def text(self) -> str:
        if self.rows is not None:  # a table never closed
            self._end_cell()
            self.lines.extend(_columns(self.rows))
            self.rows = None
        self._break()
        while self.lines and not self.lines[-1]:
            self.lines.pop()
        return "\n".join(self.lines)


def _bar(attrs: Mapping[str, str | None]) -> str:
    """``<progress value=3 max=10>`` as ``[######--------------]``."""
    try:
        value = float(attrs.get("value") or 0)
        top = float(attrs.get("max") or 1)
        share = min(max(value / top, 0.0), 1.0) if top > 0 else 0.0
    except ValueError:
        share = 0.0
    done = round(share * BAR_CHARS)
    return "[" + "#" * done + "-" * (BAR_CHARS - done) + "]"


def _columns(rows: list[list[str]]) -> list[str]:
    """Table rows as lines, each column as wide as its widest cell."""
    rows = [row for row in rows if any(row)]
    if not rows:
        return []
    width = max(map(len, rows))
    if width > MAX_COLUMNS:
        return ["  ".join(row) for row in rows]
    widths = [0] * width
    for row in rows:
        for n, cell in enumerate(row):
            widths[n] = max(widths[n], min(len(cell), MAX_CELL_CHARS))
    return ["  ".join(cell.ljust(widths[n]) for n, cell in enumerate(row)).rstrip() for row in rows]
