"""FlashInfer's built kernel modules, kept from one GPU session for the next (issue 32: its JIT
builds, 130-840 s a module on the GPU machine, cut verify rows and tests five sessions running).

FlashInfer 0.5.3 loads a module from its AOT folder without building it when
``<FLASHINFER_AOT_DIR>/<name>/<name>.so`` exists (``jit/core.py``: ``JitSpec.build_and_load``
checks ``is_aot`` first; ``jit/env.py``: the folder is the package's ``data/aot`` unless the
flashinfer-jit-cache package is installed). Its JIT builds land in
``<FLASHINFER_JIT_DIR>/<name>/<name>.so`` (``~/.cache/flashinfer/<version>/<arch>/cached_ops``).
So the modules a session built can come back in a device call's output (at most 8 files of 16 MiB
each) and be carried into the next session (``.fijit/``, within the 64 MiB a call carries).

    python3 scripts/gpu/flashinfer_cache.py sizes                  # every built module, its .so size
    python3 scripts/gpu/flashinfer_cache.py save DIR [--max-mb 36] [--part-mb 15] [--prefer pod ...]
    python3 scripts/gpu/flashinfer_cache.py restore [SRC]          # SRC: .fijit (default)

``save`` packs the built modules, each xz-compressed (for at most ``--max-s`` seconds), into ``DIR/fijit-STAMP-N.tar`` parts of at most
``--part-mb`` MiB and ``--max-mb`` in all: modules whose name holds a ``--prefer`` word first, then the
smallest first (the most modules for the bytes); it lists what it left out. 36 MiB: what a call
can carry beside the repo (4 MiB), .whl (16), .fa2 (5) and .plan_base (1) within its 64 MiB. ``restore`` unpacks
every part in SRC into FlashInfer's AOT folder and lists the modules (they load without a build).
A module is arch-specific: this project builds for sm_90 only (``FLASHINFER_CUDA_ARCH_LIST=9.0``),
which the H100 and H200 both are. ``--jit-dir`` / ``--aot-dir`` override the folders (tests).
"""
from __future__ import annotations

import argparse
import io
import lzma
import sys
import tarfile
import time
from pathlib import Path

MIB = 1 << 20


def _flashinfer_dirs() -> tuple[Path, Path]:
    from flashinfer.jit import env  # the installed FlashInfer's own folders

    return Path(env.FLASHINFER_JIT_DIR), Path(env.FLASHINFER_AOT_DIR)


def built(jit_dir: Path) -> dict[str, Path]:
    """Module name -> its built .so, for every complete build in ``jit_dir``."""
    if not jit_dir.is_dir():
        return {}
    return {d.name: d / f"{d.name}.so" for d in sorted(jit_dir.iterdir()) if (d / f"{d.name}.so").is_file()}


def plan_parts(sizes: dict[str, int], part: int, total: int, prefer: list[str]) -> tuple[list[list[str]], list[str]]:
    """Modules (name -> compressed bytes) packed into parts of at most ``part`` bytes, ``total`` in
    all: preferred names first, then the smallest. Returns the parts and the names left out."""
    order = sorted(sizes, key=lambda n: (not any(w in n for w in prefer), sizes[n], n))
    parts: list[list[str]] = []
    fill: list[int] = []
    used, left = 0, []
    for name in order:
        size = sizes[name]
        if size > part or used + size > total:
            left.append(name)
            continue
        i = next((i for i, f in enumerate(fill) if f + size <= part), None)
        if i is None:
            parts.append([])
            fill.append(0)
            i = len(parts) - 1
        parts[i].append(name)
        fill[i] += size
        used += size
    return parts, left


def compress(mods: dict[str, Path], prefer: list[str], total: int, max_s: float) -> dict[str, bytes]:
    """xz of the modules in ``plan_parts``' order (preferred, then the smallest file), only as many
    as can fit ``total`` compressed bytes and ``max_s`` seconds (a machine's caches can hold GBs)."""
    t0, used, out = time.monotonic(), 0, {}
    for name in sorted(mods, key=lambda n: (not any(w in n for w in prefer), mods[n].stat().st_size, n)):
        if time.monotonic() - t0 > max_s or total - used < MIB:
            break
        data = lzma.compress(mods[name].read_bytes(), preset=3)
        if used + len(data) <= total:
            out[name] = data
            used += len(data)
    return out


def save(out: Path, jit_dir: Path, max_mb: float, part_mb: float, prefer: list[str], max_s: float = 90) -> int:
    mods = built(jit_dir)
    if not mods:
        print(f"flashinfer_cache: no built module in {jit_dir}")
        return 0
    packed = compress(mods, prefer, int(max_mb * MIB), max_s)
    sizes = {n: len(b) + 1024 for n, b in packed.items()}  # + a tar header and padding
    parts, left = plan_parts(sizes, int(part_mb * MIB), int(max_mb * MIB), prefer)
    left += [n for n in mods if n not in packed]
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d%H%M")  # parts of several sessions can sit side by side in .fijit/
    for i, names in enumerate(parts):
        with tarfile.open(out / f"fijit-{stamp}-{i}.tar", "w") as tar:
            for n in names:
                info = tarfile.TarInfo(f"{n}/{n}.so.xz")
                info.size = len(packed[n])
                tar.addfile(info, io.BytesIO(packed[n]))
        print(f"{out / f'fijit-{stamp}-{i}.tar'}: {len(names)} modules, {sum(sizes[n] for n in names) / MIB:.1f} MiB")
    for n in left:  # a module past the byte or time budget was never compressed: its size on disk only
        packed_mb = f", {sizes[n] / MIB:.1f} MiB compressed" if n in sizes else ", not compressed"
        print(f"left out: {n} ({mods[n].stat().st_size / MIB:.1f} MiB{packed_mb})")
    return 0


def restore(src: Path, aot_dir: Path) -> int:
    tars = sorted(src.glob("fijit-*.tar")) if src.is_dir() else []
    if not tars:
        print(f"flashinfer_cache: nothing to restore in {src}")
        return 0
    n = 0
    for t in tars:
        with tarfile.open(t) as tar:
            for m in tar.getmembers():
                name = m.name.split("/")[0]
                if not m.isfile() or m.name != f"{name}/{name}.so.xz" or name in ("", ".", ".."):
                    print(f"{t.name}: skipped {m.name!r} (not NAME/NAME.so.xz)")
                    continue
                dest = aot_dir / name / f"{name}.so"
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(lzma.decompress(tar.extractfile(m).read()))
                n += 1
    print(f"flashinfer_cache: {n} prebuilt modules into {aot_dir} (loaded there without a JIT build)")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("sizes", "save", "restore"))
    ap.add_argument("path", nargs="?", type=Path, help="save: the output folder; restore: the carried folder")
    ap.add_argument("--max-mb", type=float, default=36.0)
    ap.add_argument("--part-mb", type=float, default=15.0)
    ap.add_argument("--prefer", nargs="*", default=[])
    ap.add_argument("--max-s", type=float, default=90.0, help="save: seconds of compression at most")
    ap.add_argument("--jit-dir", type=Path)
    ap.add_argument("--aot-dir", type=Path)
    a = ap.parse_args(argv)
    jit_dir, aot_dir = a.jit_dir, a.aot_dir
    if (aot_dir if a.verb == "restore" else jit_dir) is None:  # the folder this verb needs
        try:
            fi_jit, fi_aot = _flashinfer_dirs()
        except ImportError as e:
            print(f"flashinfer_cache: FlashInfer is not importable here ({e}); nothing done")
            return 0
        jit_dir, aot_dir = jit_dir or fi_jit, aot_dir or fi_aot
    if a.verb == "sizes":
        mods = built(jit_dir)
        for n, p in mods.items():
            print(f"{p.stat().st_size / MIB:8.1f} MiB  {n}")
        print(f"{len(mods)} modules, {sum(p.stat().st_size for p in mods.values()) / MIB:.1f} MiB in {jit_dir}")
        return 0
    if a.path is None and a.verb == "save":
        ap.error("save needs the output folder")
    if a.verb == "save":
        return save(a.path, jit_dir, a.max_mb, a.part_mb, a.prefer, a.max_s)
    return restore(a.path or Path(".fijit"), aot_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
