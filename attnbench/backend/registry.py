"""The registry: backend names to classes (the built-in table, the ``attnbench.backends``
entry-point group, classes registered from Python or ``--backend-file``), and a user's spec
``NAME[:key=value,...]`` resolved against the class's declared options."""
from __future__ import annotations

import importlib
import importlib.metadata as md
from typing import Any

from attnbench.backend.builtin import BUILTIN, BUILTIN_FACTS, BUILTIN_INFO, BuiltinInfo  # noqa: F401 - read as registry.*
from attnbench.backend.contract import Backend
from attnbench.backend.options import BackendId, OptionError, ResolvedSpec, backend_name, parse_spec, resolve, suggest


class UnknownBackend(ValueError):
    """A backend name or spec no backend has (or an option it does not declare): exit 2."""


_EXTRA: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Register a backend class (used by ``--backend-file`` modules and tests)."""
    _EXTRA[cls.name] = cls
    return cls


def _entry_points() -> dict[str, Any]:
    try:
        return {ep.name: ep for ep in md.entry_points(group="attnbench.backends")}
    except Exception:  # a broken third-party distribution must not break the tool
        return {}


def loaded_names() -> list[str]:
    """Backends registered from Python (``--backend-file``, tests): their classes are at hand."""
    return list(_EXTRA)


def all_names() -> list[str]:
    names = list(BUILTIN)
    names += [n for n in _entry_points() if n not in names]
    names += [n for n in _EXTRA if n not in names]
    return names


def get_backend_class(name: str) -> type[Backend]:
    """The class of a registered name, or of a spec ``name:key=value`` (options ignored here)."""
    name = backend_name(name)
    if name in _EXTRA:
        return _EXTRA[name]
    if name in BUILTIN:
        module, cls = BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), cls)
    eps = _entry_points()
    if name in eps:
        return eps[name].load()
    raise unknown_backend(name)


def unknown_backend(name: str) -> UnknownBackend:
    """The error for a name no backend has: what it may have meant, and every valid name."""
    names = all_names()
    guesses = suggest(backend_name(name), names)
    hint = f"; did you mean {' or '.join(repr(g) for g in guesses)}?" if guesses else ""
    return UnknownBackend(f"unknown backend {name!r}{hint} (valid names: {', '.join(names)})")


def resolve_spec(spec: str) -> ResolvedSpec:
    """Validate a spec ``NAME[:key=value,...]`` against its backend's declared options
    (UnknownBackend naming the backend, the key and the allowed values otherwise)."""
    try:
        name, given = parse_spec(spec)
    except OptionError as e:
        raise UnknownBackend(str(e)) from None
    cls = get_backend_class(name)
    try:
        return resolve(name, given, dict(getattr(cls, "options", {}) or {}))
    except OptionError as e:
        raise UnknownBackend(str(e)) from None


def user_backend_id(text: str) -> BackendId:
    """What a user's backend text (``-b``, ``--baseline``, ``--normalize-by``, a ``-k`` word with a
    colon) names: a registered backend's spec resolved (``flex:mask=blocks`` is ``flex``, its
    default), an unregistered one (rows of another machine's backend) read by its syntax."""
    if backend_name(text) in all_names():
        return resolve_spec(text).id
    try:
        return BackendId.from_text(text)
    except OptionError as e:
        raise UnknownBackend(str(e)) from None


def resolve_values(spec: str, values: dict[str, str]) -> ResolvedSpec:
    """The spec with every option's value as recorded when its run began (the manifest's
    ``backend_specs``): the environment of this process changes nothing."""
    name = backend_name(spec)
    try:
        return resolve(name, dict(values), dict(getattr(get_backend_class(name), "options", {}) or {}))
    except OptionError as e:
        raise UnknownBackend(str(e)) from None


def canonical_spec(spec: str) -> str:
    """The identity string of a spec: the name plus the options that differ from the declared
    defaults (environment included), sorted: ``flashinfer:route=fa3``, or ``flashinfer``."""
    return resolve_spec(spec).canonical


def make_backend(spec: "str | ResolvedSpec") -> Backend:
    """An instance of the spec's backend with its options set (a spec resolved before, e.g. from
    the run's recorded values by ``resolve_values``: as is)."""
    rs = spec if isinstance(spec, ResolvedSpec) else resolve_spec(spec)
    be = get_backend_class(rs.name)()
    be.__dict__["_option_values"] = dict(rs.values)
    return be
