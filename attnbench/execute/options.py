"""The options of a run (what the command line adds to a scenario), and their JSON form
in the manifest, which ``--resume`` and ``--isolate`` children read back."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class RunOptions:
    backends: Optional[list[str]] = None  # None: the scenario's list, else every available one
    device: Optional[str] = None  # overrides the scenario's device
    warm_l2: bool = False
    no_graphs: bool = False
    timing_overrides: dict = field(default_factory=dict)  # warmup_ms, measure_ms, ...
    profile_dir: Optional[Path] = None  # set: one torch.profiler pass per row, traces here
    save_tensors: Optional[Path] = None
    rtol: Optional[float] = None
    measure_ceilings: bool = True
    threads: Optional[int] = None  # CPU rows: intra-op threads while backends run (None: 1)


def options_to_json(opts) -> dict:
    d = dataclasses.asdict(opts)
    for k in ("profile_dir", "save_tensors"):
        if d.get(k) is not None:
            d[k] = str(d[k])
    return d


def options_from_json(d: dict):
    names = {f.name for f in dataclasses.fields(RunOptions)}
    kw = {k: v for k, v in (d or {}).items() if k in names}
    for k in ("profile_dir", "save_tensors"):
        if kw.get(k) is not None:
            kw[k] = Path(kw[k])
    return RunOptions(**kw)
