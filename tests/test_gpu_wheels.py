"""The offline wheel transfer (scripts/gpu/wheels.py, fetch_wheels.sh, install_wheels.sh): a wheel
trimmed of folders installs what is left with a matching RECORD; a layout keeps every folder
within the limit and splits what is larger; the parts join back into the same bytes, checked, and a
missing or damaged part is an error naming it."""
from __future__ import annotations

import os
import subprocess
import zipfile

import pytest

from .scripts import ROOT, load_script

wheels = load_script("scripts/gpu/wheels.py", "gpu_wheels")
MIB = wheels.MIB


def make_wheel(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        record = "".join(f"{n},sha256=x,{len(d)}\n" for n, d in members.items()) + "pkg-1.dist-info/RECORD,,\n"
        z.writestr("pkg-1.dist-info/RECORD", record)


def test_trim_drops_the_folders_and_their_record_lines(tmp_path):
    src, dst = tmp_path / "pkg-1-py3-none-any.whl", tmp_path / "out" / "pkg-1-py3-none-any.whl"
    dst.parent.mkdir()
    make_wheel(src, {"pkg/__init__.py": b"x", "pkg/data/csrc/big/a.cu": b"a" * 100, "pkg/data/csrc/keep.cu": b"k"})
    assert wheels.trim(src, dst, ["pkg/data/csrc/big/"]) == 1
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = z.read("pkg-1.dist-info/RECORD").decode()
    assert names == {"pkg/__init__.py", "pkg/data/csrc/keep.cu", "pkg-1.dist-info/RECORD"}
    assert "big/" not in record and "keep.cu" in record


def test_layout_then_join_gives_the_same_wheels(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"big-1-py3-none-any.whl": int(2.5 * MIB), "mid-1-py3-none-any.whl": int(0.9 * MIB),
             "small-1-py3-none-any.whl": 1000}
    for name, n in sizes.items():
        (src / name).write_bytes(os.urandom(n))
    folders = wheels.layout(src, tmp_path / "out", limit_mib=1.5, part_mib=1.0)
    assert len(folders) >= 3
    for d in folders:
        assert sum(p.stat().st_size for p in d.iterdir()) <= 1.5 * MIB, d
    assert len([p for d in folders for p in d.glob("big-*.part-*")]) == 3
    stash = tmp_path / "stash"
    stash.mkdir()
    for d in folders[:-1]:  # one transfer still to come: nothing joined, the missing folder named
        for p in d.iterdir():
            (stash / p.name).write_bytes(p.read_bytes())
    with pytest.raises(SystemExit, match="missing"):
        wheels.join(stash, tmp_path / "whl")
    assert not (tmp_path / "whl").exists() or not list((tmp_path / "whl").glob("*.whl"))
    for p in folders[-1].iterdir():
        (stash / p.name).write_bytes(p.read_bytes())
    done = wheels.join(stash, tmp_path / "whl")
    assert sorted(w.name for w in done) == sorted(sizes)
    for w in done:
        assert w.read_bytes() == (src / w.name).read_bytes()
    part = next(stash.glob("big-*.part-01"))
    part.write_bytes(b"\0" + part.read_bytes()[1:])
    with pytest.raises(SystemExit, match="SHA-256"):
        wheels.join(stash, tmp_path / "whl2")


def test_the_shell_scripts_parse():
    for rel in ("scripts/gpu/fetch_wheels.sh", "scripts/gpu/install_wheels.sh", "scripts/gpu/device_setup.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / rel)]).returncode == 0, rel
