"""A *job*: what a process away from the driver needs to run one case's backends, the same for
an ``--isolate`` child (``execute.isolate``) and a Dask worker (``execute.case_task``).

It carries the scenario's text and ``--set`` overrides (the process rebuilds the scenario and,
from its seed, the batch, so its inputs equal an in-process run's), the run options, the
``--backend-file`` plugins (as paths on this machine for a child, as their sources for a
worker on another machine), and per case the case id and the backends still to run. It
travels as JSON (``to_json``/``from_json``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from attnbench import __version__
from attnbench.store.options import RunOptions, options_from_json, options_to_json


@dataclass
class Job:
    scenario_text: str
    scenario_path: str
    overrides: list[str]
    options: RunOptions
    backend_files: list[str] = field(default_factory=list)  # plugin paths this machine loads (a child)
    plugins: list[dict] = field(default_factory=list)  # plugin sources that travel (a Dask worker)
    case_id: Optional[str] = None  # the case (None: a job for every case, before one is picked)
    backends: list[str] = field(default_factory=list)  # its backends still to run
    topic: str = ""  # a Dask task's event topic
    attnbench: str = __version__  # the driver's version

    def for_case(self, case_id: str, backends: list[str], options: Optional[RunOptions] = None, **more: Any) -> "Job":
        """This job narrowed to one case and its backends still to run, with a copy of
        ``options`` (default: the job's) as they are now."""
        opts = options_from_json(options_to_json(options or self.options))
        return dataclasses.replace(self, case_id=case_id, backends=list(backends), options=opts, **more)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["options"] = options_to_json(self.options)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Job":
        d = dict(d)
        d["options"] = options_from_json(d.get("options"))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def runner(self, on_step=None, load_plugin=None):
        """The runner of this job's scenario and options (its backends, when it names them):
        ``backend_files`` loaded here, ``plugins`` through ``load_plugin``; ``on_step``: the step observer."""
        from attnbench.backend.files import load_backend_file
        from attnbench.execute.runner import Runner
        from attnbench.workload.scenario import load_text

        for f in self.backend_files:
            load_backend_file(f)
        if self.plugins and load_plugin is not None:
            load_plugin(self.plugins)
        sf = load_text(self.scenario_text, self.scenario_path, self.overrides)
        opts = options_from_json(options_to_json(self.options))
        if self.backends:
            opts = dataclasses.replace(opts, backends=list(self.backends))
        return Runner(sf, opts, on_step=on_step)

    def case(self, runner):
        """The case this job names, from ``runner``'s scenario."""
        return next(c for c in runner.sf.cases if c.case_id == self.case_id)
