"""User-input problems as messages: the scenario error type, pydantic errors as one line per
problem naming the file and the field path, and the size limits of a scenario document."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

from pydantic import ValidationError

from attnbench.workload.units import short_repr

MAX_NODES = 200_000  # YAML values after alias expansion
MAX_DEPTH = 64  # YAML nesting


class ScenarioError(ValueError):
    """A problem with user input; ``str()`` is the one-line message for the user."""


def format_validation_error(err: ValidationError, where: str, prefix: str = "",
                            keys_at: Optional[Callable[[tuple], list[str]]] = None) -> str:
    """One line per problem: the file, the field path, what was wrong, what was given and,
    where a close spelling exists, what was meant. ``keys_at(loc)``: the keys allowed beside
    an unknown key at ``loc`` (for a suggestion)."""
    lines = []
    for e in err.errors():
        loc = ".".join(loc_part(x) for x in e["loc"] if not str(x).startswith("function-"))
        loc = re.sub(r"\.?(Annotated|list)\[[^\]]*\]", "", loc)
        msg = " ".join(e["msg"].removeprefix("Value error, ").split())  # one line
        given = e.get("input")
        if e["type"] == "extra_forbidden":
            meant = close_match(str(e["loc"][-1]), keys_at(e["loc"]) if keys_at else [])
            msg = ("unknown key" + (f"; did you mean {meant}?" if meant else "; remove it or check the spelling")
                   + " (`attnbench schema` lists the keys)")
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] in ("literal_error", "enum"):
            choices = re.findall(r"'([^']*)'", str((e.get("ctx") or {}).get("expected", "")))
            meant = close_match(str(given), choices)
            msg = f"{short_repr(given)} is not one of {', '.join(choices)}" + (f"; did you mean {meant}?" if meant else "")
        elif _scalar(given):
            msg = f"{msg} (given: {short_repr(given)})"
        field = f"{prefix}{loc}" if loc else (prefix.rstrip(": ") or "(top level)")
        lines.append(f"{where}: {field}: {msg}")
    return "\n".join(lines)


def _scalar(x: Any) -> bool:
    return isinstance(x, (int, float, str, bool)) and not (isinstance(x, str) and len(x) > 60)


def close_match(word: str, choices: list[str]) -> str:
    """The choice a misspelled ``word`` most likely meant ('' when none is close)."""
    import difflib

    low = {c.lower(): c for c in choices}
    if word.lower() in low:
        return low[word.lower()]
    hit = difflib.get_close_matches(word.lower(), list(low), n=1, cutoff=0.6)
    return low[hit[0]] if hit else ""


def loc_part(x: Any) -> str:
    """A field-path part for a message: user keys with odd characters are quoted, long ones cut."""
    s = str(x)
    if len(s) > 40 or not s.isprintable() or not s:
        return short_repr(s, 40)
    return s


def check_shape(doc: Any, where: str) -> None:
    """Refuse documents too deep or too big to handle (YAML aliases can make a few lines
    expand to billions of values): walked without recursion, stopped at the limits."""
    stack = [(doc, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise ScenarioError(f"{where}: more than {MAX_NODES} values (after YAML aliases); a scenario is far smaller")
        if depth > MAX_DEPTH:
            raise ScenarioError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
