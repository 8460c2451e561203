"""What a run is made of, apart from running it: which backends it measures, and the row of
a (case, backend) before anything ran (the runner fills it in; an executor whose worker died
writes its error there)."""
from __future__ import annotations

from typing import Optional

from attnbench import backend as registry
from attnbench.execute.options import RunOptions
from attnbench.store.rows import Row
from attnbench.workload.spec import describe
from attnbench.workload.scenario import Case, ScenarioFile


def default_backends(device_type: Optional[str] = None) -> list[str]:
    """Every registered backend that is available on this machine (and, given a device type,
    can run some case there: not triton on a CPU without its interpreter; -b still runs it)."""
    names = []
    for n in registry.all_names():
        try:
            cls = registry.get_backend_class(n)
            if cls.unavailable() is None and (device_type is None or cls.device_reason(device_type) is None):
                names.append(n)
        except Exception:
            continue
    return names


def backend_names_for(sf: ScenarioFile, opts: RunOptions, available: Optional[list[str]] = None,
                      device_type: Optional[str] = None) -> list[str]:
    """The backends a run measures: ``-b``, else the scenario's list, else every backend
    available (``available``, or the ones available on this machine for ``device_type``), as
    canonical specs. Resolved once: each spec's option values go to ``opts.backend_specs``
    (the manifest records them); options that hold them already (a ``--resume``, a child, a
    worker) give their specs back unchanged, whatever this process's environment says."""
    if opts.backend_specs:
        return list(opts.backend_specs)
    from_file = not opts.backends and bool(sf.scenario.backends)
    names = opts.backends or sf.scenario.backends or (default_backends(device_type) if available is None else available)
    specs: dict[str, dict[str, str]] = {}
    for i, n in enumerate(names):
        try:  # each spec as its canonical identity (its options validated against the backend's declaration)
            rs = registry.resolve_spec(n)
        except registry.UnknownBackend as e:
            raise registry.UnknownBackend(f"{sf.path}: backends.{i}: {e}" if from_file else str(e)) from None
        specs.setdefault(rs.canonical, dict(rs.values))
    opts.backend_specs = specs
    return list(specs)


def case_base_row(scenario: str, case: Case, name: str, device: str = "", device_id: str = "") -> Row:
    """A case's row for one backend before anything ran: what the case is, on which device."""
    spec = case.scenario.batch_spec()
    return Row(
        scenario=scenario,
        case_id=case.case_id,
        backend=name,
        device=device,
        device_id=device_id,
        dtype=spec.dtype,
        page_size=spec.page_size,
        layout=spec.layout,
        batch=describe(spec),
        num_requests=len(spec.requests),
        num_tokens=spec.num_tokens,
        params=dict(case.params),
    )
