"""scripts/gpu/random_scenarios.py: seeded random scenarios for the GPU correctness sweep
(issue 32: batches nobody wrote by hand). Every draw kept is a scenario the loader accepts, the
same seed gives the same files, the FlashInfer profile stays within what its JIT builds quickly,
and a few small draws run on the CPU through every CPU backend, each row right."""
import random
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.scenario import load

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
import random_scenarios as rs  # noqa: E402


def test_draws_are_valid_varied_and_reproducible(tmp_path):
    docs = rs.generate(40, seed=5)
    assert docs == rs.generate(40, seed=5)
    assert docs != rs.generate(40, seed=6)
    kinds = {g["kind"] for d in docs for g in d["batch"]}
    assert kinds == {"decode", "prefill", "tree"}
    assert len({d["kv_cache"]["page_size"] for d in docs}) >= 5
    assert any("window" in d["model"] for d in docs) and any(d["kv_cache"].get("dtype") for d in docs)
    assert rs.main(["--n", "6", "--seed", "5", "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.yaml"))
    assert len(files) == 6
    for f in files:
        assert load(f).cases  # each file loads as written


def test_flashinfer_profile_keeps_quick_builds():
    for d in rs.generate(30, seed=2, profile="flashinfer"):
        m = d["model"]
        assert m.get("attention", "mha") == "mha"
        assert m["head_dim"] in (64, 128) and m["dtype"] in ("bfloat16", "float16")


def test_plain_draws_are_ones_the_narrow_libraries_read():
    docs = rs.generate(40, seed=4)
    plain = [d for d in docs if d["kv_cache"]["page_size"] in (64, 256, 512) and d["model"].get("head_dim") == 128
             and set(d["model"]) == {"num_q_heads", "num_kv_heads", "head_dim", "dtype"}]
    assert len(plain) >= 8
    for d in rs.generate(10, seed=4, profile="plain"):
        assert set(d["model"]) == {"num_q_heads", "num_kv_heads", "head_dim", "dtype"} and d["model"]["head_dim"] == 128
        assert d["kv_cache"]["page_size"] % 64 == 0 and "dtype" not in d["kv_cache"]


def test_a_refused_draw_is_drawn_again(monkeypatch):
    calls = []
    real = rs.draw_scenario

    def every_other_is_bad(seed, index, profile="all", max_nodes=64):
        calls.append(index)
        doc = real(seed, index, profile, max_nodes)
        if index % 2 == 0:
            doc["model"]["num_kv_heads"] = doc["model"].get("num_q_heads", 1) + 1  # more kv heads than q: refused
        return doc

    monkeypatch.setattr(rs, "draw_scenario", every_other_is_bad)
    docs = rs.generate(3, seed=1)
    assert len(docs) == 3 and all(int(d["name"].rsplit("-", 1)[1]) % 2 == 1 for d in docs)
    assert calls[:6] == [0, 1, 2, 3, 4, 5]


@pytest.mark.slow
def test_small_random_draws_are_right_on_every_cpu_backend(tmp_path):
    """A handful of the smallest draws of a seed, run by `attnbench run` on the CPU through the
    reference, sdpa and both flex routes: every row ok (checked against the float64 reference)."""
    picked = []
    for d in rs.generate(40, seed=13):
        if d["model"].get("attention") == "mla":
            continue
        sf = load_doc(d, tmp_path)
        if sf.cases[0].scenario.batch_spec().memory_bytes() < 3e6:
            picked.append(d)
        if len(picked) == 4:
            break
    assert len(picked) == 4
    runner = CliRunner()
    for d in picked:
        path = tmp_path / f"{d['name']}.yaml"
        out = tmp_path / f"run-{d['name']}"
        res = runner.invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu", "-q", "-b", "reference",
                                  "-b", "sdpa", "-b", "flex", "-b", "flex:mask=dense", "--measure-ms", "1",
                                  "--warmup-ms", "0"])
        assert res.exit_code == 0, (d["name"], res.output)
        import pandas as pd

        df = pd.read_csv(out / "results.csv")
        ran = df[df.status != "skipped"]
        assert len(ran) >= 2 and set(ran.status) == {"ok"}, (d["name"], df[["backend", "status", "reason"]])


def load_doc(doc, folder: Path):
    path = folder / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load(path)


def test_tree_draws_cover_every_spelling():
    r = random.Random(0)
    spellings = {next(iter(rs.draw_tree(r))) for _ in range(300)}
    assert spellings == {"chain", "full", "random", "choices", "branching", "preset"}


@pytest.mark.slow
def test_max_nodes_draws_trees_past_one_ancestor_word(tmp_path):
    """--max-nodes 192: random trees of up to 192 nodes (two and three 64-bit ancestor words), every draw a
    scenario the loader takes with its big tree in the batch; the default (64) draws no more than 64."""
    def random_nodes(docs):
        return [g["tree"]["random"]["nodes"] for d in docs for g in d["batch"]
                if g["kind"] == "tree" and "random" in g["tree"]]

    docs = rs.generate(60, seed=7, max_nodes=192)
    big = [n for n in random_nodes(docs) if n > 64]
    assert big and max(big) <= 192
    assert max(random_nodes(rs.generate(60, seed=7))) <= 64
    assert rs.main(["--n", "30", "--seed", "7", "--max-nodes", "192", "--out", str(tmp_path)]) == 0
    sizes = [r.query for f in sorted(tmp_path.glob("*.yaml")) for c in load(f).cases
             for r in c.scenario.batch_spec().requests if r.kind == "tree"]
    assert max(sizes) > 64
    with pytest.raises(SystemExit):
        rs.main(["--n", "1", "--max-nodes", "1", "--out", str(tmp_path / "x")])


def test_routes_profile_reaches_the_narrow_triton_routes(monkeypatch):
    """The ``all`` draws of the GPU sweep never reached the Gluon tree kernel or either MLA route (seed
    5727 on an H200: 0 of 16 draws each): ``--profile routes`` draws, in turn, batches each of them takes.
    Checked with the routes' own refusals, Hopper and the Gluon kernels' triton assumed (the reasons a CPU and
    a newer triton add)."""
    from attnbench.kernels import routes
    from attnbench.kernels.mla import gluon as mla_gluon
    from attnbench.kernels.tree import gluon as tree_gluon
    from attnbench.workload.batch import materialize
    from attnbench.workload.scenario import load_text

    monkeypatch.setattr(tree_gluon, "hopper", lambda device: True)
    monkeypatch.setattr(mla_gluon, "hopper", lambda device: True)
    opts = routes.Options()
    docs = rs.generate(9, seed=11, profile="routes")
    assert docs == rs.generate(9, seed=11, profile="routes")
    taken = {name: 0 for name in rs.ROUTE_TARGETS}
    for d in docs:
        sf = load_text(yaml.safe_dump(d, sort_keys=False), f"{d['name']}.yaml")
        batch = materialize(sf.cases[0].scenario.batch_spec(), 0)
        for name in taken:
            taken[name] += not routes.BY_NAME[name].refusals(batch, opts)
    assert all(n >= 2 for n in taken.values()), taken
