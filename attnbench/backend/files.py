"""``--backend-file FILE``: import a user's Python file (this RUNS its code) and register the
Backend subclasses it defines. The same file named twice is imported once; a name that another
file already registered is an error naming both (rows of two backends of one name could not
be told apart)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from attnbench.backend.contract import Backend
from attnbench.backend.registry import UnknownBackend, get_backend_class, register

_FILES: dict[str, list[str]] = {}  # resolved --backend-file path -> the names it registered
_SOURCE: dict[str, str] = {}  # backend name -> the --backend-file that registered it


def begin_command() -> None:
    """A new command starts: names registered by an earlier command's files in this process
    (tests drive several commands in one process) no longer clash with this command's files.
    Within one command a name registered by two files stays an error."""
    _SOURCE.clear()
    _FILES.clear()


def load_backend_file(path: str | Path) -> list[str]:
    """Import a user's Python file (this RUNS its code) and register its Backend subclasses.
    The same file named twice is imported once; a name that another file already
    registered (with another class) is an ``UnknownBackend`` error naming both files."""
    path = Path(path)
    key = str(path.resolve())
    if key in _FILES and all(_SOURCE.get(n) == key and _registered(n) is not None for n in _FILES[key]):
        return list(_FILES[key])  # imported already, and still registered
    spec = importlib.util.spec_from_file_location(f"attnbench_user_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UnknownBackend(f"--backend-file {path}: not a Python file that can be imported")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found = [obj for obj in vars(mod).values()
             if isinstance(obj, type) and issubclass(obj, Backend) and obj is not Backend and getattr(obj, "name", None)]
    for obj in found:
        other = _SOURCE.get(obj.name)
        if other is not None and other != key and _registered(obj.name) not in (None, obj):
            raise UnknownBackend(f"--backend-file {path}: backend {obj.name!r} is already registered by --backend-file "
                                 f"{other}; rename one of them (two backends of one name cannot be told apart in rows)")
    for obj in found:
        register(obj)
        _SOURCE[obj.name] = key
    names = [obj.name for obj in found]
    if not names:
        raise UnknownBackend(f"--backend-file {path}: defines no Backend subclass with a `name`")
    _FILES[key] = names
    return names


def _registered(name: str):
    """The class registered under ``name`` now (None: none)."""
    try:
        return get_backend_class(name)
    except Exception:  # noqa: BLE001 - unknown, or an entry point that does not load
        return None
