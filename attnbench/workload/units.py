"""Integers with size suffixes, as scenario files and ``--set`` write them: ``4k`` = 4096."""
from __future__ import annotations

import re
from typing import Any

_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_RE = re.compile(r"^\s*([0-9]{1,15})\s*([kKmM]?)\s*$")  # ASCII digits; 15 is plenty


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr`` for messages: one line, at most ``limit`` characters, safe on deep nesting."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlist, r.maxdict = 3, limit, limit, 6, 4
    try:
        text = r.repr(value)
    except Exception:  # a hostile __repr__ or a pathological object
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_int(value: Any) -> int:
    """``4096``, ``"4096"``, ``"4k"``, ``"1m"`` -> int. Raises ValueError with a hint otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected an integer such as 4096 or 4k, got {short_repr(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _RE.match(value)
        if m:
            return int(m.group(1)) * _SUFFIX[m.group(2).lower()]
    raise ValueError(f"expected an integer such as 4096 or 4k, got {short_repr(value)}")


def format_int(n: int) -> str:
    """Inverse of :func:`parse_int` for display: 4096 -> ``4k``; 1000 stays ``1000``."""
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}m"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def format_bytes(n: float) -> str:
    """Bytes for messages: ``512 B``, ``3.2 KiB``, ``1.5 GiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def safe_name(text: str, limit: int = 80) -> str:
    """A file-name-safe slug that cannot leave its folder (no separators, no '..')."""
    s = re.sub(r"[^A-Za-z0-9._=,+-]+", "-", text).strip(".-")
    s = s.replace("..", ".")
    return (s or "unnamed")[:limit]


def unique_file_stem(text: str, limit: int = 120) -> str:
    """A file-name stem that differs for different ``text``s: ``text`` itself when it is
    already file-name-safe and at most ``limit`` characters, else its slug cut shorter plus 12
    hex digits of its SHA-256 (two case ids that differ only after the cut, or only in
    characters the slug replaces, never share a file)."""
    import hashlib

    if safe_name(text, limit) == text:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe_name(text, limit - 13)}-{digest}"
