"""A run's fingerprint: the device, torch and backend versions its numbers depend on."""
from __future__ import annotations

from typing import Iterable

from attnbench.store.rows import Row


def fingerprint(manifest: dict, rows: Iterable[Row] = ()) -> dict:
    """Device, torch and backend versions of a run (from its manifest, else its rows)."""
    env = manifest.get("environment") or {}
    rows = list(rows)
    device = env.get("device") or next((r.device for r in rows if r.device), "")
    backends = dict(env.get("backends") or {})
    for r in rows:
        if r.backend_version and r.backend not in backends:
            backends[r.backend] = r.backend_version
    return {"device": device, "torch": env.get("torch") or "", "backends": backends}


def fingerprint_differences(a: dict, b: dict) -> tuple[bool, list[str]]:
    """-> (same device?, human-readable differences in device and versions)."""
    diffs = []
    same_device = (a.get("device") or "") == (b.get("device") or "")
    if not same_device:
        diffs.append(f"device: {b.get('device') or '?'} (baseline) vs {a.get('device') or '?'}")
    if a.get("torch") != b.get("torch"):
        diffs.append(f"torch: {b.get('torch') or '?'} (baseline) vs {a.get('torch') or '?'}")
    ba, bb = a.get("backends") or {}, b.get("backends") or {}
    for name in sorted(set(ba) & set(bb)):
        if ba[name] != bb[name]:
            diffs.append(f"{name}: {bb[name]} (baseline) vs {ba[name]}")
    return same_device, diffs
