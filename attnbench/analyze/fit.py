"""One width policy for the tables commands print (check, compare, history, decide, trees,
scenarios, backends, ceilings, calibrate, tree-costs; run and show fit theirs by column
importance in run_table.py): a table never runs past the console's width (``COLUMNS``, a
terminal's width, else 160) and never cuts a word.

Each column is one of three kinds:

- ``name``: what a user types next (a backend spec, a case id, a scenario or preset name):
  shown whole, never cut, never left out;
- ``value``: a number or a short word (a verdict, a status): shown whole, or the column is left
  out, in the order its ``drop`` rank says (lowest first), and the table says which;
- ``prose``: wraps at its words, never inside one.

When leaving out every droppable column is not enough (long case ids at 60 columns), each row
is printed as a block instead: its names on one line, then one indented ``header: value`` line
per column, wrapped at words.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

NAME, VALUE, PROSE = "name", "value", "prose"
Cell = Union[str, Text]


@dataclass(frozen=True)
class Col:
    """A column: its header, kind (NAME, VALUE, PROSE), justification, and ``drop``: the rank
    at which a too-narrow console leaves it out (lowest first; None: always shown)."""

    header: str
    kind: str = VALUE
    justify: str = "left"
    drop: Optional[int] = None


def _text(cell: Cell) -> Text:
    return cell if isinstance(cell, Text) else Text(str(cell))


def _longest_word(texts) -> int:
    return max((cell_len(w) for t in texts for w in t.split()), default=0)


def _widest(texts) -> int:
    return max((cell_len(line) for t in texts for line in t.splitlines() or [""]), default=0)


PROSE_LEAST = 16  # a prose column's narrowest measure, unless a longer word needs more
GAP = 2  # cells between two columns: a blank border and one cell of padding


def column_widths(cols: Sequence[Col], rows: Sequence[Sequence[Cell]], width: Optional[int]) -> Optional[list[int]]:
    """Each column's width in cells for a table at most ``width`` wide (None: unlimited), or
    None when no layout fits. A name or value column is as wide as its widest cell; a prose
    column at least its longest word and PROSE_LEAST cells (or its widest line); a header wraps at its words. The room above the least
    goes to the columns that can use it, the smallest needs met whole first, the rest shared."""
    least, most = [], []
    for i, c in enumerate(cols):
        cells = [_text(r[i]).plain for r in rows]
        most.append(max(_widest(cells), cell_len(c.header), 1))
        # prose keeps a readable measure (PROSE_LEAST cells, or all it needs) before a value is left out
        floor = max(_longest_word(cells), min(most[-1], PROSE_LEAST)) if c.kind == PROSE else _widest(cells)
        least.append(max(floor, _longest_word([c.header]), 1))
    room = (width if width is not None else 10**9) - GAP * (len(cols) - 1)
    if sum(least) > room:
        return None
    if sum(most) <= room:
        return most
    spare, widths = room - sum(least), list(least)
    wants = sorted(range(len(cols)), key=lambda i: most[i] - least[i])
    for n, i in enumerate(wants):  # the smallest wants are met whole, the rest share what is left
        grant = min(most[i] - least[i], spare // (len(wants) - n))
        widths[i] += grant
        spare -= grant
    return widths


def build_table(cols: Sequence[Col], rows: Sequence[Sequence[Cell]], width: Optional[int] = None,
                sections: Sequence[int] = (), row_styles: Sequence[str] = ()) -> Optional[Table]:
    """The table (no title: :func:`print_fitted` prints it, wrapped at words) of ``rows`` under
    ``cols`` in the shared style (a rule under the header, columns 2 cells apart, no outer border) at most ``width`` cells wide (None: unlimited), or None when
    it cannot be drawn that narrow without cutting a word. ``sections``: row indexes before
    which a blank line separates groups; ``row_styles``: a style per row."""
    widths = column_widths(cols, rows, width)
    if widths is None:
        return None
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 1, 0, 0), title_justify="left")
    for c, w in zip(cols, widths):
        t.add_column(c.header, justify=c.justify, overflow="fold", width=w)
    for j, r in enumerate(rows):
        if j in sections and j:
            t.add_section()
        t.add_row(*(_text(x) for x in r), style=row_styles[j] if j < len(row_styles) else "")
    return t


def fit(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[Cell]],
        sections: Sequence[int] = (), row_styles: Sequence[str] = ()) -> tuple[Optional[Table], list[str]]:
    """(the table that fits ``console``'s width, the headers left out); (None, the droppable
    headers) when no table fits (print the rows with :func:`print_blocks`)."""
    keep = list(range(len(cols)))
    dropped: list[str] = []
    order = sorted((i for i, c in enumerate(cols) if c.drop is not None), key=lambda i: cols[i].drop)
    while True:
        t = build_table([cols[i] for i in keep], [[r[i] for i in keep] for r in rows], console.width,
                        sections, row_styles)
        if t is not None:
            return t, dropped
        if not order:
            return None, dropped
        i = order.pop(0)
        keep.remove(i)
        dropped.append(cols[i].header)


def word_lines(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` cells, broken at spaces only: a word longer than
    the width (a path, a case id) has a line of its own, whole."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def print_words(console: Console, text: str, style: str = "") -> None:
    """Print ``text`` wrapped at its spaces only, never inside a word (rich would cut a word
    longer than the console; a terminal would hard-wrap a line it was given whole)."""
    for line in word_lines(text, console.width):
        console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)


class Blocks:
    """Rows as blocks, for a console too narrow for their table: each row's names on one line
    (whole, never cut; a name left blank under the row before it, as a table shows a case once,
    is that row's), then an indented ``header: value`` line per other column that has a value,
    wrapped at words."""

    def __init__(self, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], title: str = ""):
        self.cols, self.rows, self.title = cols, rows, title

    def __rich_console__(self, console: Console, options):
        width = options.max_width
        names = [i for i, c in enumerate(self.cols) if c.kind == NAME]
        last = {i: "" for i in names}
        if self.title:
            yield from (Text(ln, style="bold") for ln in word_lines(self.title, width))
        for r in self.rows:
            for i in names:
                last[i] = _text(r[i]).plain or last[i]
            yield from (Text(ln, style="bold") for ln in word_lines("  ".join(last[i] for i in names if last[i]) or "-",
                                                                       width))
            for i, c in enumerate(self.cols):
                cell = _text(r[i])
                if i in names or not cell.plain.strip():
                    continue
                lines = word_lines(" ".join(c.header.split()) + ": " + cell.plain, width - 4)
                yield Text("  " + lines[0], style=cell.style)
                yield from (Text("    " + ln, style=cell.style) for ln in lines[1:])


def print_blocks(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], title: str = "") -> None:
    """Print ``rows`` as :class:`Blocks`."""
    console.print(Blocks(cols, rows, title), highlight=False)


def print_fitted(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], title: str = "",
                 sections: Sequence[int] = (), row_styles: Sequence[str] = (), where: str = "--format json") -> None:
    """Print ``rows`` as a table that fits the console (columns left out in their ``drop``
    order, named under it; ``where``: the output that has them), else as blocks."""
    t, dropped = fit(console, cols, rows, sections, row_styles)
    if t is None:
        print_blocks(console, cols, rows, title)
        return
    if title:
        print_words(console, title, "bold")
    console.print(t)
    if dropped:
        print_words(console, f"not shown at {console.width} columns: {', '.join(dropped)} ({where} has them)", "dim")
