"""What a run as a whole must satisfy before its cases can pass a check: a gate must never
pass on nothing.

A check fails (these are run-level failures, beside the case verdicts) when

* no case of the run matches a case of the baseline (a renamed scenario, another sweep);
* (a case of the baseline missing from the run fails as a case: ``compare.check`` marks it
  ``vanished``);
* the scenario differs: another ``scenario_sha256`` or other ``--set`` overrides (unless the
  change is allowed), or either side does not record them;
* either side is incomplete: its manifest does not say ``complete``, or it has fewer rows
  than its cases times its backends (than the rows its ``-k`` picked, for a run made with -k).
"""
from __future__ import annotations

from typing import Optional, Sequence

from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row


def _incomplete(label: str, manifest: Manifest, rows: Sequence[Row]) -> Optional[str]:
    if not manifest.complete:
        return (f"{label} is incomplete (manifest status {manifest.status!r}, {len(rows)} rows): "
                "it did not run every case")
    cases, backends = manifest.cases, manifest.backends_requested
    picked = manifest.rows_expected if manifest.select else None  # a run of the rows -k picked
    if picked is not None and len(rows) < picked:
        return f"{label} has {len(rows)} rows of the {picked} that -k {manifest.select!r} picked: it did not run them all"
    if picked is None and cases is not None and backends and len(rows) < cases * len(backends):
        return (f"{label} has {len(rows)} rows of the {cases} cases x {len(backends)} backends its manifest lists: "
                "it did not run every case")
    return None


def scenario_change(current: Manifest, baseline: Manifest) -> Optional[str]:
    """Why two runs' scenarios cannot be compared (another scenario text or other --set
    overrides, or either does not record its text's hash); None when they are the same."""
    cur_sha, base_sha = current.scenario_sha256, baseline.scenario_sha256
    if not cur_sha or not base_sha:
        side = "the run" if not cur_sha else "the baseline"
        return f"{side} does not record its scenario_sha256, so the scenario cannot be compared"
    if cur_sha != base_sha:
        return (f"the scenario text differs from the baseline's ({current.scenario_path or '?'} "
                f"sha256 {cur_sha[:12]}, baseline {baseline.scenario_path or '?'} sha256 {base_sha[:12]})")
    if current.overrides != baseline.overrides:
        return f"the run's --set overrides {current.overrides} differ from the baseline's {baseline.overrides}"
    return None


def run_problems(
    current: Sequence[Row], current_manifest: Manifest, baseline: Sequence[Row], baseline_manifest: Manifest,
    allow_scenario_change: bool = False,
) -> list[str]:
    """Run-level failures of checking ``current`` against ``baseline`` (empty: none)."""
    out = []
    for label, manifest, rows in (("the run", current_manifest, current), ("the baseline", baseline_manifest, baseline)):
        why = _incomplete(label, manifest, rows)
        if why:
            out.append(why)
    if not allow_scenario_change:
        why = scenario_change(current_manifest, baseline_manifest)
        if why:
            out.append(why + "; pass --allow-scenario-change if that is intended, or refresh the baseline")
    base_keys = {r.key for r in baseline}
    if not any(r.key in base_keys for r in current):
        names = sorted({r.id.scenario for r in current}), sorted({r.id.scenario for r in baseline})
        out.append(f"no case of the run ({len(current)} rows, scenario {', '.join(names[0]) or '-'}) matches one of "
                   f"the baseline ({len(baseline)} rows, scenario {', '.join(names[1]) or '-'}): nothing was compared")
    return out
