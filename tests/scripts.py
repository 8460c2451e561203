"""The project's scripts (scripts/dev, scripts/gpu: files, not a package) as modules, for the tests."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(rel: str, name: str | None = None, register: bool = False) -> ModuleType:
    """``ROOT / rel`` executed as a fresh module named ``name`` (default: the file's stem). ``register``:
    put it in ``sys.modules`` before it runs (dataclasses defined in it look their module up there)."""
    spec = importlib.util.spec_from_file_location(name or Path(rel).stem, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod

