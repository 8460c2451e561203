"""Wheels for an offline GPU machine that takes a limited number of bytes per transfer.

Used by scripts/gpu/fetch_wheels.sh (on a machine with a package index) and
scripts/gpu/install_wheels.sh (on the GPU machine); docs/backends.md "Offline install" says how.

  python3 scripts/gpu/wheels.py trim WHEEL OUT_WHEEL PREFIX...   # drop members under PREFIXes
  python3 scripts/gpu/wheels.py layout SRC_DIR OUT_DIR [--limit-mib 60] [--part-mib 46]
  python3 scripts/gpu/wheels.py join STASH_DIR WHEEL_DIR          # on the GPU machine

``layout`` splits every wheel larger than the limit into parts (``NAME.part-00``, ...), packs wheels
and parts into folders ``OUT_DIR/1``, ``OUT_DIR/2``, ... each at most the limit (one folder per
transfer), and writes ``OUT_DIR/<k>/MANIFEST-<k>`` in each: how many folders there are, and every
wheel's name, size and SHA-256 and which parts make it. ``join`` reads the manifests found in STASH_DIR (the folders' files,
gathered there over several transfers), joins the parts, checks every wheel's size and SHA-256
and puts the wheels in WHEEL_DIR; a missing part or a wrong checksum is an error naming it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import zipfile
from pathlib import Path

MIB = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def trim(src: Path, dst: Path, prefixes: list[str]) -> int:
    """Copy wheel ``src`` to ``dst`` without the members under ``prefixes`` (their RECORD lines
    dropped with them); returns how many members were dropped."""
    dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for item in zin.infolist():
            if any(item.filename.startswith(p) for p in prefixes):
                dropped += 1
                continue
            if item.filename == record:
                continue
            zout.writestr(item, zin.read(item.filename))
        lines = [ln for ln in zin.read(record).decode().splitlines()
                 if ln and not any(ln.startswith(p) for p in prefixes)]
        zout.writestr(record, "\n".join(lines) + "\n")
    return dropped


def pieces(src: Path, limit: int, part: int) -> list[tuple[str, int, str]]:
    """``(wheel, piece name, size)`` of every file to carry: a wheel whole, or its parts."""
    out = []
    for w in sorted(src.glob("*.whl")):
        size = w.stat().st_size
        if size <= limit:
            out.append((w.name, w.name, size))
        else:
            n = -(-size // part)
            out += [(w.name, f"{w.name}.part-{i:02d}", min(part, size - i * part)) for i in range(n)]
    return out


def pack(items: list[tuple[str, str, int]], limit: int) -> list[list[tuple[str, str, int]]]:
    """First-fit decreasing: folders of pieces, each folder's pieces at most ``limit`` bytes."""
    bins: list[list] = []
    for it in sorted(items, key=lambda x: -x[2]):
        if it[2] > limit:
            raise ValueError(f"{it[1]} is {it[2]} bytes, more than one folder's {limit}")
        for b in bins:
            if sum(x[2] for x in b) + it[2] <= limit:
                b.append(it)
                break
        else:
            bins.append([it])
    return bins


def layout(src: Path, out: Path, limit_mib: float, part_mib: float) -> list[Path]:
    limit, part = int(limit_mib * MIB), int(part_mib * MIB)
    if part > limit:
        raise ValueError(f"--part-mib {part_mib} is more than --limit-mib {limit_mib}")
    folders = []
    sums = {w.name: (w.stat().st_size, sha256(w)) for w in src.glob("*.whl")}
    bins = pack(pieces(src, limit, part), limit - 64 * 1024)  # room for the manifest
    for k, b in enumerate(bins, 1):
        d = out / str(k)
        d.mkdir(parents=True, exist_ok=True)
        manifest = [f"#folders\t{len(bins)}"]
        for wheel, name, size in b:
            if name == wheel:
                shutil.copy2(src / wheel, d / name)
            else:
                i = int(name.rsplit("-", 1)[1])
                with open(src / wheel, "rb") as f, open(d / name, "wb") as g:
                    f.seek(i * part)
                    g.write(f.read(size))
            total, digest = sums[wheel]
            nparts = 1 if name == wheel else -(-total // part)
            manifest.append(f"{wheel}\t{total}\t{digest}\t{nparts}\t{name}")
        (d / f"MANIFEST-{k}").write_text("\n".join(manifest) + "\n")
        folders.append(d)
    return folders


def join(stash: Path, dest: Path) -> list[Path]:
    """The wheels the manifests in ``stash`` describe, joined from their pieces and checked."""
    want: dict[str, tuple[int, str, int]] = {}
    folders = 0
    for m in sorted(stash.glob("MANIFEST-*")):
        for line in m.read_text().splitlines():
            if line.startswith("#folders"):
                folders = max(folders, int(line.split("\t")[1]))
                continue
            wheel, total, digest, nparts, _ = line.split("\t")
            want[wheel] = (int(total), digest, int(nparts))
    if not want:
        raise SystemExit(f"no MANIFEST in {stash}: stash the folders made by fetch_wheels.sh first")
    absent = [str(k) for k in range(1, folders + 1) if not (stash / f"MANIFEST-{k}").is_file()]
    if absent:
        raise SystemExit(f"missing folder(s) {', '.join(absent)} of {folders} in {stash} (bring them)")
    dest.mkdir(parents=True, exist_ok=True)
    done = []
    for wheel, (total, digest, nparts) in sorted(want.items()):
        names = [wheel] if nparts == 1 else [f"{wheel}.part-{i:02d}" for i in range(nparts)]
        missing = [n for n in names if not (stash / n).is_file()]
        if missing:
            raise SystemExit(f"{wheel}: missing {', '.join(missing)} in {stash} (bring the folder holding it)")
        tmp = dest / (wheel + ".tmp")
        with open(tmp, "wb") as g:
            for n in names:
                with open(stash / n, "rb") as f:
                    shutil.copyfileobj(f, g, MIB)
        if tmp.stat().st_size != total or sha256(tmp) != digest:
            tmp.unlink()
            raise SystemExit(f"{wheel}: joined size or SHA-256 differs from its MANIFEST (a part is damaged)")
        os.replace(tmp, dest / wheel)
        done.append(dest / wheel)
    return done


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trim")
    t.add_argument("wheel", type=Path)
    t.add_argument("out", type=Path)
    t.add_argument("prefixes", nargs="+")
    lay = sub.add_parser("layout")
    lay.add_argument("src", type=Path)
    lay.add_argument("out", type=Path)
    lay.add_argument("--limit-mib", type=float, default=60.0)
    lay.add_argument("--part-mib", type=float, default=46.0)
    j = sub.add_parser("join")
    j.add_argument("stash", type=Path)
    j.add_argument("dest", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "trim":
        print(f"{a.out.name}: dropped {trim(a.wheel, a.out, a.prefixes)} members")
    elif a.cmd == "layout":
        for d in layout(a.src, a.out, a.limit_mib, a.part_mib):
            size = sum(p.stat().st_size for p in d.iterdir()) / MIB
            names = sorted(p.name for p in d.iterdir() if not p.name.startswith("MANIFEST"))
            print(f"{d}: {size:.1f} MiB: " + " ".join(names))
    else:
        for w in join(a.stash, a.dest):
            print(f"{w}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
