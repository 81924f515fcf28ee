"""Text from a bundle, a registry or a host made safe to show: control characters written out
(:func:`printable`), Markdown's punctuation escaped (:func:`markdown`).

Imports nothing but :mod:`re`: the CLI's plain lines use :func:`printable` before rich or the library is
loaded.
"""

from __future__ import annotations

import re

_CONTROLS = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
             for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029) if c not in (0x09, 0x0A)}
_MARKDOWN = {ord(c): "\\" + c for c in "\\`*_[]<>|~&$"}
"""Characters Markdown (or a table) reads anywhere in a line."""
_MARKDOWN.update({ord("\n"): " ", ord("\r"): " ", ord("\t"): " "})
_LEADING = re.compile(r"^(?:[#>=]|-{2,}|[+-](?=\s|$)|\d+[.)](?=\s|$))")
"""What opens a heading, a list, a quote or a setext underline at the start of a line."""


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline written as ``\\xHH``: a name
    or message from a bundle or a registry cannot move the cursor, clear the screen, set the
    terminal's title or colour what follows."""
    return text.translate(_CONTROLS)


def markdown(text: str) -> str:
    """``text`` as literal Markdown inline text (GitHub-flavoured): control characters written
    out, every character Markdown or a table reads inside a line escaped with a backslash, and
    what would open a block at the start of a line (``#``, ``-``, ``1.``...); line breaks and
    tabs as spaces, so that it stays one table cell or one line of a list."""
    escaped = printable(text).translate(_MARKDOWN).lstrip(" ")
    return _LEADING.sub(lambda m: m[0][:-1] + "\\" + m[0][-1], escaped)
