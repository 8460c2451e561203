"""docs/ is prose for users, wrapped at 100 columns so that it reads in a terminal and merges line by
line (docs/backends.md once held a 3,730-character paragraph line). Tables and code blocks are left as
they are, and so is a line that is one unbreakable link."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100


def long_prose_lines(text: str) -> list[tuple[int, int]]:
    """(line number, length) of every prose line over WIDTH characters."""
    out, fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence or stripped.startswith("|") or len(line) <= WIDTH:
            continue
        words = stripped.split()
        if len(words) <= 3 and any("](" in w or w.startswith("http") for w in words):
            continue  # a link that cannot be broken
        out.append((n, len(line)))
    return out


def test_the_check_finds_a_long_paragraph_line_and_passes_tables_code_and_links():
    text = "\n".join(["ok " * 20, "word " * 30, "| a | " + "b " * 80 + "|", "```", "x" * 300, "```",
                      "  [a.py](https://example.org/" + "p" * 120 + ")", "- " + "item " * 25])
    assert long_prose_lines(text) == [(2, 150), (8, 127)]


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_docs_prose_is_wrapped(path):
    bad = long_prose_lines(path.read_text())
    assert not bad, (f"{path.relative_to(ROOT)}: prose lines over {WIDTH} characters (wrap them; tables and "
                     f"code blocks may be wider): " + ", ".join(f"line {n} ({k})" for n, k in bad))
