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

from attnbench.store.rows import Row


def _incomplete(label: str, manifest: dict, rows: Sequence[Row]) -> Optional[str]:
    status = manifest.get("status")
    if status != "complete":
        return f"{label} is incomplete (manifest status {status!r}, {len(rows)} rows): it did not run every case"
    cases, backends = manifest.get("cases"), manifest.get("backends_requested")
    picked = manifest.get("rows_expected") if manifest.get("select") else None  # a run of the rows -k picked
    if isinstance(picked, int) and len(rows) < picked:
        return f"{label} has {len(rows)} rows of the {picked} that -k {manifest['select']!r} picked: it did not run them all"
    if picked is None and isinstance(cases, int) and isinstance(backends, list) and len(rows) < cases * len(backends):
        return (f"{label} has {len(rows)} rows of the {cases} cases x {len(backends)} backends its manifest lists: "
                "it did not run every case")
    return None


def _scenario_change(current: dict, baseline: dict) -> Optional[str]:
    cur_sha, base_sha = current.get("scenario_sha256"), baseline.get("scenario_sha256")
    if not cur_sha or not base_sha:
        side = "the run" if not cur_sha else "the baseline"
        return f"{side} does not record its scenario_sha256, so the scenario cannot be compared"
    if cur_sha != base_sha:
        return (f"the scenario text differs from the baseline's ({current.get('scenario_path') or '?'} "
                f"sha256 {cur_sha[:12]}, baseline {baseline.get('scenario_path') or '?'} sha256 {base_sha[:12]})")
    if list(current.get("overrides") or []) != list(baseline.get("overrides") or []):
        return (f"the run's --set overrides {current.get('overrides') or []} differ from the baseline's "
                f"{baseline.get('overrides') or []}")
    return None


def run_problems(
    current: Sequence[Row], current_manifest: dict, baseline: Sequence[Row], baseline_manifest: dict,
    allow_scenario_change: bool = False,
) -> list[str]:
    """Run-level failures of checking ``current`` against ``baseline`` (empty: none)."""
    out = []
    for label, manifest, rows in (("the run", current_manifest, current), ("the baseline", baseline_manifest, baseline)):
        why = _incomplete(label, manifest, rows)
        if why:
            out.append(why)
    if not allow_scenario_change:
        why = _scenario_change(current_manifest, baseline_manifest)
        if why:
            out.append(why + "; pass --allow-scenario-change if that is intended, or refresh the baseline")
    base_keys = {r.key for r in baseline}
    if not any(r.key in base_keys for r in current):
        names = sorted({r.scenario for r in current}), sorted({r.scenario for r in baseline})
        out.append(f"no case of the run ({len(current)} rows, scenario {', '.join(names[0]) or '-'}) matches one of "
                   f"the baseline ({len(baseline)} rows, scenario {', '.join(names[1]) or '-'}): nothing was compared")
    return out
