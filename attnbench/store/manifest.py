"""The run manifest (``manifest.json``): what ran, where, when, with which options, complete
or not. One typed record, built by the command line, written by ``RunFolder``, read back by
``--resume``, ``compare``/``check``, baselines and the scripts.

Reading is tolerant (a hand-edited or older manifest still loads): a key with the wrong type
keeps its default and is named in ``problems`` (``"overrides: not a list of texts"``), so
that a reader who needs it (``--resume``) can refuse with that message while one who does
not (a table title) goes on. Keys this version does not know are kept in ``extra`` and
written back as they were.
"""
from __future__ import annotations

import dataclasses
import os
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from attnbench.store.options import RunOptions, options_from_json, options_to_json


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _texts(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _opt(check):
    return lambda v: v is None or check(v)


_STR = (_opt(lambda v: isinstance(v, str)), "a text or null")
# what each key may hold when read back: (check, what it should be)
_ACCEPTS = {
    "status": _STR, "start_time": _STR, "end_time": _STR, "command": _STR, "attnbench": _STR,
    "scenario": _STR, "scenario_path": _STR, "scenario_sha256": _STR, "scenario_text": _STR, "select": _STR,
    "overrides": (_texts, "a list of KEY=VALUE texts"),
    "seed": (_opt(_int), "an integer or null"),
    "cases": (_opt(_int), "an integer or null"),
    "rows_expected": (_opt(_int), "an integer or null"),
    "backends_requested": (_texts, "a list of names"),
    "environment": (lambda v: isinstance(v, dict), "an object"),
    "backend_files": (_texts, "a list of paths"),
    "backend_files_sha256": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and (x is None or isinstance(x, str))
                                                                     for k, x in v.items()), "a mapping of paths to SHA-256 texts"),
    "isolate": (lambda v: isinstance(v, bool), "true or false"),
    "timeout": (_opt(lambda v: _num(v) and math.isfinite(v) and 0 < v <= 7 * 24 * 3600),
                "a number of seconds > 0 (at most a week) or null"),
    "settings_sha256": _STR,
    "executor": (lambda v: isinstance(v, dict), "an object"),
    "resumed": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of objects"),
    "load": (lambda v: isinstance(v, dict), "an object"),
}


@dataclass
class Manifest:
    """A run folder's manifest. ``options`` is None for a folder written before options were
    recorded (``backends_requested`` then says what it asked for)."""

    status: Optional[str] = None  # "incomplete" while it runs, "complete" at the end
    start_time: Optional[str] = None
    end_time: Optional[str] = None
    command: Optional[str] = None  # the command line that made it
    attnbench: Optional[str] = None  # version
    scenario: Optional[str] = None  # name
    scenario_path: Optional[str] = None
    scenario_sha256: Optional[str] = None
    scenario_text: Optional[str] = None  # --resume loads the scenario from this copy
    overrides: list[str] = field(default_factory=list)  # --set KEY=VALUE
    seed: Optional[int] = None
    cases: Optional[int] = None
    backends_requested: list[str] = field(default_factory=list)
    select: Optional[str] = None  # -k: the run holds only the rows it picked
    rows_expected: Optional[int] = None
    environment: dict = field(default_factory=dict)  # python, torch, device, backend versions, ...
    options: Optional[RunOptions] = None
    backend_files: list[str] = field(default_factory=list)
    backend_files_sha256: dict = field(default_factory=dict)  # each backend file's bytes: --resume compares them
    isolate: bool = False
    timeout: Optional[float] = None  # with isolate: seconds a backend may run
    executor: dict = field(default_factory=dict)  # ExecutorSpec.to_json()
    resumed: list[dict] = field(default_factory=list)  # one entry per --resume
    # the machine's load average (os.getloadavg: 1, 5, 15 minutes) when the run started and when it
    # ended, and its cores: {"cores": 2, "start": [6.1, 4.0, 2.2], "end": [...]} (load_note reads it)
    load: dict = field(default_factory=dict)
    # covers what --resume takes from the manifest (scenario text, overrides, options, isolate,
    # timeout): a hand edit of any of them is refused, not half applied
    settings_sha256: Optional[str] = None
    extra: dict = field(default_factory=dict)  # keys this version does not know, kept as they were
    problems: list[str] = field(default_factory=list, compare=False)  # keys read back with a wrong type

    @property
    def device(self) -> str:
        """The device the run measured on ("" when not recorded)."""
        dev = self.environment.get("device")
        return dev if isinstance(dev, str) else ""

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def problem(self, key: str) -> Optional[str]:
        """What was wrong with ``key`` when read back (None: nothing)."""
        return next((p for p in self.problems if p.split(":", 1)[0].split(".", 1)[0] == key), None)

    def settings_hash(self) -> str:
        """SHA-256 of the settings ``--resume`` goes on with (``settings_sha256``)."""
        doc = {"scenario_text": self.scenario_text, "overrides": self.overrides, "isolate": self.isolate,
               "timeout": self.timeout, "options": options_to_json(self.options) if self.options is not None else None}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra", "problems")}
        d["options"] = options_to_json(self.options) if self.options is not None else None
        if self.options is None:
            del d["options"]  # absent, as in the folders written before options were recorded
        return {**d, **self.extra}

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        """A manifest from its JSON object (``{}`` or a non-object: an empty one); keys of the
        wrong type keep their defaults and are named in ``problems``."""
        man = cls()
        if not isinstance(d, dict):
            return man
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "problems"}
        for k, v in d.items():
            if k not in known:
                man.extra[k] = v
            elif k == "options":
                try:
                    man.options = options_from_json(v)
                except ValueError as e:
                    man.problems.append(str(e))
            else:
                ok, what = _ACCEPTS[k]
                if ok(v):
                    setattr(man, k, list(v) if isinstance(v, list) else v)
                else:
                    man.problems.append(f"{k}: {str(v)[:40]!r} is not {what}")
        return man

    def update(self, **fields) -> None:
        """Set known fields (unknown ones go to ``extra``)."""
        known = {f.name for f in dataclasses.fields(self)}
        for k, v in fields.items():
            if k in known:
                setattr(self, k, v)
            else:
                self.extra[k] = v


def load_now() -> Optional[list[float]]:
    """The load average (1, 5 and 15 minutes), None where the OS has none (Windows)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def record_load(manifest: Manifest, when: str) -> None:
    """Keep the load average ``when`` ("start" or "end") in ``manifest.load``, with the cores."""
    now = load_now()
    if now is not None:
        manifest.load = {**manifest.load, "cores": os.cpu_count() or 1, when: now}


def load_note(manifest: Manifest) -> str:
    """A line when the machine was busier than its cores at the start or the end of the run
    (1-minute load average above the core count): its times ran slower and scatter more; ""
    otherwise or when the run kept no load."""
    load, cores = manifest.load or {}, (manifest.load or {}).get("cores")
    seen = {w: load[w][0] for w in ("start", "end") if isinstance(load.get(w), list) and load[w]
            and isinstance(load[w][0], (int, float))}
    if not isinstance(cores, int) or not seen or max(seen.values()) <= cores:
        return ""
    at = " and ".join(f"{v:g} at its {w}" for w, v in seen.items())
    return (f"note: the machine was busy during this run: load average {at} (1 minute) on {cores} cores; "
            "its times are slower and scatter more than on an idle machine")
