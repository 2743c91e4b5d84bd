"""Whole numbers read from text — a URL's database, an id in a name, a count typed on the
command line — are read here, from ASCII digits only.

Python's own checks and parsers disagree about other scripts: `"²".isdigit()` is True and
`int("²")` raises; `int("٣")` and `int("３")` are 3 (Arabic-Indic and fullwidth digits), and
`int(" 3\\u00a0")` strips blanks. A check and a parse that disagree crash (a superscript
database number once crashed `validate`), and a parse that accepts what the user did not mean
silently reads another number. So a number is 1 to 20 ASCII digits, nothing around them;
anything else is not a number, for the caller to refuse with its own path and fix.
"""

from __future__ import annotations

import re

_ASCII_WHOLE = re.compile(r"[0-9]{1,20}")

ASCII_FORM = "ASCII digits 0-9 only (no other script's digits, superscripts, blanks or signs)"
"""How to write a number, for refusals."""


def is_ascii_whole(text: object) -> bool:
    """True for a non-negative whole number written in 1 to 20 ASCII digits, nothing else."""
    return isinstance(text, str) and _ASCII_WHOLE.fullmatch(text) is not None


def ascii_whole(text: object) -> int | None:
    """The number `text` writes in ASCII digits, or None when it is anything else."""
    return int(text) if isinstance(text, str) and is_ascii_whole(text) else None
