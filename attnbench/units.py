"""Integers with size suffixes, as scenario files and ``--set`` write them: ``4k`` = 4096."""
from __future__ import annotations

import re
from typing import Any

_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_RE = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")


def parse_int(value: Any) -> int:
    """``4096``, ``"4096"``, ``"4k"``, ``"1m"`` -> int. Raises ValueError with a hint otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected an integer such as 4096 or 4k, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _RE.match(value)
        if m:
            return int(m.group(1)) * _SUFFIX[m.group(2).lower()]
    raise ValueError(f"expected an integer such as 4096 or 4k, got {value!r}")


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
