"""What a run is made of, apart from running it: which backends it measures (resolved once),
the rows ``-k`` picks, and the row of a (case, backend) before anything ran (the runner fills it in; an executor whose worker died
writes its error there)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from attnbench.backend import registry
from attnbench.backend.options import backend_word
from attnbench.execute.options import RunOptions
from attnbench.store.row_parts import RowIdentity, RowWorkload
from attnbench.store.rows import Row
from attnbench.workload.spec import describe
from attnbench.workload.scenario import Case, ScenarioFile
from attnbench.workload.select import parse_selector


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
    """The backends a run measures, as their canonical texts (``resolved_backends``)."""
    return list(resolved_backends(sf, opts, available, device_type))


def resolved_backends(sf: ScenarioFile, opts: RunOptions, available: Optional[list[str]] = None,
                      device_type: Optional[str] = None) -> dict[str, "registry.ResolvedSpec"]:
    """The backends a run measures: ``-b``, else the scenario's list, else every backend
    available (``available``, or the ones available on this machine for ``device_type``); each
    spec resolved once (its options validated against the backend's declaration), keyed by its
    canonical text, the rows' ``backend``. The runner records each spec's option values in its
    options (``with_specs``; the manifest records them); options that hold them already (a
    ``--resume``, a child, a worker) give those specs back, whatever this process's environment says."""
    if opts.backend_specs:
        return {c: registry.resolve_values(c, v) for c, v in opts.backend_specs.items()}
    from_file = not opts.backends and bool(sf.scenario.backends)
    names = opts.backends or sf.scenario.backends or (default_backends(device_type) if available is None else available)
    out: dict[str, registry.ResolvedSpec] = {}
    for i, n in enumerate(names):
        try:
            rs = registry.resolve_spec(n)
        except registry.UnknownBackend as e:
            raise registry.UnknownBackend(f"{sf.path}: backends.{i}: {e}" if from_file else str(e)) from None
        out.setdefault(rs.canonical, rs)
    return out


def with_specs(opts: RunOptions, specs: dict[str, "registry.ResolvedSpec"]) -> RunOptions:
    """``opts`` holding the option values of ``specs`` (``resolved_backends``): what a runner keeps,
    the manifest records and a resume, a child or a worker makes its backends from."""
    return replace(opts, backend_specs={c: dict(rs.values) for c, rs in specs.items()})


def case_base_row(scenario: str, case: Case, name: str, device: str = "", device_id: str = "") -> Row:
    """A case's row for one backend before anything ran: what the case is, on which device."""
    spec = case.scenario.batch_spec()
    return Row(
        id=RowIdentity(scenario=scenario, case_id=case.case_id, backend=name, device=device, device_id=device_id),
        workload=RowWorkload(dtype=spec.dtype, page_size=spec.page_size, layout=spec.layout, batch=describe(spec),
                             num_requests=len(spec.requests), num_tokens=spec.num_tokens, params=dict(case.params)),
    )


def select_rows(text: Optional[str]) -> Callable[..., bool]:
    """``-k``'s test ``(case_id, backend, params) -> bool`` (every row without ``text``): a word
    with a colon is a backend spec resolved as ``-b`` resolves it (``registry.user_backend_id``)
    and compared by value. SelectError (a ValueError) for a malformed expression."""
    if not text:
        return lambda *_row: True
    return parse_selector(text, backend_word(registry.user_backend_id))
