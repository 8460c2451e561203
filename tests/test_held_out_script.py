"""scripts/gpu/tree_held_out.py's selections on the CPU: the tree route keeps the scenarios the Gluon tree option
takes, the fp8 route the ones with an FP8 cache and no MLA case (what the GPU run then checks against the reference)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .scripts import ROOT, load_script

held = load_script("scripts/gpu/tree_held_out.py", "tree_held_out_under_test")


def draw(tmp_path, seed, profile):
    subprocess.run([sys.executable, "scripts/gpu/random_scenarios.py", "--n", "24", "--seed", str(seed), "--out",
                    str(tmp_path), "--profile", profile], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return sorted(tmp_path.glob("*.yaml"))


@pytest.mark.slow
def test_the_fp8_route_keeps_fp8_caches_without_mla(tmp_path):
    files = draw(tmp_path, 930, "all")
    keep = held.with_fp8(files)
    assert keep, "seed 930 draws FP8 caches"
    text = {f: f.read_text() for f in files}
    for f in files:
        fp8 = "fp8_e" in text[f]
        mla = "mla" in text[f]
        assert (f in keep) == (fp8 and not mla), (f.name, fp8, mla)


@pytest.mark.slow
def test_the_tree_route_keeps_16_bit_trees(tmp_path):
    files = draw(tmp_path, 918, "flashinfer")
    from attnbench.backends import triton_tree_gluon

    hopper = triton_tree_gluon.hopper
    keep = held.eligible(files)
    assert triton_tree_gluon.hopper is hopper, "the Hopper check is the real one again after the selection"
    assert keep and len(keep) < len(files)
    assert all("tree" in f.read_text() and "fp8_e" not in f.read_text() for f in keep)


mla_held = load_script("scripts/gpu/mla_held_out.py", "mla_held_out_under_test")


def test_the_mla_draws_are_decodes_of_deepseeks_latent_row_the_gluon_kernel_takes(monkeypatch):
    """Every draw is a batch of MLA decodes the Gluon MLA option takes on Hopper (its ``unwanted`` empty), over
    the head counts, pages and layouts; the same seed draws the same batches."""
    from attnbench.backends import triton_mla_gluon as mg
    from attnbench.workload.batch import materialize

    specs = mla_held.draw(950, 60)
    assert [mla_held.describe(s) for s in specs] == [mla_held.describe(s) for s in mla_held.draw(950, 60)]
    monkeypatch.setattr(mg, "hopper", lambda device: True)
    small = [s for s in specs if max(r.context for r in s.requests) < 4096][:6]
    assert small and all(mg.unwanted(materialize(s, 0)) == "" for s in small)
    assert {s.page_size for s in specs} == set(mla_held.PAGES) and {s.layout for s in specs} == set(mla_held.LAYOUTS)
    assert len({s.num_q_heads for s in specs}) >= 8


def test_the_mla_check_runs_the_default_backend_against_the_reference_on_the_cpu(monkeypatch):
    """Off Hopper (the interpreter here) the check expects the Triton MLA kernel and a right answer.
    The MLA kernels are imported interpreted here (test_mla_triton's import): run alone, this test
    imported them compiled on its first launch and failed on triton's "0 active drivers"."""
    from attnbench.workload.batch import BatchSpec, Request

    from .test_mla_triton import INTERPRETED

    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process: test_mla_triton runs its kernels in a fresh one")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = BatchSpec((Request("decode", 1, 70), Request("decode", 1, 3)), 16, 1, 576, "float16", 16, "shuffled",
                     attention="mla", kv_lora_rank=512, rope_dim=64)
    ok, line = mla_held.check(spec, 1, "cpu")
    assert ok, line
    assert "gluon" not in line.lower()


@pytest.mark.slow
def test_the_mla_route_keeps_scenarios_with_a_case_the_gluon_mla_kernel_takes(tmp_path):
    files = draw(tmp_path, 941, "all")
    from attnbench.backends import triton_mla_gluon

    hopper = triton_mla_gluon.hopper
    keep = held.with_mla_gluon(files)
    assert triton_mla_gluon.hopper is hopper
    assert keep and all("mla" in f.read_text() for f in keep)
    assert len(keep) < len(files)


@pytest.mark.slow
def test_the_decode_route_keeps_fp8_decode_draws_the_gluon_decode_kernel_takes(tmp_path):
    """``--profile decode`` draws decodes alone over FP8 caches with the attention variants; the decode route keeps
    the scenarios with a case the Gluon decode option takes (windows, sinks and soft-capping among them) and leaves
    out the ones it refuses (head dims past 128, pages under 16 keys, ALiBi)."""
    files = draw(tmp_path, 990, "decode")
    from attnbench.backends import triton_decode_gluon
    from attnbench.workload import scenario as sc

    hopper = triton_decode_gluon.hopper
    keep = held.with_decode_gluon(files)
    assert triton_decode_gluon.hopper is hopper
    assert 0 < len(keep) < len(files)
    for f in files:
        specs = [c.scenario.batch_spec() for c in sc.load(f).cases]
        assert all(str(s.kv_dtype).startswith("fp8") and {r.kind for r in s.requests} == {"decode"}
                   for s in specs), f.name
    variants = [sc.load(f).scenario.model for f in keep]
    assert any(m.window for m in variants) and any(m.sinks for m in variants) and any(m.softcap for m in variants)


def test_the_runs_go_several_at_a_time_and_report_in_order(tmp_path, monkeypatch):
    """``run_all``: ``jobs`` runs at once, each file's lines said in the files' order, rows and failures summed; a
    run started with under 15 s of the budget left is not run, and one that wrote no row counts as a failure."""
    import threading
    import time

    active, peak, lock = [0], [0], threading.Lock()

    def fake(f, out, left):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2 if f.stem != "c" else 0.05)
        with lock:
            active[0] -= 1
        if f.stem == "d":
            return [f"{f.name}: no row"], 0, 1
        return [f"{f.name} x: ok", f"{f.name} y: {'mismatch' if f.stem == 'b' else 'ok'}"], 2, int(f.stem == "b")

    monkeypatch.setattr(held, "run_one", fake)
    said = []
    files = [tmp_path / f"{n}.yaml" for n in "abcd"]
    assert held.run_all(files, tmp_path, 100.0, jobs=3, say=said.append) == (6, 2)
    assert [line.split()[0].rstrip(":") for line in said] == ["a.yaml", "a.yaml", "b.yaml", "b.yaml", "c.yaml",
                                                               "c.yaml", "d.yaml"]
    assert peak[0] == 3
    monkeypatch.undo()
    assert held.run_one(files[0], tmp_path / "r", 10.0) == (["a.yaml: not run (budget)"], 0, 0)
