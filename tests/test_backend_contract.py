"""The backend contract: declared capabilities -> standard reasons, the mode read from the
plan, and plugins that implement only plan/run."""
from __future__ import annotations

import pathlib

import torch

from attnbench.backend import BUILTIN, Backend, get_backend_class
from attnbench.workload.batch import Request
from attnbench.workload.trees import chain, full

from .conftest import make_batch

ROOT = pathlib.Path(__file__).resolve().parents[1]
TREE = tuple(full({"depth": 2, "branching": 2}))


class Bare(Backend):
    """Declares nothing: implements plan/run only, as plugins written before capabilities."""

    name = "bare"

    def plan(self, batch):
        return batch

    def run(self, plan):
        return plan.q


class Declared(Bare):
    name = "declared"
    label = "Lib"
    cuda_only = True
    dtypes = (torch.float16, torch.bfloat16)
    head_dims = (64, 128)
    page_size_multiple = 8
    max_page_size = 16
    max_group = 2
    kinds = ("decode", "tree")
    max_tree_shapes = 1
    trees_need_context = True


def odd_batch():
    """float32 on the CPU, head_dim 32, page 3 (not a multiple of 8), group 4, a prefill, two
    tree shapes, one tree without context."""
    reqs = [Request("prefill", 3, 5), Request("tree", len(TREE), 0, TREE), Request("tree", 4, 9, tuple(chain(3)))]
    return make_batch(reqs, hq=8, hkv=2, d=32, page_size=3)


def test_a_backend_that_declares_nothing_is_never_skipped_by_capabilities():
    be = Bare()
    assert be.reasons(odd_batch()) == []
    assert be.reasons(make_batch([Request("decode", 1, 5)], hq=6, hkv=4)) == [
        "num_q_heads 6 is not a multiple of num_kv_heads 4"
    ]
    assert not Bare.converts() and be.prepare(odd_batch()) is not None


def test_each_declared_capability_gives_its_reason_once():
    r = Declared().reasons(odd_batch())
    assert r == [
        "Lib runs on CUDA devices only",
        "Lib takes float16/bfloat16, not float32",
        "Lib supports head_dim 64, 128, got 32",
        "Lib needs page_size divisible by 8, got 3",
        "Lib takes at most 2 query heads per KV head, got 4",
        "Lib does not compute prefill requests",
        "Lib takes one tree for the whole batch; this batch has 2 tree shapes",
        "Lib needs a prefix (context >= 1) for every tree request",
    ]
    big = make_batch([Request("decode", 1, 40)], hq=2, hkv=1, d=64, dtype="float16", page_size=32)
    assert Declared().reasons(big) == ["Lib runs on CUDA devices only", "Lib takes page_size at most 16, got 32"]


def test_head_dim_multiple_and_maximum():
    class Multiple(Bare):
        name = "multiple"
        head_dim_multiple = 8
        max_head_dim = 64

    assert Multiple().reasons(make_batch([Request("decode", 1, 3)], d=12)) == [
        "multiple needs head_dim a multiple of 8 and at most 64, got 12"
    ]
    assert Multiple().reasons(make_batch([Request("decode", 1, 3)], d=128))
    assert Multiple().reasons(make_batch([Request("decode", 1, 3)], d=64)) == []


def test_standard_reasons_are_written_once_in_the_source():
    """The wording lives in backend/reasons.py only; no backend writes it out again."""
    for needle in ("is not a multiple of num_kv_heads", "runs on CUDA devices only", "needs page_size divisible"):
        hits = [p for p in list((ROOT / "backends").glob("*.py")) + list((ROOT / "attnbench").rglob("*.py"))
                if needle in p.read_text()]
        assert [p.relative_to(ROOT).as_posix() for p in hits] == ["attnbench/backend/reasons.py"], (needle, hits)


def test_builtin_backends_declare_instead_of_writing_prose():
    for name in BUILTIN:
        cls = get_backend_class(name)
        assert not hasattr(cls, "mode") or not isinstance(getattr(cls, "mode"), str), name
    fa, fi, xf, tr = (get_backend_class(n) for n in ("flash-attn", "flashinfer", "xformers", "triton"))
    assert fa.cuda_only and fa.page_size_multiple == 256 and fa.dtypes
    assert fi.cuda_only and fi.head_dims == (64, 128, 256)
    assert xf.page_size_multiple == 64 and xf.max_tree_shapes == 1 and xf.trees_need_context
    assert tr.max_page_size is None and tr.max_group == 128 and not tr.cuda_only  # any page size (tests/test_triton_backend.py: 512, 1024)


def test_the_row_mode_comes_from_the_plan(tmp_path):
    """The runner copies the plan's ``mode``; the backend holds no per-plan state."""
    from attnbench.backend import registry
    from attnbench.execute.options import RunOptions
    from attnbench.execute.runner import Runner
    from attnbench.workload.scenario import load_text

    class Plan:
        def __init__(self, batch, mode):
            self.batch, self.mode = batch, mode

    class Routed(Bare):
        name = "routed"

        def plan(self, batch):
            from attnbench.workload.reference import reference_attention

            self.out = reference_attention(batch)[0].to(batch.dtype)
            return Plan(batch, "tree-route" if any(r.kind == "tree" for r in batch.requests) else "flat")

        def run(self, plan):
            return self.out.clone()

    registry.register(Routed)
    text = """
model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
device: cpu
batch:
  - {kind: tree, count: 1, context: 7, tree: {chain: 2}}
backends: [routed]
timing: {warmup_ms: 0, measure_ms: 1, min_runs: 1}
"""
    rows = list(Runner(load_text(text), RunOptions(measure_ceilings=False)).rows())
    assert [r.id.mode for r in rows] == ["tree-route"] and rows[0].status == "ok", rows[0].reason
