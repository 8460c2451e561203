"""Variants of the triton backend for one attnbench run on the device (docs/triton_notes.md):

  attnbench run attnbench/scenarios/tree-verify-llama3-8b.yaml -b triton -b triton-s2 ... \\
      --backend-file scripts/dev/triton_variants.py

Each class is the shipped backend with one setting changed, so a single run times them side
by side, every row checked against the reference. Not used by the tool itself. ``triton-r3`` is
the backend as shipped before issue 33's defaults round (``R3``: no prefill kernel, ``v_words``
off, FP8 decodes split as 16-bit ones, round 1's MLA config); ``triton-r1`` round 1's kernel.
"""
from __future__ import annotations

from attnbench.kernels.mla import plan as triton_mla
from attnbench.kernels.shared import plan as tp
from attnbench.backends.triton import TritonBackend
from attnbench.workload.mla import is_mla


def variant(name: str, waves: int | None = None, **kw):
    """A TritonBackend subclass named ``name`` built with ``kw`` (and ``waves`` splits-target
    waves for small row blocks, patched into the plan module while it plans)."""

    def __init__(self):
        TritonBackend.__init__(self, **kw)

    def plan(self, batch):
        old = tp.WAVES
        tp.WAVES = waves or old
        try:
            return TritonBackend.plan(self, batch)
        finally:
            tp.WAVES = old

    return type(name.replace("-", "_"), (TritonBackend,), {"name": name, "__init__": __init__, "plan": plan})


def with_constants(module, consts: dict, fn):
    """``fn`` (a backend method of one argument) run with ``module``'s constants set to ``consts``, then restored."""

    def call(self, arg):
        old = {k: getattr(module, k) for k in consts}
        for k, v in consts.items():
            setattr(module, k, v)
        try:
            return fn(self, arg)
        finally:
            for k, v in old.items():
                setattr(module, k, v)

    return call


def gluon_variant(name: str, **consts):
    """``triton-pf-gl`` with triton_prefill_gluon's module constants (TILE_KEYS, STAGES,
    COMPUTE_REGS, PERSISTENT, SPLIT_ROWS, EARLY_PAGE) set to ``consts`` while it runs."""
    from attnbench.kernels.prefill import gluon

    def __init__(self):
        TritonBackend.__init__(self, prefill="lean,fold,heavy,gluon", block_m=512)

    return type(name.replace("-", "_"), (TritonBackend,), {"name": name, "__init__": __init__,
                                                            "run": with_constants(gluon, consts, TritonBackend.run)})


def tree_variant(name: str, backend: dict | None = None, **consts):
    """``TritonBackend(tree="gluon", **backend)`` with triton_tree_gluon's module constants (STAGES,
    COMPUTE_REGS, FUSED_MERGE, HALF_PARTIALS) set to ``consts`` while it plans and runs."""
    from attnbench.kernels.tree import gluon as tree

    def __init__(self):
        TritonBackend.__init__(self, tree="gluon", **(backend or {}))

    return type(name.replace("-", "_"), (TritonBackend,), {"name": name, "__init__": __init__,
                                                            "plan": with_constants(tree, consts, TritonBackend.plan),
                                                            "run": with_constants(tree, consts, TritonBackend.run)})


def mla_variant(name: str, **mla):
    """The shipped backend with its MLA batches planned by ``mla`` (triton_mla.choose_config's
    overrides: block_m, block_n, num_warps, num_stages, value_chunks, tail_stages, waves,
    half_partials); every other batch as shipped."""

    def plan(self, batch):
        if not is_mla(batch):
            return TritonBackend.plan(self, batch)
        dev = batch.device
        return triton_mla.plan(batch, tp.num_sms(dev), dev.type == "cpu", self.splits, shapes=self._shapes,
                               staging=self._staging, **mla)

    return type(name.replace("-", "_"), (TritonBackend,), {"name": name, "plan": plan})


def mla_gluon_variant(name: str, **consts):
    """``TritonBackend(mla_gluon=True)`` with triton_mla_gluon's module constants (BLOCK_N, STAGES,
    COMPUTE_REGS, WAVES, HALF_PARTIALS, EARLY_PV, PIPE_S) set to ``consts`` while it plans and runs."""
    from attnbench.kernels.mla import gluon as mg

    def __init__(self):
        TritonBackend.__init__(self, mla_gluon=True)

    return type(name.replace("-", "_"), (TritonBackend,), {"name": name, "__init__": __init__,
                                                            "plan": with_constants(mg, consts, TritonBackend.plan),
                                                            "run": with_constants(mg, consts, TritonBackend.run)})


#: issue 33, MLA round 1 (docs/triton_notes.md): v2 = two programs per unit, half the value dims
#: each; m128 = units up to 128 rows (one 128-head token; 8 warps, 64 rows a warpgroup) with an
#: unpipelined masked tail (t1: trees fit shared memory); w1/w2 = splits for at most 1/2
#: programs per SM (rounded down); h = 16-bit partials; st3 = 3 stages
M128 = dict(max_block_m=128, value_chunks=2, tail_stages=1)
#: the backend's defaults before issue 33's defaults round (the 2026-11-27 third session's main)
R3 = dict(prefill=None, v_words=False, mla_wide=False, fp8_split=1, tree="")
MLA_VARIANTS = [
    mla_variant("triton-mla-tk", wide=True),  # the default before the Gluon MLA kernel (thirteenth session): Triton's
    mla_variant("triton-mla-r1"),  # round 1's config on every MLA batch (the default before mla_wide)
    mla_variant("triton-mla-v2", value_chunks=2),
    mla_variant("triton-mla-v2st3", value_chunks=2, num_stages=3),
    mla_variant("triton-mla-m128v2", **M128),
    mla_variant("triton-mla-m128v2w1", **M128, waves=1),
    mla_variant("triton-mla-m128v2w2", **M128, waves=2),
    mla_variant("triton-mla-m128v2w1h", **M128, waves=1, half_partials=True),
    mla_variant("triton-mla-w1", waves=1),
    mla_variant("triton-mla-st3", num_stages=3),
]

#: issue 33, MLA round 2 (docs/triton_notes.md, the thirteenth session): the Gluon MLA kernel on bf16 decodes
#: (every other batch as shipped); n32s4 = 32-key tiles in 4 slots (no spill offline); w2 = splits for 2
#: programs an SM (two waves of one); f32 = float32 split partials; epv = the score warpgroup's P V issued
#: before P's hand-over; ps = the next tile's S issued before this tile's softmax (PIPE_S; two slots held)
MLA_GLUON_VARIANTS = [
    mla_gluon_variant("triton-mla-gluon", EARLY_PV=False),  # as first timed (thirteenth session: the P V after P)
    mla_gluon_variant("triton-mla-gluon-n32s4", BLOCK_N=32, STAGES=4),
    mla_gluon_variant("triton-mla-gluon-w2", WAVES=2),
    mla_gluon_variant("triton-mla-gluon-f32", HALF_PARTIALS=False),
    mla_gluon_variant("triton-mla-gluon-epv", EARLY_PV=True),
    mla_gluon_variant("triton-mla-gluon-n32s4-epv", BLOCK_N=32, STAGES=4, EARLY_PV=True),
    mla_gluon_variant("triton-mla-gluon-n32s4-ps", BLOCK_N=32, STAGES=4, PIPE_S=True),
    mla_gluon_variant("triton-mla-gluon-n32s4-ps-epv", BLOCK_N=32, STAGES=4, PIPE_S=True, EARLY_PV=True),
]


def decode_variant(name: str, backend: dict | None = None, **consts):
    """``TritonBackend(decode="gluon", **backend)`` with triton_decode_gluon's module constants (STAGES, MAXNREG,
    FP8_ONLY) set to ``consts`` while it plans and runs."""
    from attnbench.kernels.decode import gluon as dec

    def __init__(self):
        TritonBackend.__init__(self, decode="gluon", **(backend or {}))

    return type(name.replace("-", "_"), (TritonBackend,), {"name": name, "__init__": __init__,
                                                            "plan": with_constants(dec, consts, TritonBackend.plan),
                                                            "run": with_constants(dec, consts, TritonBackend.run)})


VARIANTS = MLA_VARIANTS + MLA_GLUON_VARIANTS + [
    # issue 33's defaults round (docs/triton_notes.md): the old defaults, each new default alone
    # undone, and the FP8 split rule's neighbours (``fp8_split``: FP8's programs per SM relative to
    # 16-bit's, default 1.9 = 0.95 x the bytes ratio: 8 x 16k on 132 SMs 8 splits; x0.5 5, x1 (the
    # unrounded ratio 2, the defaults round's first rule) 9, x1.5 13, x2 17)
    variant("triton-r3", **R3),
    variant("triton-nopf", prefill=None),  # prefills through the one-launch kernel
    variant("triton-f8-nvw", v_words=False),  # FP8 decodes without v_words, the new split rule kept
    variant("triton-f8s-x05", fp8_split=1),  # FP8 decodes split as 16-bit ones (v_words kept)
    # 8 x 16k is 257 tiles (16384 + the decode's own key): 2x rounds up to 9 splits, 576 programs, 48
    # past one wave of 4 per SM (v_words: 123 registers); 0.95x gives the 8 splits measured best
    variant("triton-f8s-x095", fp8_split=1.9),  # the default since the round measured it best
    variant("triton-f8s-x1", fp8_split=2),
    variant("triton-f8s-x15", fp8_split=3),
    variant("triton-f8s-x2", fp8_split=4),
    variant("triton-s1", splits=1),
    variant("triton-s2", splits=2),
    variant("triton-s3", splits=3),
    variant("triton-s4", splits=4),
    variant("triton-s4h", splits=4, half_partials=True),
    variant("triton-kvm", kv_major=True),
    variant("triton-w8", num_warps=8),
    variant("triton-st2", num_stages=2),
    variant("triton-st4", num_stages=4),
    variant("triton-m128", block_m=128),
    variant("triton-bn32", block_n=32),
    variant("triton-wv4", waves=4),
    variant("triton-wv1", waves=1),
    variant("triton-half", half_partials=True),
    variant("triton-nf128", block_nf=128, num_stages=2),
    variant("triton-nf128w8", block_nf=128, num_stages=2, num_warps=8),
    variant("triton-s2w8", splits=2, num_warps=8),
    variant("triton-n32r3", block_n=32, maxnreg=168),
    variant("triton-n64", block_n=64),
    variant("triton-n32r3s1", block_n=32, maxnreg=168, splits=1),
    variant("triton-n32r4", block_n=32, num_stages=2, maxnreg=128),
    variant("triton-m64", block_m=64),
    variant("triton-m64n32r3", block_m=64, block_n=32, maxnreg=168),
    variant("triton-m128n32r", block_m=128, block_n=32, maxnreg=128),
    # issue 33, FP8 caches (docs/triton_notes.md): float16 dots (one cvt per 2 FP8 elements, no
    # f16 -> bf16 step), V converted in its load layout and transposed as 16-bit (no byte-wise
    # shared loads), and with those the larger unmasked tile / one more stage FP8's half bytes allow
    variant("triton-f8h", fp8_f16=True),
    variant("triton-f8v", v_pairs=True),
    variant("triton-f8hv", fp8_f16=True, v_pairs=True),
    variant("triton-f8hv-nf64", fp8_f16=True, v_pairs=True, block_nf=64),
    variant("triton-f8hv-st4", fp8_f16=True, v_pairs=True, num_stages=4),
    variant("triton-f8hv-w2", fp8_f16=True, v_pairs=True, num_warps=2),  # decode: 25% fewer warp instructions
    variant("triton-f8h-m128", fp8_f16=True, block_m=128),  # trees: 2 row blocks share a tile's conversion, not 3
    # issue 33, FP8 round 2 (docs/triton_notes.md): float16 dots are now the FP8 default and long
    # decodes step 64-key unmasked tiles; block_nf=0 is "block_n" (32 on decode), without that rule
    variant("triton-r1", **R3, fp8_f16=False, block_nf=0),  # round 1's shipped kernel, both dtypes
    variant("triton-f8h-nf32", fp8_f16=True, block_nf=0),  # round 1's f8h (decode: 32-key unmasked tiles)
    variant("triton-f8h-nf64", fp8_f16=True, block_nf=64),  # the new decode default, named
    # eleventh session: V's words converted by one cvt.rn.f16x2 each (offline sm_90, 8 x 16k decode config: 2128 ->
    # 1888 SASS instructions at 168 registers, 2000 at a 128 cap (116, 4 programs an SM), 2040 at 96 (16 B spill, 5
    # an SM, 20 warps); r96 alone: 96). Twelfth session, H200 e4m3: 129.1 / 86.9 / 90.8 / 86.8 (s10) us against
    # 93.5 for the shift words; the cvt words at 128 registers became the default (triton-f8w: the old one)
    variant("triton-f8-cvt", v_words="cvt", maxnreg=0),  # uncapped
    variant("triton-f8-cvt-r128", v_words="cvt", maxnreg=128),
    variant("triton-f8-cvt-r96", v_words="cvt", maxnreg=96),
    variant("triton-f8-cvt-r96-s10", v_words="cvt", maxnreg=96, splits=10),  # 640 programs: one wave of 5 an SM
    variant("triton-f8-r96", v_words=True, maxnreg=96),  # the shift-split words at 96 registers (the control)
    # twelfth session, the cvt default's neighbours: a fourth K/V stage; the FP8 split scale (1.9) either side
    variant("triton-f8-st4", num_stages=4),
    variant("triton-f8-x15", fp8_split=1.5),
    variant("triton-f8-x25", fp8_split=2.5),
    variant("triton-f8-r112", maxnreg=112),
    # thirteenth session: K read as words too (one load layout for K and V: page 16's block-table reads once, not
    # twice; offline sm_90, the decode config: 560 -> 537 SASS instructions a 64-key tile at page 16, 504 -> 477 at 64)
    variant("triton-f8-kw", k_words=True),
    variant("triton-f8-kw-r112", k_words=True, maxnreg=112),
    variant("triton-f8-kw-r96-s10", k_words=True, maxnreg=96, splits=10),
    variant("triton-f8w-kw", v_words=True, k_words=True),  # the shift words for both (what the interpreter runs)
    variant("triton-f8w", v_words=True),  # V as int16 words: 16-bit ldmatrix.trans, no LDS.U8, 123 regs
    variant("triton-f8w-nf32", v_words=True, block_nf=0),  # 96 regs: 5 programs per SM
    variant("triton-f8w-s8", v_words=True, splits=8),  # decode 8x16k: 512 programs, one wave of 4 per SM
    variant("triton-f8w-s16", v_words=True, splits=16),  # 1024 programs, 2 waves
    variant("triton-f8w-fm", v_words=True, fused_merge=True),  # no second launch for the merge
    variant("triton-s8r", splits=8, maxnreg=128),  # f8h nf64 at 128 registers: 4 per SM, 512 programs
    variant("triton-s6", splits=6),  # 384 programs: one wave of 3 per SM (136 regs)
    variant("triton-f8h-nf64s2", fp8_f16=True, block_nf=64, num_stages=2),  # trees: 64-key FP8 tiles, 3 per SM
    # issue 33, FP8 trees round 1 (docs/triton_notes.md): the tree config (64/128-row blocks) with the
    # FP8 tile as the dots' A operand, fed from registers: no second trip through shared memory
    variant("triton-f8t-k", kv_a="k"),  # S^T = K Q^T (mma.sync, M = 32 keys); 168 regs, 120-byte spill
    variant("triton-f8t-k-r224", kv_a="k", block_n=32, maxnreg=255),  # the same uncapped: 224 regs, 2 per SM
    variant("triton-f8t-kv", kv_a="kv"),  # + O^T = V^T P^T (V transposed by byte permutes; 248-byte spill)
    # 8 warps: K's tile split over 2 warps along the keys (4 warps: each converts all of it); 181 regs, 1 per SM
    variant("triton-f8t-k-w8", kv_a="k", num_warps=8, block_n=32, maxnreg=255),
    # issue 33, prefill round 1 (docs/triton_notes.md): triton_prefill_kernels.py's kernel on
    # batches without trees or variants; "" = the shipped algorithm in the new kernel (the control)
    variant("triton-pf", prefill=""),
    variant("triton-pf-lean", prefill="lean"),  # loop-invariant int32 in-tile K/V offsets
    variant("triton-pf-fold", prefill="fold"),  # score scale folded into the exponent's FMA
    variant("triton-pf-heavy", prefill="heavy"),  # longest causal row blocks launched first
    variant("triton-pf-lfh", prefill="lean,fold,heavy"),
    # 2 programs per SM (98 KB of shared memory, <= 128 registers): one's softmax beside the other's MMAs
    variant("triton-pf-lfh-2cta", prefill="lean,fold,heavy", num_stages=2, maxnreg=128),
    # 2 per SM, one warpgroup each (64-key tiles pinned: the long-keys rule would take 32 + a cap)
    variant("triton-pf-lfh-m64", prefill="lean,fold,heavy", block_m=64, block_n=64, num_warps=4),
    variant("triton-pf-lfh-nf128", prefill="lean,fold,heavy", block_nf=128, num_stages=2),  # half the iterations
    # issue 33's prefill round 2 (triton-pf-lfh-ws, a warp-specialized kernel): rejected on the GPU, removed
    # (docs/triton_notes.md, "Prefill round 2")
    # round 3: gluon_prefill_kernels.py, specialized by hand (a TMA loader partition, two compute warpgroups of
    # 64 rows with wgmma); 128 tokens of one q head a program (block_m = 128 x G 4), 128-key tiles at pages of
    # 128 or 256 without splits (else 64); pages not a multiple of 64 (16): lean,fold,heavy's kernel instead
    variant("triton-pf-gl", prefill="lean,fold,heavy,gluon", block_m=512, block_n=64),
    gluon_variant("triton-pf-gl-n64", TILE_KEYS=64),  # 64-key tiles, 2 slots
    gluon_variant("triton-pf-gl-n64s3", TILE_KEYS=64, STAGES=3),
    gluon_variant("triton-pf-gl-n64s4", TILE_KEYS=64, STAGES=4),
    gluon_variant("triton-pf-gl-r232", COMPUTE_REGS=232),  # the round's first build (200 since: 2-4% faster)
    # the next tile's S issued before this tile's softmax (triton-pf-gl-ov): 13-19% slower, removed
    # one program per item (rounds 3-5), and per SM with a static round-robin (round 4: slower than per item); the
    # option's default since round 8: per SM, drawing items from a counter
    gluon_variant("triton-pf-gl-item", PERSISTENT=False),
    gluon_variant("triton-pf-gl-p", PERSISTENT=True, DYNAMIC=0),
    gluon_variant("triton-pf-gl-d1", DYNAMIC=1),  # round 8: the next item told with Q's barrier (2 since round 9)
    gluon_variant("triton-pf-gl-w8", SPLIT_ROWS=False),  # one compute partition of 8 warps (rounds 3-4)
    gluon_variant("triton-pf-gl-ep", EARLY_PAGE=True),  # the loader's block-table read before the slot wait
    gluon_variant("triton-pf-gl-w8-ep", SPLIT_ROWS=False, EARLY_PAGE=True),
    # rounds 6-7 (H200, docs/triton_notes.md "Prefill rounds 6 and 7"), all slower than triton-pf-gl's 97.0 / 395.9
    # us and removed: tile j's P V waited for with tile j + 1's S (106.9 / 467.1), 232 registers (98.2 / 413.6),
    # the output stored from the MMA's registers (109.7 / 419.2), which makes room for 3 slots (111.0 / 420.7;
    # with the deferred P V 118.9 / 462.0)
    # issue 33's tree round 1 (docs/triton_notes.md): the Gluon tree kernel, its ring depth and register budget
    tree_variant("triton-tr-gl"),  # the default since the round
    variant("triton-tr-r0", tree=""),  # the one-launch kernel for trees (the default before the round)
    tree_variant("triton-tr-gl-s3", STAGES=3),
    tree_variant("triton-tr-gl-r152", COMPUTE_REGS=152),
    tree_variant("triton-tr-gl-fm", FUSED_MERGE=True),  # the last split merges in the kernel
    tree_variant("triton-tr-gl-hp", dict(half_partials=True)),  # 16-bit partial outputs (the default since)
    tree_variant("triton-tr-gl-f32", HALF_PARTIALS=False),  # float32 partial outputs (round 1's first build)
    tree_variant("triton-tr-gl-fmhp", FUSED_MERGE=True),  # 16-bit partials merged in the kernel
    tree_variant("triton-tr-gl-sp1", dict(splits=1)),  # the plan's key splits forced (its own: 2 at 1k-16k)
    tree_variant("triton-tr-gl-sp3", dict(splits=3)),
    # tree round 2, FP8 caches (the loader widens each TMA'd FP8 tile): ring / staging slots and registers
    tree_variant("triton-tr-f8-s32", STAGES8=2),  # 3 float16 slots, 2 FP8 staging slots
    tree_variant("triton-tr-f8-s24", STAGES_FP8=2, STAGES8=4),
    tree_variant("triton-tr-f8-s33", STAGES8=3),  # round 2's first build (trees: what the default gives)
    tree_variant("triton-tr-f8-r2", STAGES_FP8=2),  # 2 float16 slots, the staging slots filling the rest
    tree_variant("triton-tr-f8-r160", COMPUTE_REGS_FP8=160),  # the loader's warps at 32 registers
    tree_variant("triton-tr-p0", PIPE_S=0),  # S of each tile issued after its softmax (the default before PIPE_S)
    tree_variant("triton-tr-ps", PIPE_S=1, PIPE_S_FP8=1),  # S behind the tile before's P V (16-bit: the default)
    tree_variant("triton-tr-ps2", PIPE_S=2, PIPE_S_FP8=2),  # S of the next tile issued before this tile's softmax
    # FP8 with a fourth ring slot and one staging slot (221 KB of shared memory offline), PIPE_S 1 or 0; H200 (twelfth
    # session) fp8-tree40 4k / 16k: 79.4 / 241.8 and 78.4 / 242.4 us against the default's 70.1 / 208.9 (rejected)
    tree_variant("triton-tr-f8-ps4", PIPE_S_FP8=1, STAGES_FP8=4, STAGES8=1),
    tree_variant("triton-tr-f8-r4", STAGES_FP8=4, STAGES8=1),
    # fourteenth session: the split merge as an ordinary launch after the kernel (the default) or a programmatic
    # dependent (PDL_MERGE; the default while the session measured it)
    tree_variant("triton-tr-nopdl", PDL_MERGE=False),
    tree_variant("triton-tr-pdl", PDL_MERGE=True),
    tree_variant("triton-tr-m0", MASK_WORDS=False),  # the masked tiles' mask element by element (before the words)
    tree_variant("triton-tr-ma1", MASK_AHEAD=True),  # the first masked tile's words worked out before the full tiles
    tree_variant("triton-tr-em0", EARLY_META=False),  # the unit's columns loaded where they are first read
    tree_variant("triton-dec-f8", DECODES="fp8"),  # FP8 decodes alone through the Gluon tree kernel too
    tree_variant("triton-dec-f8-r2", DECODES="fp8", STAGES_FP8=2),
    tree_variant("triton-dec-f8-s3", DECODES="fp8", STAGES8=3),  # the first build's 3 staging slots
    tree_variant("triton-dec-gl", DECODES="all"),  # any decodes alone
    # decode round 1 (fifteenth session): the Gluon decode kernel (TMA by page boxes, mma_v2, FP8 words by cvt)
    decode_variant("triton-gd"),  # FP8 decodes (the option's default batches)
    decode_variant("triton-gd-all", FP8_ONLY=False),  # 16-bit caches too
    decode_variant("triton-gd-s4", STAGES=4),  # 4 ring slots (3 programs an SM on FP8 d 128)
    decode_variant("triton-gd-s3", STAGES=3),  # the first build's 3 slots
    decode_variant("triton-gd-s2", STAGES=2),
    variant("triton-gd0", decode=""),  # FP8 decodes on the shipped kernel (the default before decode round 1)
    decode_variant("triton-gd-r0", MAXNREG=None),  # registers uncapped (offline: 152, 3 programs an SM)
    # more programs an SM (2 slots: 34 KB of shared memory; registers capped, spilling) and the split rule's programs
    # raised to match (fp8_split: FP8's programs an SM relative to 16-bit's WAVES 2, default 1.9)
    decode_variant("triton-gd-s2-x25", dict(fp8_split=2.5), STAGES=2),  # 4 an SM (128 registers), 5 aimed at
    decode_variant("triton-gd-s2-r96-x25", dict(fp8_split=2.5), STAGES=2, MAXNREG=96),  # 5 an SM (208 spill bytes)
    decode_variant("triton-gd-s2-r80-x3", dict(fp8_split=3.0), STAGES=2, MAXNREG=80),  # 6 an SM (280 spill bytes)
    decode_variant("triton-gd-x15", dict(fp8_split=1.5)),  # fewer programs: 3 an SM aimed at
    # pages under 64 keys by cp.async (16-byte pieces of whole rows, one CTA barrier a tile) instead of a TMA box a
    # page (sixteenth session)
    decode_variant("triton-gd-cp", COPY_BELOW=64, COPY_DIMS=(64, 128)),
    decode_variant("triton-gd-cp-s3", COPY_BELOW=64, COPY_DIMS=(64, 128), STAGES=3),
    decode_variant("triton-gd-cp-s4", COPY_BELOW=64, COPY_DIMS=(64, 128), STAGES=4),
    decode_variant("triton-gd-cpall", COPY_BELOW=1 << 20, COPY_DIMS=(64, 128)),  # every page by cp.async
    decode_variant("triton-gd-tma", COPY_BELOW=0),  # every page by TMA boxes (the default before the sixteenth session)
    decode_variant("triton-gd-t128", TILES={64: 128}),  # 128-key tiles for head dim 64 (the default since)
    decode_variant("triton-gd-t128-tma", TILES={64: 128}, COPY_BELOW=0),
    decode_variant("triton-gd-t64", TILES={}),  # 64-key tiles for every head dim (the default before)
]
for _cls in VARIANTS:
    globals()[_cls.__name__] = _cls
