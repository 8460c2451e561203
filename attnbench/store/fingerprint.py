"""A run's fingerprint: the device, torch and backend versions its numbers depend on, and the
host fields that tell two machines of one device name apart (``measure.host``).

``{"device": "cpu x86_64 (2 threads)", "torch": "2.13.0+cpu", "backends": {...},
"host": {"kind": "cpu", "cpu_model": "AMD EPYC", "cpu_cores": 2, "l3_cache": "32M", ...}}``

Runs and baselines made before host fingerprints were recorded have no ``host`` (or an empty
one): two fingerprints are compared on the host fields both have, and a note says when one
side has none (only the device name could then be compared).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from attnbench.measure.host import SOFTWARE_FIELDS
from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row


def fingerprint(manifest: Manifest, rows: Iterable[Row] = ()) -> dict:
    """Device, torch and backend versions and host fields of a run (from its manifest, else its rows)."""
    env = manifest.environment  # a hand-edited manifest: {} (Manifest.from_json), fields checked below
    rows = list(rows)
    device = _text(env.get("device")) or next((r.id.device for r in rows if r.id.device), "")
    listed = env.get("backends") if isinstance(env.get("backends"), dict) else {}
    backends = {str(k): _text(v) for k, v in listed.items()}
    for r in rows:
        if r.id.backend_version and r.id.backend not in backends:
            backends[r.id.backend] = r.id.backend_version
    return {"device": device, "torch": _text(env.get("torch")), "backends": backends, "host": clean_host(env.get("host"))}


def clean_fingerprint(fp: dict) -> dict:
    """A stored fingerprint with each field of the right type (a hand edit may break them)."""
    listed = fp.get("backends") if isinstance(fp.get("backends"), dict) else {}
    return {"device": _text(fp.get("device")), "torch": _text(fp.get("torch")),
            "backends": {str(k): _text(v) for k, v in listed.items()}, "host": clean_host(fp.get("host"))}


def clean_host(host) -> dict:
    """The host fields that are texts or whole numbers (anything else, hand-edited, is dropped)."""
    if not isinstance(host, dict):
        return {}
    return {str(k): v for k, v in host.items()
            if (isinstance(v, str) and v) or (isinstance(v, int) and not isinstance(v, bool))}


def _text(v) -> str:
    return v if isinstance(v, str) else ""


@dataclass
class FingerprintDiff:
    """How two fingerprints differ: ``device`` (another device or host: the check refuses it
    without --allow-cross-device), ``versions`` (torch, backends, torch build, driver: a note),
    ``notes`` (what could not be compared)."""

    device: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def same_device(self) -> bool:
        return not self.device


def _pair(name: str, run, base) -> str:
    return f"{name}: {base if base not in (None, '') else '?'} (baseline) vs {run if run not in (None, '') else '?'}"


def compare_fingerprints(a: dict, b: dict, names: tuple[str, str] = ("the run", "the baseline")) -> FingerprintDiff:
    """``a`` (the run) against ``b`` (the baseline), field by field: the device name, then every
    host field both record; versions only make notes. ``names`` name the two sides in notes."""
    out = FingerprintDiff()
    if (a.get("device") or "") != (b.get("device") or ""):
        out.device.append(_pair("device", a.get("device"), b.get("device")))
    ha, hb = clean_host(a.get("host")), clean_host(b.get("host"))
    for key in [k for k in hb if k in ha]:
        if ha[key] != hb[key]:
            (out.versions if key in SOFTWARE_FIELDS else out.device).append(_pair(key, ha[key], hb[key]))
    if a.get("torch") != b.get("torch"):
        out.versions.append(_pair("torch", a.get("torch"), b.get("torch")))
    ba, bb = a.get("backends") or {}, b.get("backends") or {}
    for name in sorted(set(ba) & set(bb)):
        if ba[name] != bb[name]:
            out.versions.append(_pair(name, ba[name], bb[name]))
    old = [n for n, h in zip(names, (ha, hb)) if not h]
    if old:
        who = " and ".join(old)
        out.notes.append(f"{who} {'predate' if len(old) > 1 else 'predates'} host fingerprints (CPU model, cores, "
                         "caches, torch build; GPU memory, driver, clocks): only the device name "
                         f"({b.get('device') or a.get('device') or '?'}) and versions were compared")
    else:
        one_side = sorted((set(ha) ^ set(hb)) - {"kind"})
        if one_side:
            out.notes.append("host fields recorded on one side only, not compared: " + ", ".join(one_side))
    return out


def fingerprint_differences(a: dict, b: dict) -> tuple[bool, list[str]]:
    """-> (same device and host?, human-readable differences in device, host and versions)."""
    d = compare_fingerprints(a, b)
    return d.same_device, d.device + d.versions
