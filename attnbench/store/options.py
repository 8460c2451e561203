"""The options of a run (what the command line adds to a scenario), and their JSON form
in the manifest (``store.manifest``), which ``--resume`` and ``--isolate`` children read back."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from attnbench.workload.timing_spec import override_problem


@dataclass(frozen=True)
class RunOptions:
    """Built once (from the flags, a manifest or a job) and never changed: a value derived later
    (the backends' resolved specs, the run folder) makes new options (``dataclasses.replace``),
    so a runner, an ``--isolate`` child's job and the manifest never see one another's changes."""

    backends: Optional[list[str]] = None  # None: the scenario's list, else every available one
    device: Optional[str] = None  # overrides the scenario's device
    warm_l2: bool = False
    no_graphs: bool = False
    timing_overrides: dict = field(default_factory=dict)  # fields of TimingConfig: warmup_ms, measure_ms, flush
    profile_dir: Optional[Path] = None  # set: one torch.profiler pass per row, traces here
    save_tensors: Optional[Path] = None
    rtol: Optional[float] = None
    measure_ceilings: bool = True
    threads: Optional[int] = None  # CPU rows: intra-op threads while backends run (None: 1)
    select: Optional[str] = None  # a -k expression over "case_id backend" (workload.select)
    run: Optional[str] = None  # the run folder: --save-tensors merges only files this run wrote
    # each backend's canonical spec -> every option's value, resolved once when the run began
    # (environment variables included): a --resume, an --isolate child or a Dask worker makes
    # exactly these backends, whatever its own environment says (None: not resolved yet)
    backend_specs: Optional[dict[str, dict[str, str]]] = None


def options_to_json(opts) -> dict:
    d = dataclasses.asdict(opts)
    if d.get("backend_specs") is None:  # absent, as in manifests written before it was (their settings_sha256 holds)
        d.pop("backend_specs", None)
    for k in ("profile_dir", "save_tensors"):
        if d.get(k) is not None:
            d[k] = str(d[k])
    return d


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# what each recorded option may hold (a hand-edited manifest is checked before it is used)
_ACCEPTS = {
    "backends": (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)), "a list of names or null"),
    "device": (lambda v: v is None or isinstance(v, str), "a device name or null"),
    "warm_l2": (lambda v: isinstance(v, bool), "true or false"),
    "no_graphs": (lambda v: isinstance(v, bool), "true or false"),
    "timing_overrides": (lambda v: isinstance(v, dict) and not any(override_problem(k, x) for k, x in v.items()),
                         "a mapping of timing settings to their values (warmup_ms: 25, flush: read, ...)"),
    "profile_dir": (lambda v: v is None or isinstance(v, str), "a path or null"),
    "save_tensors": (lambda v: v is None or isinstance(v, str), "a path or null"),
    "rtol": (lambda v: v is None or (_num(v) and math.isfinite(v) and 0 < v <= 1), "a number > 0 and <= 1, or null"),
    "measure_ceilings": (lambda v: isinstance(v, bool), "true or false"),
    "threads": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 4096),
                "an integer from 1 to 4096, or null"),
    "select": (lambda v: v is None or isinstance(v, str), "a -k expression or null"),
    "run": (lambda v: v is None or isinstance(v, str), "a run folder path or null"),
    "backend_specs": (lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(o, dict) and all(isinstance(x, str) and isinstance(y, str) for x, y in o.items())
        for k, o in v.items())), "a mapping of backend specs to their option values, or null"),
}


def options_from_json(d: dict):
    """RunOptions from a manifest's ``options``; ValueError naming the field that has the wrong type."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ValueError(f"options: a {type(d).__name__}, not a mapping")
    names = {f.name for f in dataclasses.fields(RunOptions)}
    kw = {k: v for k, v in d.items() if k in names}
    for k, v in kw.items():
        ok, what = _ACCEPTS.get(k, (lambda v: True, ""))
        if not ok(v):
            raise ValueError(f"options.{k}: {str(v)[:40]!r} is not {what}")
    for k in ("profile_dir", "save_tensors"):
        if kw.get(k) is not None:
            kw[k] = Path(kw[k])
    return RunOptions(**kw)
