"""Numbers a user gives, checked against their range before anything is built from them,
and shown short when refused.

A count typed with thousands of digits, or sent as such in a REST body, is refused naming
the value (its first and last digits and how many there are: `shown`) and the range
expected. `parse_whole` and `parse_seconds` read an option's text without converting
more digits than the range needs; `check_whole` and `check_seconds_in` check a value that
came as a number.
"""

from __future__ import annotations

import math
import re

from jupyter_dist.errors import SpecError

#: the most characters of a refused value a message repeats
SHOWN_CHARS = 40
#: digits past these a number is shown cut short
SHOWN_DIGITS = 18
_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def shown(value: object) -> str:
    """``value`` as a refusal names it: a number of many digits as its first and last
    digits and their count (``'99999999...9999' (4000 digits)``), a long text cut short."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            text = str(value)
        except ValueError:  # past Python's own limit on digits it converts
            return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
        return _digits(text) if len(text.lstrip("-")) > SHOWN_DIGITS else text
    if isinstance(value, str):
        if _WHOLE.fullmatch(value.strip()) and len(value.strip().lstrip("+-")) > SHOWN_DIGITS:
            return _digits(value.strip())
        if len(value) > SHOWN_CHARS:
            return f"{value[: SHOWN_CHARS - 10]!r}... ({len(value)} characters)"
        return repr(value)
    return repr(value)


def cut(text: str, chars: int = SHOWN_CHARS) -> str:
    """``text`` as written, or its beginning and its length where it is longer than
    ``chars`` characters (for a message that repeats a value without quoting it)."""
    return text if len(text) <= chars else f"{text[: chars - 10]}... ({len(text)} characters)"


def _digits(text: str) -> str:
    sign = text[0] if text[0] in "+-" else ""
    digits = text.lstrip("+-")
    return f"'{sign}{digits[:8]}...{digits[-4:]}' ({len(digits)} digits)"


def check_whole(flag: str, value: object, low: int, high: int) -> int:
    """``value`` if it is a whole number from ``low`` to ``high``; else `SpecError`
    naming ``flag``, the value (`shown`) and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{flag} {shown(value)}: expected a whole number, {low} to {high}")
    if not low <= value <= high:
        raise SpecError(f"{flag} {shown(value)}: expected {low} to {high}")
    return value


def parse_whole(flag: str, text: str, low: int, high: int) -> int:
    """An option's text as a whole number from ``low`` to ``high``; digits past what the
    range needs are refused without being converted."""
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped):
        raise SpecError(f"{flag} {shown(text)}: expected a whole number, {low} to {high}")
    sign = "-" if stripped.startswith("-") else ""
    digits = stripped.lstrip("+-").lstrip("0") or "0"  # leading zeros say nothing
    if len(digits) > len(str(max(abs(low), abs(high)))):
        raise SpecError(f"{flag} {shown(sign + digits)}: expected {low} to {high}")
    return check_whole(flag, int(sign + digits), low, high)


def check_seconds_in(flag: str, value: object, high: float) -> float:
    """``value`` if it is a finite number of seconds, more than 0 and at most ``high``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= high
    ):
        raise SpecError(f"{flag} {shown(value)}: expected seconds, more than 0, at most {high:g}")
    return float(value)


def parse_seconds(flag: str, text: str, high: float) -> float:
    """An option's text as seconds, more than 0 and at most ``high``; the text that was
    refused is the one named (``1e999`` is not shown as ``inf``)."""
    stripped = text.strip()
    if len(stripped) > SHOWN_CHARS or not _DECIMAL.fullmatch(stripped):
        raise SpecError(f"{flag} {shown(text)}: expected seconds, more than 0, at most {high:g}")
    value = float(stripped)
    if not math.isfinite(value) or not 0 < value <= high:
        raise SpecError(
            f"{flag} {shown(stripped)}: expected seconds, more than 0, at most {high:g}"
        )
    return value


__all__ = ["check_seconds_in", "check_whole", "cut", "parse_seconds", "parse_whole", "shown"]
