"""``--backend-file FILE``: import a user's Python file (this RUNS its code) and register the
Backend subclasses it defines. The same file named twice is imported once; a name that another
file already registered is an error naming both (rows of two backends of one name could not
be told apart), and so is a built-in's name: a class named (or inheriting the name of) a built-in
would replace it and pair with its rows."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from attnbench.backend.contract import Backend
from attnbench.backend.registry import BUILTIN, UnknownBackend, get_backend_class, register

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
             if isinstance(obj, type) and issubclass(obj, Backend) and obj is not Backend and getattr(obj, "name", None)
             and not _is_builtin(obj)]  # a built-in class the file imported (to subclass it) is not the file's
    for obj in found:
        if obj.name in BUILTIN:
            raise UnknownBackend(f"--backend-file {path}: class {obj.__name__} {_how_named(obj)}, a built-in backend's "
                                 "name; built-in names are reserved for the built-ins (rows of both would be paired as "
                                 f"one backend): give the class a name of its own, e.g. name = \"my-{obj.name}\"")
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


def _is_builtin(cls: type) -> bool:
    """``cls`` is the built-in backend class of its name itself (not a subclass of it)."""
    return BUILTIN.get(cls.name) == f"{cls.__module__}:{cls.__qualname__}"


def _how_named(cls: type) -> str:
    """``is named 'sdpa'``, or ``inherits the name 'sdpa' from SdpaBackend`` (no name of its own)."""
    if "name" in vars(cls):
        return f"is named {cls.name!r}"
    base = next((b for b in cls.__mro__[1:] if "name" in vars(b)), None)
    return f"inherits the name {cls.name!r} from {base.__name__ if base else '?'} (it sets no name of its own)"


def _registered(name: str):
    """The class registered under ``name`` now (None: none)."""
    try:
        return get_backend_class(name)
    except Exception:  # noqa: BLE001 - unknown, or an entry point that does not load
        return None
