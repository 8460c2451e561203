"""Measured device ceilings (memory bandwidth, matmul rate per dtype), kept once per device.

A row's % of roofline divides by these, so they must not move between runs: the same kernel
at the same speed read ``54% mem`` and then ``43% mem`` when a run needing a new dtype
re-measured every ceiling and overwrote the cache (issue 24). Here

* the memory ceilings (a device-to-device copy counting read + write; a read-only stream) are
  measured once per device, and each dtype's matmul rate once, when first needed; a later
  need adds what is missing and never replaces a value already kept;
* the cache file is re-read just before each write and only missing values are added, so
  processes measuring at once do not overwrite each other;
* only ``attnbench ceilings --measure`` (``remeasure``) replaces values, on request.

CPU ceilings are kept per intra-op thread count (rows run with one thread by default); the
16-bit matmul rates of a CPU are its float32 rate, measured once (its 16-bit rates say little
about an attention kernel that computes in float32).

A ceiling is a peak, and load only ever slows a measurement down: copy bandwidth read 11.5 and
21.2 GB/s minutes apart on one CPU when it was one median of 3 calls (issue 35). Each value is
now the best of ``ROUNDS`` rounds (each the median of a few calls), and a run whose row beats
its kept ceiling (above 100%) measures again, once per process, and keeps the higher values
(``checked_roofline``). ``attnbench ceilings`` shows when each value was measured and how
(``METHOD_TEXT``).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Optional

import torch

from attnbench.measure.metrics import Ceilings, Roofline, Work, device_name, roofline
from attnbench.measure.timing import cpu_threads, median_seconds

# Bump when the way ceilings are measured changes, so cached values measured the old way are not reused.
CEILINGS_METHOD = 5
ROUNDS = 5  # each ceiling: the best of this many rounds (a round: the median of a few calls)
METHOD_TEXT = (f"method {CEILINGS_METHOD}: each value is the best of {ROUNDS} rounds (a round: the median of 3 calls "
               "on a CPU, 10 on a GPU) of a device-to-device copy and a read-only stream (128 MiB on a CPU, 1 GiB on a "
               "GPU) and of a square matmul (1024 float32 on a CPU, for every dtype; 8192 in the dtype on a GPU); "
               "a run whose row beats a kept ceiling measures again once and keeps the higher values")


def best_seconds(fn, device: torch.device, reps: int) -> float:
    """The fastest of ROUNDS medians of ``reps`` calls: a busy spell slows some rounds, none
    speeds one up."""
    return min(median_seconds(fn, device, reps) for _ in range(ROUNDS))


def cache_path() -> Path:
    root = os.environ.get("ATTNBENCH_CACHE_DIR") or Path.home() / ".cache" / "attnbench"
    return Path(root) / "ceilings.json"


def cache_key(device: torch.device, threads: Optional[int] = None) -> str:
    key = f"{device_name(device)} | torch {torch.__version__} | method {CEILINGS_METHOD}"
    if torch.device(device).type == "cpu":
        key += f" | threads {threads or torch.get_num_threads()}"
    return key


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def measure_memory(device: torch.device) -> dict:
    """``{"copy_tbps", "read_tbps"}`` of ``device``."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    nbytes = (1 << 30) if cuda else (1 << 27)
    reps = 10 if cuda else 3
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    a.random_(0, 255)
    b = torch.empty_like(a)
    copy_s = best_seconds(lambda: b.copy_(a), device, reps)
    del b
    # A float32 sum reads every byte once (an int32 sum runs far below bandwidth on an H200).
    # Read-only streams: the faster of a full float32 sum and a row-wise 16-bit sum (many
    # independent rows keep more loads in flight). Neither is a true peak; attention kernels
    # can read a little faster still (a row above 100% says so).
    words = a.view(torch.float32)
    rows = a.view(torch.bfloat16).view(-1, 1 << 14)
    read_s = min(best_seconds(lambda: words.sum(), device, reps),
                 best_seconds(lambda: rows.sum(dim=1, dtype=torch.float32), device, reps))
    return {"copy_tbps": 2 * nbytes / copy_s / 1e12, "read_tbps": nbytes / read_s / 1e12}


def measure_matmul(device: torch.device, dtype: str) -> float:
    """TFLOP/s of a dense square matmul in ``dtype`` (float32 on a CPU, see the module)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    dt = getattr(torch, dtype) if cuda else torch.float32
    n = 8192 if cuda else 1024
    x = torch.randn(n, n, device=device, dtype=torch.float32).to(dt)
    y = torch.randn(n, n, device=device, dtype=torch.float32).to(dt)
    s = best_seconds(lambda: x @ y, device, 10 if cuda else 3)
    return 2 * n**3 / s / 1e12


def _load(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _save(path: Path, key: str, entry: dict, replace: bool) -> dict:
    """Merge ``entry`` into the file's entry for ``key`` as it is on disk now: only missing
    values are added unless ``replace``. Returns the merged entry (what the file now holds)."""
    cache = _load(path)
    old = _usable(cache.get(key))
    merged = dict(entry) if replace else {**entry, **old}
    merged["matmul_tflops"] = {**old.get("matmul_tflops", {}), **entry.get("matmul_tflops", {})} if replace else \
        {**entry.get("matmul_tflops", {}), **old.get("matmul_tflops", {})}
    merged["measured_at"] = {**old.get("measured_at", {}), **entry.get("measured_at", {})} if replace else \
        {**entry.get("measured_at", {}), **old.get("measured_at", {})}
    cache[key] = merged
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # workers of one host may write at once
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return merged


def _rate(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _usable(entry) -> dict:
    """The values of a cached entry that a row can divide by (finite rates > 0); a 0, a NaN
    or a string (a damaged or hand-edited cache) is dropped, so it is measured again."""
    if not isinstance(entry, dict):
        return {}
    out = {k: v for k, v in entry.items() if k not in ("copy_tbps", "read_tbps", "matmul_tflops", "measured_at")}
    out.update({k: entry[k] for k in ("copy_tbps", "read_tbps") if _rate(entry.get(k))})
    mm = entry.get("matmul_tflops")
    out["matmul_tflops"] = {d: v for d, v in mm.items() if _rate(v)} if isinstance(mm, dict) else {}
    at = entry.get("measured_at")
    out["measured_at"] = dict(at) if isinstance(at, dict) else {}
    if not isinstance(out.get("device_name"), str):
        out.pop("device_name", None)
    return out


def _from_entry(entry: dict) -> Ceilings:
    return Ceilings(entry["device_name"], entry["copy_tbps"], dict(entry["matmul_tflops"]), entry["read_tbps"],
                    dict(entry.get("measured_at", {})))


def ceilings_for(device: torch.device, dtype: str, measure: bool = True, threads: Optional[int] = None
                 ) -> Optional[Ceilings]:
    """This device's ceilings with ``dtype``'s matmul rate: from the cache, measuring (and
    adding) only what it lacks; None when something is missing and ``measure`` is False."""
    path, key = cache_path(), cache_key(device, threads)
    entry = _usable(_load(path).get(key))
    have_mem = "copy_tbps" in entry and "read_tbps" in entry and "device_name" in entry
    have_mm = dtype in entry.get("matmul_tflops", {})
    if have_mem and have_mm:
        return _from_entry(entry)
    if not measure:
        return None
    new: dict = {"device_name": device_name(device), "matmul_tflops": {}, "measured_at": {}}
    if not have_mem:
        new.update(measure_memory(device))
        new["measured_at"]["memory"] = _now()
    if not have_mm:
        cpu = torch.device(device).type == "cpu"  # a CPU: one float32 rate, for every dtype
        cpu_rate = entry.get("matmul_tflops", {}).get("float32") if cpu else None
        rate = cpu_rate or measure_matmul(device, dtype)
        for d in {dtype, "float32"} if cpu else {dtype}:
            new["matmul_tflops"].setdefault(d, rate)
            new["measured_at"][d] = entry.get("measured_at", {}).get("float32", _now()) if cpu_rate else _now()
    return _from_entry(_save(path, key, {**entry, **new}, replace=False))


_RAISED: dict = {}  # (cache key, dtype) -> the ceilings measured again after a row beat them


def checked_roofline(work: Work, median_ms: float, ceil: Optional[Ceilings], dtype: str, device: torch.device,
                     threads: Optional[int] = None) -> Roofline:
    """A row's roofline under the kept ceilings. A row above 100% of them says they were measured
    low (under load): they are measured again, once per process and device, the higher value
    of each kept (in the cache too), and the row placed under those."""
    key = (cache_key(device, threads), dtype)
    ceil = _RAISED.get(key, ceil)
    rf = roofline(work, median_ms, ceil, dtype)
    if ceil is None or not rf.pct_of_ceiling > 100 or key in _RAISED:
        return rf
    _RAISED[key] = ceil  # measured again at most once, whatever happens below
    try:
        with cpu_threads(device, threads or 1):
            mem, rate = measure_memory(device), measure_matmul(device, dtype)
    except Exception:
        return rf
    t = _now()
    entry = {"device_name": ceil.device_name, "copy_tbps": max(ceil.copy_tbps, mem["copy_tbps"]),
             "read_tbps": max(ceil.read_tbps, mem["read_tbps"]),
             "matmul_tflops": {dtype: max(ceil.matmul_tflops.get(dtype, 0.0), rate)},
             "measured_at": {"memory": t, dtype: t}}
    _RAISED[key] = _from_entry(_save(cache_path(), cache_key(device, threads), entry, replace=True))
    return roofline(work, median_ms, _RAISED[key], dtype)


def remeasure(device: torch.device, dtypes: list[str], threads: Optional[int] = None) -> tuple[Optional[Ceilings], Ceilings]:
    """Measure the memory ceilings and ``dtypes``' matmul rates again and replace the kept
    values (``attnbench ceilings --measure``). Returns (before, after)."""
    path, key = cache_path(), cache_key(device, threads)
    old = _load(path).get(key)
    before = _from_entry(old) if old and "copy_tbps" in old else None
    t = _now()
    memory = measure_memory(device)
    cpu_rate = measure_matmul(device, "float32") if torch.device(device).type == "cpu" else None  # one, for every dtype
    entry = {"device_name": device_name(device), **memory,
             "matmul_tflops": {d: cpu_rate or measure_matmul(device, d) for d in dtypes},
             "measured_at": {"memory": t, **{d: t for d in dtypes}}}
    return before, _from_entry(_save(path, key, entry, replace=True))


def kept_matmul_rate(device: str, dtype: str) -> tuple[Optional[float], list[str]]:
    """The matmul rate (TFLOP/s) kept for ``dtype`` on the device named ``device`` (the last
    entry of that name), and a note per kept value that is not a rate (a string, a NaN, a
    damaged entry): those are ignored, never divided by."""
    cache, notes, rate = _load(cache_path()), [], None
    for key, entry in cache.items():
        if not isinstance(entry, dict) or entry.get("device_name") != device:
            continue
        raw = entry.get("matmul_tflops")
        value = raw.get(dtype) if isinstance(raw, dict) else None
        if value is None and not (raw is None or isinstance(raw, dict)):
            notes.append(f"ceilings.json: matmul_tflops {str(raw)[:20]!r} is not a mapping of dtype to TFLOP/s: ignored")
        elif value is not None and not _rate(value):
            notes.append(f"ceilings.json: {dtype} matmul rate {str(value)[:20]!r} is not a number > 0: ignored")
        elif value is not None:
            rate = float(value)
    return rate, notes


def kept_ceilings() -> dict[str, Ceilings]:
    """Every kept entry of the cache file (any device, torch and method), by key."""
    out = {}
    for key, entry in _load(cache_path()).items():
        try:
            out[key] = _from_entry(entry)
        except (KeyError, TypeError):
            continue  # an entry of an older format: shown by nothing, replaced by nothing
    return out
