"""scripts/gpu/flashinfer_cache.py: FlashInfer's built modules packed on one GPU machine and put
where FlashInfer loads them without a build on the next (its AOT folder), on fake folders here."""
from __future__ import annotations

import pytest
import io
import os
import tarfile
from pathlib import Path

from .scripts import load_script


def _mod():
    return load_script("scripts/gpu/flashinfer_cache.py")


def _jit(tmp_path, sizes: dict[str, int]) -> Path:
    jit = tmp_path / "cached_ops"
    for name, n in sizes.items():
        (jit / name).mkdir(parents=True)
        (jit / name / f"{name}.so").write_bytes(os.urandom(n))  # random: xz cannot shrink it
        (jit / name / "build.ninja").write_text("rule x\n")
    (jit / "half_built").mkdir()  # a build without its .so is not a module
    (jit / "half_built" / "x.cuda.o").write_bytes(b"o")
    return jit


def test_save_then_restore_gives_the_same_libraries(tmp_path, capsys):
    fc = _mod()
    jit = _jit(tmp_path, {"batch_prefill_a": 3000, "pod_b": 5000, "decode_c": 1000})
    assert fc.main(["save", str(tmp_path / "out"), "--jit-dir", str(jit), "--aot-dir", str(tmp_path / "unused")]) == 0
    parts = sorted((tmp_path / "out").glob("fijit-*.tar"))
    assert parts and "half_built" not in capsys.readouterr().out
    aot = tmp_path / "aot"
    assert fc.main(["restore", str(tmp_path / "out"), "--jit-dir", str(jit), "--aot-dir", str(aot)]) == 0
    for name in ("batch_prefill_a", "pod_b", "decode_c"):
        assert (aot / name / f"{name}.so").read_bytes() == (jit / name / f"{name}.so").read_bytes()
    assert not (aot / "half_built").exists()
    assert "3 prebuilt modules" in capsys.readouterr().out


def test_parts_respect_the_limits_and_prefer_named_modules():
    fc = _mod()
    sizes = {"a": 4, "b": 6, "pod_x": 9, "c": 3, "huge": 20}
    parts, left = fc.plan_parts(sizes, part=10, total=22, prefer=["pod"])
    assert parts[0][0] == "pod_x"  # preferred first, whatever its size
    assert all(sum(sizes[n] for n in p) <= 10 for p in parts)
    packed = [n for p in parts for n in p]
    assert sum(sizes[n] for n in packed) <= 22 and "huge" in left  # over a part: never packed
    assert sorted(packed + left) == sorted(sizes)
    assert parts == [["pod_x"], ["c", "a"], ["b"]]  # then the smallest first, each into the first part it fits


def test_restore_skips_members_outside_name_name_so(tmp_path, capsys):
    fc = _mod()
    src = tmp_path / "fijit"
    src.mkdir()
    with tarfile.open(src / "fijit-0.tar", "w") as tar:
        for member in ("../evil/evil.so.xz", "a/b.so.xz"):
            info = tarfile.TarInfo(member)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    aot = tmp_path / "aot"
    assert fc.main(["restore", str(src), "--jit-dir", str(tmp_path), "--aot-dir", str(aot)]) == 0
    out = capsys.readouterr().out
    assert "skipped '../evil/evil.so.xz'" in out and "skipped 'a/b.so.xz'" in out and "0 prebuilt modules" in out
    assert not (tmp_path / "evil").exists() and not any(aot.rglob("*.so"))


def test_without_flashinfer_or_a_cache_nothing_happens(tmp_path, capsys):
    fc = _mod()
    assert fc.main(["restore", str(tmp_path / "none"), "--jit-dir", str(tmp_path), "--aot-dir", str(tmp_path / "a")]) == 0
    assert "nothing to restore" in capsys.readouterr().out
    assert fc.main(["save", str(tmp_path / "o"), "--jit-dir", str(tmp_path / "no"), "--aot-dir", str(tmp_path)]) == 0
    assert "no built module" in capsys.readouterr().out


@pytest.mark.slow
def test_compression_stops_at_the_carry_budget_preferred_first(tmp_path):
    fc = _mod()
    mib = fc.MIB
    jit = _jit(tmp_path, {"a_small": mib + mib // 4, "pod_big": 2 * mib, "b_mid": mib + mib // 2})
    kept = fc.compress(fc.built(jit), ["pod"], total=3 * mib + mib // 8, max_s=60)
    assert list(kept) == ["pod_big"]  # preferred first; neither other one fits beside it (random bytes: no gain)
    kept = fc.compress(fc.built(jit), [], total=3 * mib + mib // 8, max_s=60)
    assert list(kept) == ["a_small", "b_mid"]  # the smallest first
    assert fc.compress(fc.built(jit), [], total=10 * mib, max_s=-1) == {}  # no time: nothing compressed


@pytest.mark.slow
def test_save_lists_what_it_left_out_compressed_or_not(tmp_path, capsys):
    """On the GPU machine save stopped at the byte budget, then failed listing a module it had not
    compressed (its compressed size unknown); the parts it wrote are kept and every leftover listed."""
    fc = _mod()
    mib = fc.MIB
    jit = _jit(tmp_path, {"pod_a": 2 * mib, "pod_b": 2 * mib, "c": mib + mib // 2})
    assert fc.main(["save", str(tmp_path / "o"), "--jit-dir", str(jit), "--aot-dir", str(tmp_path),
                    "--max-mb", "3", "--part-mb", "3"]) == 0
    out = capsys.readouterr().out
    assert len(list((tmp_path / "o").glob("fijit-*.tar"))) == 1
    # no --prefer: the smallest first; neither 2 MiB module fits beside it
    assert "1 modules, 1.5 MiB" in out and "left out: c" not in out
    assert "left out: pod_a (2.0 MiB, not compressed)" in out and "left out: pod_b (2.0 MiB, not compressed)" in out
