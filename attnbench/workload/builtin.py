"""The scenarios shipped inside the package (``attnbench/scenarios/``), by name.

A built-in scenario is named by its path below that folder without ``.yaml``:
``quickstart``, ``gpu/odd-pages``. A command that takes a scenario takes a file path or such
a name; an existing file always wins, so a local ``quickstart.yaml`` is never shadowed.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


def builtin_names() -> list[str]:
    """Every shipped scenario's name, sorted (top-level ones first)."""
    if not SCENARIO_DIR.is_dir():
        return []
    names = [p.relative_to(SCENARIO_DIR).with_suffix("").as_posix() for p in SCENARIO_DIR.rglob("*.yaml")]
    return sorted(names, key=lambda n: (n.count("/"), n))


def builtin_path(name: str) -> Optional[Path]:
    """The file of built-in scenario ``name`` (``.yaml`` optional), or None."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if stem in builtin_names():
        return SCENARIO_DIR / f"{stem}.yaml"
    return None


def resolve(path_or_name: str | Path) -> Optional[Path]:
    """An existing file as given, else the built-in scenario of that name, else None."""
    p = Path(path_or_name)
    if p.is_file():
        return p
    return builtin_path(str(path_or_name))


_DESCRIPTION = re.compile(r"^description:\s*(.*)$", re.M)


def describe(name: str) -> str:
    """The ``description:`` line of a built-in scenario, read without parsing the YAML (fast)."""
    path = builtin_path(name)
    if path is None:
        return ""
    m = _DESCRIPTION.search(path.read_text())
    return m.group(1).strip().strip("'\"") if m else ""
