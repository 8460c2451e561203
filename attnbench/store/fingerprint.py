"""A run's fingerprint: the device, torch and backend versions its numbers depend on."""
from __future__ import annotations

from typing import Iterable

from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row


def fingerprint(manifest: Manifest, rows: Iterable[Row] = ()) -> dict:
    """Device, torch and backend versions of a run (from its manifest, else its rows)."""
    env = manifest.environment  # a hand-edited manifest: {} (Manifest.from_json), fields checked below
    rows = list(rows)
    device = _text(env.get("device")) or next((r.device for r in rows if r.device), "")
    listed = env.get("backends") if isinstance(env.get("backends"), dict) else {}
    backends = {str(k): _text(v) for k, v in listed.items()}
    for r in rows:
        if r.backend_version and r.backend not in backends:
            backends[r.backend] = r.backend_version
    return {"device": device, "torch": _text(env.get("torch")), "backends": backends}


def clean_fingerprint(fp: dict) -> dict:
    """A stored fingerprint with each field of the right type (a hand edit may break them)."""
    listed = fp.get("backends") if isinstance(fp.get("backends"), dict) else {}
    return {"device": _text(fp.get("device")), "torch": _text(fp.get("torch")),
            "backends": {str(k): _text(v) for k, v in listed.items()}}


def _text(v) -> str:
    return v if isinstance(v, str) else ""


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
