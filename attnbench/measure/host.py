"""What tells one machine from another in a run's fingerprint (``environment["host"]`` of the
manifest): the device name alone (``cpu x86_64 (2 threads)``) is the same on two hosts whose
CPUs time the same kernel 1.5x apart, so ``check``'s "another device" guard never fired.

On a CPU: the model name, vendor/family/model/stepping, physical cores and logical threads,
the cache sizes (sysfs, no ``lscpu``), the instruction set torch dispatches to and the highest
clock the kernel reports. On a CUDA device: the name, memory, SM count, compute capability and,
where ``nvidia-smi`` answers, the driver and the highest SM clock. Both: the torch build
(version, CUDA or none, git hash).

Every read is guarded: a field that cannot be read is left out, never guessed, and a
comparison (``store.fingerprint``) only compares the fields both sides have. Hardware fields
decide whether two runs come from the same device; the software fields (``SOFTWARE_FIELDS``)
only make a note, like the torch and backend versions always did.
"""
from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

# differences in these make a note, not another device: a driver or torch upgrade on the same
# machine is still that machine (the check prints what changed)
SOFTWARE_FIELDS = frozenset({"torch_build", "gpu_driver"})
PROC_CPUINFO = Path("/proc/cpuinfo")
SYS_CPU = Path("/sys/devices/system/cpu")


def host_fingerprint(device: "torch.device") -> dict:
    """The fields of this machine that ``device``'s timings depend on (module docstring)."""
    return dict(_cached(str(device)))


@functools.lru_cache(maxsize=None)
def _cached(device: str) -> tuple:
    import torch

    dev = torch.device(device)
    out: dict = {"kind": dev.type}
    out.update(gpu_fields(dev) if dev.type == "cuda" else cpu_fields())
    build = torch_build()
    if build:
        out["torch_build"] = build
    return tuple(out.items())


def torch_build() -> str:
    """``2.13.0+cpu (cuda none, git cf30153c4c13)``: which torch binary timed the kernels."""
    try:
        import torch

        ver = torch.__version__
        cuda = getattr(torch.version, "cuda", None)
        hip = getattr(torch.version, "hip", None)
        git = getattr(torch.version, "git_version", None) or ""
    except Exception:
        return ""
    gpu = f"cuda {cuda}" if cuda else (f"rocm {hip}" if hip else "cuda none")
    return f"{ver} ({gpu}" + (f", git {git[:12]}" if git and git != "Unknown" else "") + ")"


# ---------------------------------------------------------------------------- CPU
def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one ``{key: value}`` per logical CPU."""
    blocks, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
            cur = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            cur.setdefault(key.strip().lower(), value.strip())
    if cur:
        blocks.append(cur)
    return blocks


def _cpu_id(first: dict[str, str]) -> str:
    """``AuthenticAMD family 25 model 1 stepping 1`` (x86) or ``implementer 0x41 part 0xd0c`` (Arm)."""
    if "cpu family" in first:
        parts = [first.get("vendor_id", "")] + [f"{k.split()[-1]} {first[k]}" for k in ("cpu family", "model", "stepping")
                                                if k in first]
        return " ".join(p for p in parts if p)
    arm = [f"{k.split()[-1]} {first[k]}" for k in ("cpu implementer", "cpu variant", "cpu part", "cpu revision")
           if k in first]
    return " ".join(arm)


def _physical_cores(blocks: list[dict[str, str]], sys_cpu: Path) -> Optional[int]:
    pairs = {(b.get("physical id", "0"), b["core id"]) for b in blocks if "core id" in b}
    if pairs:
        return len(pairs)
    cores = set()  # no core ids in cpuinfo (Arm): one set of thread siblings per core
    for topo in sys_cpu.glob("cpu[0-9]*/topology"):
        sib = _read(topo / "core_cpus_list") or _read(topo / "thread_siblings_list")
        pkg = _read(topo / "physical_package_id")
        if sib:
            cores.add((pkg, sib))
    return len(cores) or None


_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*$", re.I)


def cache_sizes(sys_cpu: Path = SYS_CPU) -> dict[str, str]:
    """``{"l1d_cache": "32K", "l1i_cache": "32K", "l2_cache": "512K", "l3_cache": "32M"}`` of
    CPU 0 (``sys_cpu/cpu0/cache/index*``); {} where sysfs does not say."""
    out = {}
    for idx in sorted((sys_cpu / "cpu0" / "cache").glob("index*")):
        level, kind, size = _read(idx / "level"), _read(idx / "type").lower(), _read(idx / "size")
        m = _SIZE.match(size)
        if not level.isdigit() or not m:
            continue
        suffix = {"data": "d", "instruction": "i"}.get(kind, "")
        out[f"l{level}{suffix}_cache"] = _human_size(int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20,
                                                                        "G": 1 << 30}[m.group(2).upper()])
    return out


def _human_size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def cpu_fields(cpuinfo: Path = PROC_CPUINFO, sys_cpu: Path = SYS_CPU) -> dict:
    """The CPU's fields (``cpu_model``, ``cpu_id``, ``cpu_cores``, ``cpu_threads``, the cache
    sizes, ``cpu_isa``, ``cpu_max_mhz``); those that cannot be read are left out."""
    blocks = _cpuinfo_blocks(_read(cpuinfo))
    first = blocks[0] if blocks else {}
    model = first.get("model name") or first.get("hardware") or platform.processor() or platform.machine()
    out: dict = {"cpu_model": " ".join(model.split())}
    ident = _cpu_id(first)
    if ident:
        out["cpu_id"] = ident
    cores = _physical_cores(blocks, sys_cpu)
    if cores:
        out["cpu_cores"] = cores
    threads = len(blocks) if blocks and all("processor" in b for b in blocks) else os.cpu_count()
    if threads:
        out["cpu_threads"] = threads
    out.update(cache_sizes(sys_cpu))
    isa = _cpu_isa()
    if isa:
        out["cpu_isa"] = isa
    khz = _read(sys_cpu / "cpu0" / "cpufreq" / "cpuinfo_max_freq")
    if khz.isdigit() and int(khz) > 0:
        out["cpu_max_mhz"] = int(khz) // 1000
    return out


def _cpu_isa() -> str:
    """The vector instruction set torch's CPU kernels dispatch to (``AVX2``, ``AVX512``, ...)."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return ""


# ---------------------------------------------------------------------------- GPU
def gpu_fields(device: "torch.device") -> dict:
    """A CUDA device's fields (``gpu_name``, ``gpu_memory_mib``, ``gpu_sm_count``,
    ``gpu_capability``, and from nvidia-smi ``gpu_driver``, ``gpu_max_sm_mhz``)."""
    import torch

    out: dict = {}
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
    except Exception:
        return out
    for key, get in (("gpu_name", lambda: str(p.name)),
                     ("gpu_memory_mib", lambda: int(p.total_memory) // (1 << 20)),
                     ("gpu_sm_count", lambda: int(p.multi_processor_count)),
                     ("gpu_capability", lambda: f"{p.major}.{p.minor}")):
        try:
            out[key] = get()
        except Exception:
            pass
    uuid = str(getattr(p, "uuid", "") or "")
    if uuid:
        out.update(nvidia_smi_fields(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"))
    return out


def nvidia_smi_fields(uuid: str, timeout_s: float = 10.0) -> dict:
    """The driver version and highest SM clock of GPU ``uuid`` from nvidia-smi ({} without it)."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "-i", uuid, "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return {}
    if proc.returncode != 0 or not proc.stdout.strip():
        return {}
    parts = [s.strip() for s in proc.stdout.strip().splitlines()[0].split(",")]
    out: dict = {}
    if parts and parts[0] and "N/A" not in parts[0]:
        out["gpu_driver"] = parts[0]
    if len(parts) > 1 and parts[1].isdigit():
        out["gpu_max_sm_mhz"] = int(parts[1])
    return out
