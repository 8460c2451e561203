"""Runs the cases of a scenario through the backends and produces result rows.

Per case: build the batch from the seed, compute the reference once, then per backend:
availability and capability reasons, plan, run, check against the reference, time plan and
run (the timed output is checked too), roofline, optional profile. Any exception of one
backend becomes that row's ``error``; the rows already finished are never lost.
"""
from __future__ import annotations

import copy
import gc
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Optional

import torch

from attnbench.backend import registry
from attnbench.execute.inputs import aliased_inputs, clone_batch, input_problem
from attnbench.execute.device import resolve_device
from attnbench.execute.cases import case_base_row, default_backends, resolved_backends, select_rows, with_specs  # noqa: F401
from attnbench.execute.output_check import check_output, same_device  # noqa: F401 - check_output: for callers too
from attnbench.execute.memory import available_bytes, split_by_memory
from attnbench.execute.options import RunOptions, SaveTensorsError
from attnbench.workload.batch import Batch, BatchSpec, materialize
from attnbench.measure.ceilings import ceilings_for, checked_roofline
from attnbench.measure.metrics import device_identity, device_name, work_of
from attnbench.workload.reference import batch_tolerance, reference_attention, route_tolerance
from attnbench.store.rows import Row, Status, checked, is_oracle
from attnbench.store.runfolder import environment
from attnbench.store.tensors import save_case_tensors
from attnbench.workload.scenario import Case, ScenarioFile
from attnbench.measure.stats import Summary
from attnbench.execute.row_build import kernel_timed, profile_part, roofline_part
from attnbench.execute import host_samples
from attnbench.execute.host_samples import HOST_BUDGET_MS, HostTimes
from attnbench.store.row_parts import RowRoofline
from attnbench.measure.checksum import checksum, count_differing
from attnbench.measure.graph_check import GraphCheck
from attnbench.measure.timing import TimingConfig, TimingResult, cpu_threads, time_run
from attnbench.measure.left_out import row_note
from attnbench.measure.poison import fresh_memory_marked, poison_allocator
from attnbench.execute.error_text import error_text as _error_text
from attnbench.execute.stops import backend_exit_reason

_memory_available = available_bytes  # a name of this module's: tests stand in for the machine here


def _release(device: torch.device) -> None:
    if device.type == "cuda":  # plans' memory back to the GPU; on a CPU refcounting did it (gc.collect: 40 ms a row)
        gc.collect()
        try:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        except RuntimeError:  # a context a backend faulted (a device-side assert): that row says so, and
            pass  # it must still be yielded (--isolate's child then restarts for the backends left)


class Runner:
    """The local executor. ``on_step(row, ended)``: told as each backend's step (prepare, a timing round,
    finish, the input check) starts and ends; a child or a Dask worker reports it (crashes are blamed right)."""

    def __init__(self, sf: ScenarioFile, opts: RunOptions, on_step: Optional[Callable[[Row, bool], None]] = None):
        self.sf = sf
        self.on_step = on_step or (lambda row, ended: None)  # the step observer
        self.notes: list[str] = []  # what the command line should tell the user (the executor protocol)
        self.device = resolve_device(opts.device or sf.scenario.device)
        self.device_name = device_name(self.device)
        self.device_id = device_identity(self.device)
        self.threads = opts.threads or 1
        self.specs = resolved_backends(sf, opts, device_type=self.device.type)  # -b parsed once, here
        self.opts = with_specs(opts, self.specs)  # what the manifest records, a child and a resume make them from
        self.backend_names = list(self.specs)
        self._saved: dict[str, frozenset] = {}  # cases whose --save-tensors file this runner wrote: their outputs
        self.picks = select_rows(opts.select)  # ValueError

    def writing_to(self, run: str, profile_dir=None) -> "Runner":
        """A copy whose options name the run folder it writes (``run``) and where profiles go."""
        new = copy.copy(self)
        new.opts = replace(self.opts, run=run, profile_dir=profile_dir)
        return new

    def backend_versions(self) -> dict[str, str]:
        out = {}
        for n in self.backend_names:
            try:
                cls = registry.get_backend_class(n)
                out[n] = cls.version() if cls.unavailable() is None else "unavailable"
            except Exception as e:
                out[n] = f"unavailable ({_error_text(e)})"
        return out

    def timing_config(self, case: Case) -> TimingConfig:
        cfg = case.scenario.timing.config()
        if self.opts.warm_l2:
            cfg.cold_l2 = False
        if self.opts.no_graphs:
            cfg.cuda_graphs = False
        cfg.cpu_clock = "thread" if self.threads == 1 else "wall"
        return replace(cfg, **self.opts.timing_overrides)

    def todo(self, case: Case, done: frozenset = frozenset()) -> list[str]:
        """The backends of ``case`` still to run: not in ``done`` and picked by ``-k``."""
        return [b for b in self.backend_names
                if (case.case_id, b) not in done and self.picks(case.case_id, b, case.params)]

    def rows(self, done: frozenset = frozenset()) -> Iterator[Row]:
        """Yields each row as soon as it is finished. ``done``: (case_id, backend) to skip."""
        gc.collect()
        gc.freeze()  # what is alive now (torch, the libraries) is never garbage: keep later collections cheap
        for case in self.sf.cases:
            todo = self.todo(case, done)
            if todo:
                yield from self.run_case(case, todo)

    def base_row(self, case: Case, spec: BatchSpec, name: str) -> Row:
        return case_base_row(self.sf.name, case, name, self.device_name, self.device_id)

    def environment(self) -> dict:
        """What the manifest records about this machine (python, torch, device, versions)."""
        from attnbench.measure.host import host_fingerprint

        return environment(self.device_name, self.backend_versions(), host_fingerprint(self.device))

    def run_case(self, case: Case, names: list[str]) -> Iterator[Row]:
        """The rows of one case for the backends ``names``, each through ``checked``."""
        for row in self._case_rows(case, names):
            yield checked(row)

    def close(self) -> None:
        """Nothing to let go of (the executor protocol: a Dask runner closes its cluster)."""

    def _case_rows(self, case: Case, names: list[str]) -> Iterator[Row]:
        sc = case.scenario
        spec = sc.batch_spec()
        cfg = self.timing_config(case)
        names, too_big = self._fitting(case, spec, names, all_live=cfg.rounds > 1)
        yield from too_big
        if not names:
            return
        try:  # under the rows' thread count: the float64 reference on 2 threads spin-waited (2x CPU)
            with cpu_threads(self.device, self.threads):
                batch = materialize(spec, sc.seed, self.device)
                ref = self._reference(batch if sc.check.reference == "reference" else clone_batch(batch),
                                      sc.check.reference)
        except Exception as e:  # the case itself cannot be built: every row says why
            _release(self.device)
            yield from self._all_rows(case, spec, names, Status.ERROR, f"building the batch or reference failed: {_error_text(e)}")
            return
        tol = self.opts.rtol or sc.check.rtol or batch_tolerance(batch)
        work = work_of(spec)
        ceil = self._ceilings(spec.dtype)
        outputs: dict[str, torch.Tensor] = {}
        rows = []
        for n in names:
            row = self.base_row(case, spec, n)
            row.correctness.tolerance = tol
            row.roofline = RowRoofline(flops=work.flops, bytes=work.bytes)
            row.timing.threads = self.threads if self.device.type == "cpu" else 0
            rows.append(row)
        with cpu_threads(self.device, self.threads):
            if cfg.rounds == 1:  # each row is finished (and yielded) before the next backend starts
                for row in rows:
                    own = clone_batch(batch)
                    live = self._guard(row, lambda: self._prepare(row, own, ref, tol, outputs, cfg))
                    if live is not None:
                        self._guard(row, lambda: self._measure(live, cfg))
                    if live is not None and row.status == "ok":  # a failed timing keeps its own reason
                        self._guard(row, lambda: self._finish(live, ref, tol, ceil, work))
                    self._guard(row, lambda: self._check_inputs(row, batch, own))
                    live = own = None  # the plan's memory goes before the next backend's
                    _release(self.device)
                    self._save_tensors(case, batch, outputs)  # before the row: a recorded row has its output on disk
                    yield row
            else:
                for row in self._run_in_rounds(rows, batch, ref, tol, cfg, ceil, work, outputs):
                    self._save_tensors(case, batch, outputs)
                    yield row
        batch = ref = outputs = None  # its tensors go before the next case (no del: the lambdas above read them)
        _release(self.device)

    def _save_tensors(self, case: Case, batch: Batch, outputs: dict) -> None:
        """--save-tensors: the case's file with every output so far (merged over what an
        earlier process saved for the case, the first time)."""
        if self.opts.save_tensors is None:
            return
        first = case.case_id not in self._saved
        if not first and self._saved[case.case_id] == frozenset(outputs):
            return  # a row without an output (skipped, error): the file already holds every output
        self._saved[case.case_id] = frozenset(outputs)
        try:
            save_case_tensors(self.opts.save_tensors, case.case_id, batch, outputs, merge=first, run=self.opts.run)
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            raise SaveTensorsError(f"--save-tensors {self.opts.save_tensors}: could not write the tensors of "
                                   f"case {case.case_id}: {_error_text(e)}") from None

    def _fitting(self, case: Case, spec: BatchSpec, names: list[str], all_live: bool) -> tuple[list[str], list[Row]]:
        """The backends whose share of memory fits (``memory.py``), and skipped rows for the others."""
        fits, too_big = split_by_memory(spec, names, _memory_available(self.device), self.device, all_live)
        skipped = [self.base_row(case, spec, n) for n, _ in too_big]
        for row, (_, why) in zip(skipped, too_big):
            row.status, row.reason = Status.SKIPPED, why
        return fits, skipped

    def _check_inputs(self, row: Row, pristine: Batch, own: Batch) -> None:
        """A backend that wrote into its inputs gets an error row; the others never saw its
        copy. A row that already failed keeps its own reason first (the error it raised is
        what to fix; issue 32), the input check's finding after it."""
        try:
            why = input_problem(pristine, own)
        except Exception as e:  # a device fault surfacing here belongs to this backend
            why = f"checking its inputs failed: {_error_text(e)}"
        if why:
            failed = row.reason and row.status is not Status.OK
            row.reason = f"{row.reason}; after that, the input check: {why}" if failed else why
            row.status = Status.ERROR

    def _all_rows(self, case: Case, spec: BatchSpec, names: list[str], status: Status, reason: str) -> Iterator[Row]:
        """One row per backend with the same status and reason (a case that cannot run)."""
        for n in names:
            row = self.base_row(case, spec, n)
            row.status, row.reason = status, reason
            yield row

    def _ceilings(self, dtype: str):
        if not self.opts.measure_ceilings:
            return None
        try:
            with cpu_threads(self.device, self.threads):  # a CPU's ceilings at the rows' thread count
                return ceilings_for(self.device, dtype, threads=self.threads)
        except Exception:
            return None  # no roofline columns, the row stands

    def _reference(self, batch: Batch, oracle: str) -> torch.Tensor:
        if oracle == "reference":
            return reference_attention(batch)[0]
        be = registry.make_backend(oracle)
        return be.run(be.prepare(batch)).float()

    def _guard(self, row: Row, step):
        """Run one step of a row; an exception becomes the row's ``error`` (and None)."""
        self.on_step(row, ended=False)
        result = None
        try:
            result = step()
        except torch.cuda.OutOfMemoryError as e:
            row.status, row.reason = Status.ERROR, f"out of memory: {_error_text(e)[:200]}"
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # the last two: a backend's own exit (a stop re-raises)
            row.status, row.reason = Status.ERROR, _error_text(e) if isinstance(e, Exception) else backend_exit_reason(e)
        self.on_step(row, ended=True)
        return result

    def _run_in_rounds(self, rows, batch, ref, tol, cfg, ceil, work, outputs) -> Iterator[Row]:
        """Every backend is planned and checked first (a row that ends there, skipped or
        failed, comes out at once: a later backend that kills the process cannot take it
        along); then the budgets are split into ``cfg.rounds`` rounds taken in turn, so that
        all backends of the case sample the same stretches of time. The timed rows come out
        together at the end of the case."""
        owns = [clone_batch(batch) for _ in rows]
        lives = []
        for row, own in zip(rows, owns):
            live = self._guard(row, lambda: self._prepare(row, own, ref, tol, outputs, cfg))
            if live is None:
                self._guard(row, lambda: self._check_inputs(row, batch, own))
                yield row
            else:
                lives.append((row, live, own))
        per_round = replace(
            cfg,
            warmup_ms=cfg.warmup_ms / cfg.rounds,
            measure_ms=cfg.measure_ms / cfg.rounds,
            min_runs=None if cfg.min_runs is None else -(-cfg.min_runs // cfg.rounds),
            max_runs=-(-cfg.max_runs // cfg.rounds),
        )
        for _ in range(cfg.rounds):
            for row, live, _own in lives:
                if row.status is Status.OK:
                    self._guard(row, lambda: self._measure(live, per_round))
        for row, live, own in lives:
            if row.status is Status.OK:
                self._guard(row, lambda: self._finish(live, ref, tol, ceil, work))
            self._guard(row, lambda: self._check_inputs(row, batch, own))
        done = [row for row, _, _ in lives]
        lives = live = owns = own = None  # the plans' memory goes before the next case
        _release(self.device)
        yield from done

    def _prepare(self, row: Row, batch: Batch, ref, tol, outputs, cfg: TimingConfig) -> Optional["_Live"]:
        """Availability, capability, plan, the checked first run, plan timing. Returns what
        timing needs, or None when the row is already finished (skipped or mismatch)."""
        spec = self.specs[row.id.backend]  # resolved when the run began, never parsed again
        cls = registry.get_backend_class(spec.name)
        be = registry.make_backend(spec)
        why = be.why_unavailable()
        row.id.backend_version = "" if why else cls.version()
        if why:
            row.status, row.reason = Status.SKIPPED, why
            return
        reasons = be.reasons(batch)
        if reasons:
            row.status, row.reason = Status.SKIPPED, "; ".join(reasons)
            return
        converted = be.convert(batch)
        plan = be.plan(converted)
        mode = getattr(plan, "mode", "")  # a plain tensor as the plan has a mode() method: no route
        row.id.mode = mode if isinstance(mode, str) else ""
        tol, why = route_tolerance(plan, row.correctness.tolerance, batch.dtype, explicit=self.opts.rtol is not None)
        row.correctness.tolerance, row.id.mode = tol, f"{row.id.mode} ({why})".strip() if why else row.id.mode
        poison_allocator(batch.out_shape, batch.out_dtype, batch.device)  # "never written" shows as poison
        with fresh_memory_marked(batch.device):
            out = be.run(plan)
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
        status, reason, row.correctness.rel_err, row.correctness.max_abs_err = check_output(out, ref, batch, tol)
        aliased = aliased_inputs(out, batch)
        if aliased:
            row.status, row.reason = Status.ERROR, f"its output aliases its inputs ({', '.join(aliased)})"
            return
        if self.opts.save_tensors is not None and isinstance(out, torch.Tensor) and same_device(out.device, batch.device):
            outputs[row.id.backend] = out.detach().cpu()
        if status is not Status.OK:
            row.status, row.reason = status, reason
            return
        good = checksum(out)
        del out
        # convert (what the library cannot read natively) and plan (the engine's step) apart, in one window
        # now (or, with host_samples.SPREAD_ROUNDS, half now and the rest over the rounds); within the row's budget
        rounds = cfg.rounds if host_samples.SPREAD_ROUNDS else 0
        host = HostTimes(be, batch, converted, min(HOST_BUDGET_MS, cfg.measure_ms), rounds)
        host.first()
        row.timing = host.timed(row.timing)
        check = GraphCheck(plan, max(4 * batch.q.numel(), 1 << 22), tol) if batch.device.type == "cuda" else None
        return _Live(row, be, plan, batch, getattr(plan, "capturable", cls.capturable), good_sum=good, graph_check=check,
                     host=host)

    def _measure(self, live: "_Live", cfg: TimingConfig) -> None:
        """One timing pass (a round); its samples add to the row's."""
        check = live.graph_check if not live.graph_checked else None  # once per row
        if live.last is not None and live.last.method == "cpu-process":  # its threads worked: every round alike
            cfg = replace(cfg, cpu_clock="process")
        live.last = time_run(lambda: live.be.run(live.plan), live.batch.device, cfg, live.capturable, check)
        live.graph_checked = live.graph_checked or live.last.method == "cuda-graph"
        live.graph_problem = live.graph_problem or live.last.graph_problem
        live.samples += live.last.samples_ms
        live.round_medians.append(Summary.of(live.last.samples_ms).median)
        bad, checked = count_differing(live.last.checksums, live.good_sum)
        live.calls_bad, live.calls_checked = live.calls_bad + bad, live.calls_checked + checked
        live.notes.append((live.last.note, live.last.left_out))
        live.host.round()  # SPREAD_ROUNDS: this round's host calls, after its kernel pass (else nothing)
        live.row.timing = live.host.timed(live.row.timing)

    def _finish(self, live: "_Live", ref, tol, ceil, work) -> None:
        """Statistics of all samples, the check of the timed output, roofline, profile."""
        row, be, plan, batch, res = live.row, live.be, live.plan, live.batch, live.last
        graph_note = live.graph_check.note if live.graph_check is not None else ""
        row.timing = kernel_timed(row.timing, live.samples, live.round_medians, res, row_note(live.notes), graph_note)
        st2, reason2, _, _ = check_output(res.output, ref, batch, row.correctness.tolerance or tol)
        if st2 is Status.OK and live.graph_problem:
            st2, reason2 = Status.MISMATCH, live.graph_problem
        if st2 is Status.OK and live.calls_bad:
            st2, reason2 = Status.MISMATCH, (
                f"{live.calls_bad} of {live.calls_checked} timed calls returned an output whose checksum "
                "differs from the checked first output's"
            )
        if st2 is not Status.OK:
            row.status, row.reason = Status.MISMATCH, f"output under {res.method} timing: {reason2}"
            return
        if not is_oracle(row.id.backend):  # float64 per request, there to be right: no roofline, no bandwidth
            rf = checked_roofline(work, row.timing.median_ms, ceil, batch.spec.dtype, batch.device, self.threads)
            row.roofline = roofline_part(work, rf)
        if self.opts.profile_dir is not None:
            from attnbench.measure.profiling import profile_row

            prof = profile_row(
                lambda: be.prepare(batch), lambda: be.run(plan), batch.device, self.opts.profile_dir, row.id.case_id,
                row.id.backend,
            )
            row.profile = profile_part(prof)


@dataclass
class _Live:
    """A row whose backend is planned and checked, between its timing rounds."""

    row: Row
    be: object
    plan: object
    batch: Batch
    capturable: bool
    samples: list = field(default_factory=list)
    round_medians: list = field(default_factory=list)  # one median per timing round, in order
    last: Optional[TimingResult] = None
    good_sum: Optional[torch.Tensor] = None  # checksum of the checked first output
    calls_bad: int = 0  # timed calls whose output checksum differs from it
    graph_check: Optional[GraphCheck] = None  # is its captured graph stale? (measure/graph_check.py)
    graph_checked: bool = False
    graph_problem: str = ""
    calls_checked: int = 0
    host: Optional[HostTimes] = None  # the plan's and convert's samplers, a share each round
    notes: list = field(default_factory=list)  # each round's timer note and the calls it left out
