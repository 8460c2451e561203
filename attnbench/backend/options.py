"""Backend options: knobs that change what a backend computes, declared on its class, given as
``NAME:key=value,key=value`` (``-b flashinfer:route=fa3``, or in a scenario's ``backends:``).

A backend declares ``options: ClassVar[dict[str, BackendOption]]``. The registry parses a spec
(:func:`parse_spec`), checks each key and value against the declaration (:func:`resolve`:
an unknown key or value is an :class:`OptionError` naming the backend, the key and what is
allowed) and gives the spec's canonical string: the name plus every option whose value differs
from its declared default, sorted by key (``flashinfer:route=fa3``; ``flashinfer`` when all are
defaults). An environment variable declared as an option's ``env`` sets the default the
instance sees, and is resolved once, when the spec is resolved: a value it changes shows in the
canonical string exactly as if it had been written after the colon. The canonical string is
the row's ``backend``, so tables, CSV, repro commands, manifests, ``compare runs`` and ``check``
tell rows apart by their options without knowing about them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class OptionError(ValueError):
    """A backend spec that does not parse or names an undeclared key or value (exit 2)."""


@dataclass(frozen=True)
class BackendOption:
    """One declared option. ``choices``: the allowed values (texts), or ``type`` (``int``,
    ``float``, ``bool``, ``str``) for a free value; ``env``: an environment variable that may
    set the default. Values are kept as their canonical texts (bools as ``on``/``off``)."""

    name: str
    default: Any
    choices: tuple[str, ...] = ()
    type: type = str
    env: Optional[str] = None
    help: str = ""

    def allowed(self) -> str:
        if self.choices:
            return "|".join(self.choices)
        return "on|off" if self.type is bool else f"a {self.type.__name__}"

    def parse(self, text: str) -> str:
        """The canonical text of ``text`` (ValueError with what is allowed, if it is not)."""
        raw = str(text).strip()
        if self.choices:
            if raw not in self.choices:
                raise ValueError(f"allowed: {self.allowed()}")
            return raw
        if self.type is bool:
            if raw.lower() in _TRUE:
                return "on"
            if raw.lower() in _FALSE:
                return "off"
            raise ValueError("allowed: on|off (or 1/0, true/false, yes/no)")
        try:
            value = str(self.type(raw)) if self.type is not str else raw
        except ValueError:
            raise ValueError(f"allowed: {self.allowed()}") from None
        if "," in value:  # the spec NAME:key=value,key=value could not be read back (rows, repro commands)
            raise ValueError(f"a value may not hold ',': it separates the options of a backend spec "
                             f"(NAME:key=value,key=value)")
        return value

    def declared_default(self) -> str:
        return self.parse("on" if self.default is True else "off" if self.default is False else str(self.default))


@dataclass(frozen=True)
class BackendId:
    """A row's backend identity: the name and the options that differ from the declared
    defaults, sorted by key. Hashable and compared by value; ``str()`` is the canonical text
    the rows carry (``flashinfer:route=fa3``, ``flex``)."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.name}:{','.join(f'{k}={v}' for k, v in self.options)}" if self.options else self.name

    @classmethod
    def from_text(cls, text: str) -> "BackendId":
        """The identity a canonical text (a row's ``backend``) spells, by syntax alone: for
        text read back from files, whose backend may not be registered here."""
        name, pairs = parse_spec(text)
        return cls(name, tuple(sorted(pairs.items())))


@dataclass(frozen=True)
class ResolvedSpec:
    """A backend spec after validation: ``values`` holds every declared option (defaults and
    environment included), ``id`` the identity of the rows (``canonical``: its text)."""

    name: str
    values: dict[str, str] = field(default_factory=dict)
    id: BackendId = BackendId("")

    @property
    def canonical(self) -> str:
        return str(self.id)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"name:key=value,key=value"`` -> ``(name, {key: value})``, syntax only."""
    if not isinstance(spec, str) or not spec.strip():
        raise OptionError(f"backend spec {spec!r}: empty (write NAME or NAME:key=value,...)")
    name, _, rest = spec.strip().partition(":")
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise OptionError(f"backend spec {spec!r}: {part!r} is not key=value (write {name}:key=value,key=value)")
        if key.strip() in pairs:
            raise OptionError(f"backend spec {spec!r}: option {key.strip()!r} given twice")
        pairs[key.strip()] = value.strip()
    return name.strip(), pairs


def backend_name(spec: str) -> str:
    """The registered name of a spec (what comes before the colon)."""
    return spec.partition(":")[0].strip() if isinstance(spec, str) else spec


def _env_default(name: str, opt: BackendOption) -> str:
    raw = os.environ.get(opt.env) if opt.env else None
    if raw is None or raw.strip() == "":
        return opt.declared_default()
    try:
        return opt.parse(raw)
    except ValueError as e:
        raise OptionError(f"backend {name!r}: environment variable {opt.env}={raw!r} (sets option {opt.name!r}): {e}") from None


def check_declared(name: str, options: dict[str, BackendOption]) -> None:
    """OptionError naming the backend and the option when a declaration cannot work: a default
    that is not among its own values (``choices``, or not of its ``type``), a choice holding a
    comma (a spec could not be read back)."""
    for key, opt in options.items():
        bad = [c for c in opt.choices if "," in c or not c.strip()]
        if bad:
            raise OptionError(f"backend {name!r}: option {key!r} declares the choice {bad[0]!r}; a choice must be "
                              "non-empty text without ',' (fix the backend's `options` declaration)")
        try:
            opt.declared_default()
        except ValueError as e:
            raise OptionError(f"backend {name!r}: option {key!r} declares the default {opt.default!r}, which is not "
                              f"one of its own values ({e}); fix the backend's `options` declaration") from None


def resolve(name: str, given: dict[str, str], options: dict[str, BackendOption]) -> ResolvedSpec:
    """Validate ``given`` against ``options`` (the class's declaration); defaults and declared
    environment variables fill the rest. The canonical string lists the values that differ from
    the declared defaults, sorted by key."""
    check_declared(name, options)
    unknown = sorted(set(given) - set(options))
    if unknown:
        keys = ", ".join(f"{k} ({o.allowed()})" for k, o in sorted(options.items())) or "none"
        raise OptionError(f"backend {name!r} has no option {unknown[0]!r} (its options: {keys})")
    values = {}
    for key, opt in options.items():
        if key in given:
            try:
                values[key] = opt.parse(given[key])
            except ValueError as e:
                raise OptionError(f"backend {name!r}: option {key}={given[key]!r} is not valid; {e}") from None
        else:
            values[key] = _env_default(name, opt)
    changed = tuple((k, values[k]) for k in sorted(values) if values[k] != options[k].declared_default())
    return ResolvedSpec(name, values, BackendId(name, changed))


def same_backend(want: BackendId, backend: str) -> bool:
    """A row's backend text is the identity ``want``, compared by value (option order aside)."""
    try:
        return BackendId.from_text(backend) == want
    except OptionError:  # not a spec at all: no identity
        return False


def pick_backend(want: BackendId, present: Iterable[str]) -> Optional[str]:
    """The one of ``present`` (rows' backend texts) that is ``want``; None when none is."""
    return next((b for b in present if same_backend(want, b)), None)


def backend_word(resolve: Callable[[str], BackendId]) -> Callable[[str], Callable]:
    """How a ``-k`` word holding ``:`` picks rows: ``resolve`` makes it an identity (as ``-b``
    would), and a row is picked when its backend is that identity."""
    def word(text: str) -> Callable:
        want = resolve(text)
        return lambda _s, _params, backend: same_backend(want, backend)
    return word


def suggest(name: str, names: list[str]) -> list[str]:
    """The registered names a typo most likely meant: the same letters in another case, the
    names it begins (``flash`` -> ``flash-attn``, ``flashinfer``), a close spelling
    (``spda`` -> ``sdpa``); [] when nothing is close."""
    import difflib

    if not isinstance(name, str) or not name:
        return []
    low = {n.lower(): n for n in names}
    key = name.lower().replace("_", "-")
    if key in low:
        return [low[key]]
    starts = [n for n in names if n.lower().startswith(key) or key.startswith(n.lower())]
    if starts:
        return starts
    return [low[c] for c in difflib.get_close_matches(key, list(low), n=2, cutoff=0.6)]


def describe_options(options: dict[str, BackendOption], name: str = "") -> list[str]:
    """One line per option: ``key=ALLOWED (default D; env VAR): help``, for listings; a
    declaration that cannot work is one line saying why."""
    try:
        check_declared(name, options)
    except OptionError as e:
        return [f"(unusable: {e})"]
    out = []
    for key, o in sorted(options.items()):
        env = f"; env {o.env}" if o.env else ""
        out.append(f"{key}={o.allowed()} (default {o.declared_default()}{env}): {o.help}".rstrip(": "))
    return out
