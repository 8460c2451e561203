"""Text read from scenarios, run folders and backends (names, case ids, reasons) made safe to
show: ``term_text`` for a terminal, ``md_text`` for Markdown (a CI step summary, a pull request).

A scenario name is data, never an instruction to the terminal or the page that shows it: an
``ESC ]0;...`` in it must not set a window title, an ``ESC [31m`` must not colour what follows,
a newline must not start a line of its own, and ``<img src=...>`` or ``**PASS**`` must not become
an image or bold text. Control characters are shown as their control pictures (ESC as ``␛``,
a newline as ``␤``), so that the reader sees what the text holds.
"""
from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the characters that reorder or break lines (bidi controls,
# line and paragraph separators): each shown as a visible stand-in
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _picture(m: re.Match) -> str:
    c = ord(m.group())
    if c == 0x0A:
        return "\u2424"  # ␤
    if c < 0x20:
        return chr(0x2400 + c)  # ␀ ... ␟ (ESC: ␛)
    if c == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"  # C1 controls and bidi or line-breaking characters


def term_text(text: str, keep_lines: bool = False) -> str:
    """``text`` with every control character (escape sequences' ESC included) shown as a visible
    picture; ``keep_lines`` keeps newlines and tabs (a message of several lines)."""
    return (_CONTROL_KEEP_LINES if keep_lines else _CONTROL).sub(_picture, str(text))


_MD_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Markdown's punctuation with a meaning inline: code, emphasis, links and images, tables, strike;
# ``_`` only where it can open or close emphasis (not inside a word: page_size stays as it is)
_MD_SPECIAL = re.compile(r"[&<>\\`*\[\]|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def md_text(text: str) -> str:
    """``text`` as literal Markdown text on one line (inside a table cell, a heading or bold
    text): control characters as pictures (a newline cannot start a line), HTML as entities
    (``<img>`` is text), Markdown's punctuation backslash-escaped (no emphasis, link, image,
    code span or table cell of its own)."""
    return _MD_SPECIAL.sub(lambda m: _MD_ESCAPES.get(m.group(), "\\" + m.group()), term_text(text))


def safe_console_class():
    """A rich ``Console`` whose every printed text passes ``term_text`` (newlines and tabs kept):
    a table, a title, a progress line or a message cannot carry an escape sequence to the
    terminal, whichever renderer made it. rich's own styling and cursor control are not text
    and pass as they are."""
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        def render(self, renderable, options=None):
            for seg in super().render(renderable, options):
                if seg.control or not _CONTROL_KEEP_LINES.search(seg.text):
                    yield seg
                else:
                    yield Segment(term_text(seg.text, keep_lines=True), seg.style, seg.control)

    return SafeConsole
