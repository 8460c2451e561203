"""Multi-head latent attention (docs/semantics.md "MLA"): the scenario fields and their
messages, the reference against a formula written out here, the counting, the CPU backends
(sdpa, flex) against the reference, and the skipped rows of backends without MLA."""
from __future__ import annotations

import math

import pytest
import torch

from attnbench.backend import Backend, get_backend_class
from attnbench.measure.metrics import work_of
from attnbench.store.tensors import save_case_tensors
from attnbench.workload.batch import LAYOUTS, BatchSpec, Request, materialize
from attnbench.workload.messages import ScenarioError
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.scenario import load_text
from attnbench.workload.trees import ancestor_mask, chain, from_choices, random_tree

from .scripts import load_script

TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1], [1, 0]]))
RANDOM_TREE = tuple(random_tree({"nodes": 11, "max_depth": 4, "max_children": 3, "seed": 2}))
MIXED = [
    Request("decode", 1, 37),
    Request("prefill", 13, 20),  # chunked prefill, absorbed form
    Request("tree", len(TREE), 11, TREE),
    Request("tree", 4, 9, tuple(chain(3))),  # an MTP chain of 3 drafts
    Request("prefill", 5, 0),
    Request("tree", len(RANDOM_TREE), 0, RANDOM_TREE),
]


def mla_batch(reqs, *, hq=4, rank=32, rope=16, dtype="float32", page=4, layout="shuffled", seed=0, scale=None):
    spec = BatchSpec(tuple(reqs), hq, 1, rank + rope, dtype, page, layout, scale,
                     attention="mla", kv_lora_rank=rank, rope_dim=rope)
    return materialize(spec, seed)


def formula(batch) -> torch.Tensor:
    """The MLA output written out per request and head in float64, from the cache pages."""
    rank = batch.spec.kv_lora_rank
    outs = []
    for i, r in enumerate(batch.requests):
        pages = batch.block_table[i, : -(-r.kv_len // batch.page_size)].long()
        rows = batch.k_cache[pages].reshape(-1, batch.head_dim)[: r.kv_len].double()  # [L, rank + rope]
        for t in range(r.query):
            if r.tree_parents is None:
                seen = torch.arange(r.kv_len) <= r.context + t
            else:
                seen = torch.cat([torch.ones(r.context, dtype=torch.bool), ancestor_mask(r.tree_parents)[t]])
            q = batch.q[batch.query_start[i] + t].double()  # [H, rank + rope]
            s = (q @ rows.T) * batch.scale
            p = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)
            outs.append(p @ rows[:, :rank])
    return torch.stack(outs)


def scenario(model: str, extra: str = "") -> str:
    return f"model: {model}\nbatch: [{{kind: decode, count: 2, context: 100}}]\n{extra}"


# -- scenario -------------------------------------------------------------------------------
def test_deepseek_scenario_shapes_and_default_scale():
    sf = load_text(scenario("{attention: mla, num_q_heads: 16, kv_lora_rank: 512, rope_dim: 64, dtype: bfloat16}"))
    spec = sf.scenario.batch_spec()
    assert (spec.num_kv_heads, spec.head_dim, spec.v_head_dim, spec.attention) == (1, 576, 512, "mla")
    assert spec.scale == pytest.approx(1 / math.sqrt(192))  # the original 128 + 64 head, not 576
    batch = materialize(spec, 0)
    assert batch.q.shape == (2, 16, 576) and batch.k_cache.shape[2:] == (1, 576)
    assert batch.out_shape == (2, 16, 512)
    assert batch.v_cache.data_ptr() == batch.k_cache.data_ptr() and batch.v_cache.shape[-1] == 512


def test_mla_defaults_and_scale_fields():
    spec = load_text(scenario("{attention: mla, num_q_heads: 8}")).scenario.batch_spec()
    assert (spec.kv_lora_rank, spec.rope_dim, spec.head_dim) == (512, 64, 576)
    spec = load_text(scenario("{attention: mla, num_q_heads: 8, qk_nope_head_dim: 64}")).scenario.batch_spec()
    assert spec.scale == pytest.approx((64 + 64) ** -0.5)
    spec = load_text(scenario("{attention: mla, num_q_heads: 8, scale: 0.25}")).scenario.batch_spec()
    assert spec.scale == 0.25


@pytest.mark.parametrize("model, words", [
    ("{attention: mla, num_q_heads: 16, num_kv_heads: 8}", ["num_kv_heads", "leave num_kv_heads out"]),
    ("{attention: mla, num_q_heads: 16, kv_lora_rank: 512, rope_dim: 64, head_dim: 512}", ["head_dim", "576"]),
    ("{num_q_heads: 16, num_kv_heads: 1, head_dim: 576, kv_lora_rank: 512}", ["kv_lora_rank", "attention: mla"]),
    ("{num_q_heads: 16, head_dim: 128}", ["num_kv_heads is required", "attention: mla"]),
    ("{attention: mla, num_q_heads: 16, kv_lora_rank: 0}", ["kv_lora_rank"]),
    ("{attention: gqa, num_q_heads: 16}", ["attention"]),
    ("{attention: mla, num_q_heads: 16, window: 128}", ["does not take window"]),
    ("{attention: mla, num_q_heads: 16, sinks: true}", ["does not take sinks"]),
])
def test_bad_mla_models_name_the_field(model, words):
    with pytest.raises(ScenarioError) as e:
        load_text(scenario(model), "bad.yaml")
    msg = str(e.value)
    assert msg.startswith("bad.yaml: model") and "Traceback" not in msg
    for w in words:
        assert w in msg, msg


def test_cli_rejects_bad_mla_scenario_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli import app

    f = tmp_path / "bad.yaml"
    f.write_text(scenario("{attention: mla, num_q_heads: 16, num_kv_heads: 2}"))
    r = CliRunner().invoke(app, ["validate", str(f)])
    assert r.exit_code == 2 and "num_kv_heads" in r.output


def test_spec_refuses_inconsistent_mla_fields():
    with pytest.raises(ValueError, match="num_kv_heads must be 1"):
        BatchSpec((Request("decode", 1, 3),), 4, 2, 48, attention="mla", kv_lora_rank=32, rope_dim=16)
    with pytest.raises(ValueError, match="head_dim must be"):
        BatchSpec((Request("decode", 1, 3),), 4, 1, 40, attention="mla", kv_lora_rank=32, rope_dim=16)


# -- reference and counting -----------------------------------------------------------------
@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.slow
def test_reference_is_the_formula(page):
    batch = mla_batch(MIXED, page=page)
    ref, lse = reference_attention(batch)
    assert ref.shape == (batch.num_tokens, 4, 32) and lse.shape == (batch.num_tokens, 4)
    assert torch.allclose(ref.double(), formula(batch), atol=1e-6)


def test_reference_uses_the_rope_dims_and_the_scale():
    batch = mla_batch(MIXED[:2])
    ref = reference_attention(batch)[0]
    batch.k_cache[..., 32:] = torch.randn_like(batch.k_cache[..., 32:])  # k_rope moves the scores
    assert not torch.allclose(reference_attention(batch)[0], ref)
    other = mla_batch(MIXED[:2], scale=0.05)
    assert not torch.allclose(reference_attention(other)[0], ref)


def test_work_counts_the_latent_once_and_the_absorbed_flops():
    reqs = (Request("decode", 1, 1000), Request("tree", 6, 50, TREE))
    spec = BatchSpec(reqs, 16, 1, 576, "bfloat16", 64, "shuffled", attention="mla", kv_lora_rank=512, rope_dim=64)
    w = work_of(spec)
    slots = 1001 + 56
    pairs = 1001 + 6 * 50 + sum(d + 1 for d in (0, 1, 1, 2, 2, 2))
    table = 4 * (math.ceil(1001 / 64) + math.ceil(56 / 64))
    assert w.bytes == slots * 576 * 2 + 7 * 16 * (576 + 512) * 2 + table + 4 * 3 * 2 + 4 * 6
    assert w.flops == 2 * (576 + 512) * 16 * pairs


# -- backends -------------------------------------------------------------------------------
def run_backend(name, batch):
    be = get_backend_class(name)()
    assert be.reasons(batch) == []
    out = be.run(be.plan(be.convert(batch)))
    assert out.shape == batch.out_shape and out.dtype == batch.dtype
    rel, _ = compare(out, reference_attention(batch)[0])
    assert rel < default_tolerance(batch.dtype), f"{name}: rel err {rel}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdpa", "flex", "reference"])
@pytest.mark.parametrize("page, layout", [(1, "shuffled"), (4, "shuffled"), (16, "reversed"), (5, "interleaved")])
def test_cpu_backends_match_the_reference(name, page, layout):
    run_backend(name, mla_batch(MIXED, page=page, layout=layout, seed=page))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_equal_decodes_and_layouts(name, dtype):
    for layout in LAYOUTS:
        run_backend(name, mla_batch([Request("decode", 1, 50)] * 3, hq=8, dtype=dtype, layout=layout))


def test_sdpa_folds_heads_unless_the_mask_is_too_big(monkeypatch):
    from attnbench.backends import sdpa_mla

    decodes = sdpa_mla.convert(mla_batch([Request("decode", 1, 50)] * 3))
    assert decodes.folded and decodes.mask is None
    mixed = sdpa_mla.convert(mla_batch(MIXED))
    assert mixed.folded and mixed.mask.shape[2] == max(r.query for r in MIXED) * 4
    monkeypatch.setattr(sdpa_mla, "FOLD_MASK_LIMIT", 0)  # the broadcast route, as for long prefills
    assert not sdpa_mla.convert(mla_batch(MIXED)).folded
    for page in (1, 5):
        run_backend("sdpa", mla_batch(MIXED, page=page, seed=page))


def test_backends_without_mla_give_a_reason():
    class NoMla(Backend):
        name = "no-mla"

        def plan(self, batch):
            return batch

        def run(self, plan):
            raise AssertionError("never called")

    reasons = NoMla().reasons(mla_batch(MIXED[:1]))
    assert len(reasons) == 1 and "cannot compute multi-head latent attention" in reasons[0]
    for name in ("flash-attn", "xformers"):
        assert not get_backend_class(name).supports_mla


def test_flashinfer_mla_reasons_without_flashinfer():
    from attnbench.backends import flashinfer_mla

    batch = mla_batch(MIXED)
    why = flashinfer_mla.mla_reasons(batch, "fa2")
    assert any("512/64" in w for w in why) and any("no custom mask" in w and "2 tree" in w for w in why)
    ds = BatchSpec((Request("decode", 1, 10), Request("tree", 4, 9, tuple(chain(3)))), 16, 1, 576,
                   attention="mla", kv_lora_rank=512, rope_dim=64)
    assert flashinfer_mla.mla_reasons(materialize(ds, 0), "fa3") == []  # chains are causal


def test_flashinfer_mla_takes_one_token_noncausal_prefills():
    """A one-token prefill with causal: false sees every key of its request, as the causal mask
    lets it: no reason (random held-out MLA draws have them); several tokens still need one."""
    from attnbench.backends import flashinfer_mla

    def why(query):
        reqs = (Request("prefill", query, 0, causal=False), Request("prefill", query, 3058, causal=False),
                Request("decode", 1, 7))
        spec = BatchSpec(reqs, 16, 1, 576, attention="mla", kv_lora_rank=512, rope_dim=64)
        return flashinfer_mla.mla_reasons(materialize(spec, 0), "auto")

    assert why(1) == []
    assert any("causal: false" in w for w in why(3))


# -- the independent check of saved tensors -------------------------------------------------
@pytest.mark.slow
def test_check_saved_follows_the_semantics_alone(tmp_path):
    mod = load_script("scripts/gpu/check_saved.py")
    batch = mla_batch(MIXED, page=3)
    ref = reference_attention(batch)[0]
    wrong = ref.clone()
    wrong[..., 0] += 1.0
    save_case_tensors(tmp_path, "c", batch, {"good": ref, "bad": wrong})
    blob = torch.load(tmp_path / "c.pt", weights_only=True)
    assert torch.allclose(mod.mla_outputs(blob), formula(batch), atol=1e-9)
    assert mod.main([str(tmp_path)]) == 1  # "bad" is caught
    save_case_tensors(tmp_path, "c", batch, {"good": ref})
    assert mod.main([str(tmp_path)]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_latent_cache(kv_dtype, tmp_path):
    """One quantized latent cache: the values are its view, with the same scale; sdpa reads it
    dequantized; the kernels that read the model dtype only say so; the checker follows it."""
    spec = BatchSpec(tuple(MIXED), 4, 1, 48, "bfloat16", 4, "shuffled", kv_dtype=kv_dtype,
                     attention="mla", kv_lora_rank=32, rope_dim=16)
    batch = materialize(spec, 0)
    assert batch.k_cache.element_size() == 1 and batch.v_cache.data_ptr() == batch.k_cache.data_ptr()
    assert batch.v_scale is batch.k_scale
    ref = reference_attention(batch)[0]
    run_backend("sdpa", batch)
    assert work_of(spec).bytes < work_of(BatchSpec(tuple(MIXED), 4, 1, 48, "bfloat16", 4, attention="mla",
                                                   kv_lora_rank=32, rope_dim=16)).bytes
    from attnbench.backends import flashinfer_mla
    from attnbench.kernels.mla import plan as triton_mla

    assert any(kv_dtype in w for w in triton_mla.mla_problems(batch))
    assert any(kv_dtype in w for w in flashinfer_mla.mla_reasons(batch, "fa2"))
    mod = load_script("scripts/gpu/check_saved.py", "check_saved_fp8")
    save_case_tensors(tmp_path, "c", batch, {"reference": ref.to(batch.dtype)})
    blob = torch.load(tmp_path / "c.pt", weights_only=True)
    assert torch.allclose(mod.mla_outputs(blob).float(), ref, atol=1e-4)


# -- flex on the GPU's shared memory (issue 32) --------------------------------------------
def test_flex_smem_estimate_reproduces_the_h100_error():
    """torch's default flex tiles for head dims past 256 (64 x 32, 3 stages) on the 576/512 MLA
    latent in bf16: the H100's InductorError said 428032 bytes (232448 allowed)."""
    from attnbench.backends.flex import SMEM_LIMIT, flex_smem_bytes

    assert flex_smem_bytes(576, 512, 2, 64, 32, 3) == 428032
    assert SMEM_LIMIT == 232448


@pytest.mark.parametrize("hq, qmax, max_m", [(16, 1, 16), (128, 1, 128), (16, 61, 128), (128, 2, 128)])
@pytest.mark.parametrize("elsize", [2])
def test_flex_wide_tiles_fit_the_mla_latent(hq, qmax, max_m, elsize):
    from attnbench.backends.flex import SMEM_LIMIT, flex_smem_bytes, wide_tiles

    t = wide_tiles(576, 512, elsize, max_m)
    assert set(t) == {"BLOCK_M", "BLOCK_N", "num_stages", "num_warps"}
    assert t["BLOCK_M"] <= max_m and 128 % t["BLOCK_M"] == 0 and 128 % t["BLOCK_N"] == 0  # Flex's 128-blocks
    assert flex_smem_bytes(576, 512, elsize, t["BLOCK_M"], t["BLOCK_N"], t["num_stages"]) <= SMEM_LIMIT - 8192
    if max_m >= 32:
        assert t == {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 8}


def test_flex_keeps_torchs_tiles_up_to_256_and_refuses_what_cannot_fit():
    from attnbench.backends.flex import wide_tiles

    for d in (64, 80, 128, 192, 256):
        assert wide_tiles(d, d, 2) == {} and wide_tiles(d, d, 4) == {}  # torch's own choice, as before
    assert wide_tiles(576, 512, 4)["BLOCK_M"] == 16  # float32 fits only the smallest tiles (refused anyway)
    assert wide_tiles(8192, 8192, 2) is None


def test_flex_on_cpu_passes_no_tiles():
    b = mla_batch(MIXED, hq=4, rank=512, rope=64, dtype="float32")
    be = get_backend_class("flex")()
    plan = be.plan(be.convert(b))
    assert plan.kernel_options == {} and "tiles" not in plan.mode
