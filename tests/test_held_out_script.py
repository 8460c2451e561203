"""scripts/gpu/tree_held_out.py's selections on the CPU: the tree route keeps the scenarios the Gluon tree option
takes, the fp8 route the ones with an FP8 cache and no MLA case (what the GPU run then checks against the reference)."""
from __future__ import annotations

import subprocess
import sys

from .scripts import ROOT, load_script

held = load_script("scripts/gpu/tree_held_out.py", "tree_held_out_under_test")


def draw(tmp_path, seed, profile):
    subprocess.run([sys.executable, "scripts/gpu/random_scenarios.py", "--n", "24", "--seed", str(seed), "--out",
                    str(tmp_path), "--profile", profile], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return sorted(tmp_path.glob("*.yaml"))


def test_the_fp8_route_keeps_fp8_caches_without_mla(tmp_path):
    files = draw(tmp_path, 930, "all")
    keep = held.with_fp8(files)
    assert keep, "seed 930 draws FP8 caches"
    text = {f: f.read_text() for f in files}
    for f in files:
        fp8 = "fp8_e" in text[f]
        mla = "mla" in text[f]
        assert (f in keep) == (fp8 and not mla), (f.name, fp8, mla)


def test_the_tree_route_keeps_16_bit_trees(tmp_path):
    files = draw(tmp_path, 918, "flashinfer")
    from attnbench.backends import triton_tree_gluon

    hopper = triton_tree_gluon.hopper
    keep = held.eligible(files)
    assert triton_tree_gluon.hopper is hopper, "the Hopper check is the real one again after the selection"
    assert keep and len(keep) < len(files)
    assert all("tree" in f.read_text() and "fp8_e" not in f.read_text() for f in keep)
