"""One line for a row's reason from an exception, however long its message.

Most messages say what went wrong in their first line. Some only introduce what follows:
FlashInfer's JIT raises ``RuntimeError: Ninja build failed. Ninja output:`` with the compiler's
output on the next lines, so a first line alone told nothing (rows of an H200 run said just
that). A first line that ends with ``:`` gets the lines that name an error from what follows
(else its last line), joined with `` | ``; the whole is cut to ``limit`` characters.
"""
from __future__ import annotations

ERROR_WORDS = ("error", "failed", "fatal", "killed", "terminated", "interrupt", "no space")


def error_text(e: BaseException, limit: int = 300) -> str:
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    if not lines:
        return f"{type(e).__name__}"[:limit]
    text = lines[0]
    rest = lines[1:]
    if text.endswith(":") and rest:
        named = [x for x in rest if any(w in x.lower() for w in ERROR_WORDS)]
        text += " " + " | ".join(named[-3:] if named else rest[-1:])
    return f"{type(e).__name__}: {text}"[:limit]
