"""attnbench's own Triton backend: paged + tree attention read straight from the paged cache.

One launch computes every request kind of docs/semantics.md (prefill, chunked prefill, decode,
tree) for the whole batch, reading K/V through the block table (no gather), any page size
from 1 to 256. GQA: the G query heads of a KV head share one program, so K/V are read once
per KV head. Trees use per-token ancestor bitmasks (64 nodes per int64 word). Long contexts
with few queries are split across programs (split-KV) and merged by LSE in a second small
kernel. ``plan`` does all host-side work (triton_plan.py); ``run`` only launches kernels
(triton_kernels.py) into preallocated buffers, so it can be captured in a CUDA graph.

Attention variants (docs/semantics.md; triton_features.py) run in the same launch, each a
constexpr specialization of the one kernel: FP8 K/V caches (e4m3/e5m2) dequantized in the
kernel with per-tensor or per-head scales, sliding windows (each row block's key range
starts at its window: pages below it are never read), sinks, soft-capping, ALiBi,
bidirectional prefill, head dims 32/64/80/96/128/256 (80 and 96 padded to 128 lanes) and the HND cache
order (read through the cache's strides).

On CPU tensors the kernels run under Triton's interpreter, which must be switched on with
``TRITON_INTERPRET=1`` before the kernels are imported (float32/float16 only there).
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from attnbench.backend import Backend
from attnbench.workload.batch import Batch
from attnbench.workload.mla import is_mla

from . import triton_features as tf
from . import triton_mla
from . import triton_launch
from . import triton_plan as tp
from . import triton_prefill
from . import triton_prefill_gluon
from . import triton_step as ts
from . import triton_tree_gluon
from . import triton_decode_gluon

_KERNELS = "attnbench.backends.triton_kernels"
# the prefill path's default options (issue 33's prefill rounds): gluon where triton_prefill_gluon.wanted
PREFILL = "lean,fold,heavy,gluon"
# the tree path's default (issue 33's tree round 1): gluon where triton_tree_gluon.wanted
TREE = "gluon"
# the decode path's default (issue 33's decode round 1): "gluon" runs triton_decode_gluon.wanted's batches (FP8 decodes
# on Hopper) through gluon_decode_kernels.py's kernel (H200, 8 x 16k e4m3: 82.4 against 87.0 us at page 16, 73.7
# against 79.5 at page 64); "" the shipped kernel
DECODE = "gluon"
# the register cap of FP8 decodes whose V words take one cvt.rn.f16x2 each (V_WORDS 2): 116 registers, 4 programs
# an SM; H200 8 x 16k e4m3: 86.9 us against 129.1 uncapped (168 registers, 3 an SM) and 93.5 for the shift-split
# words (issue 33, twelfth session)
CVT_MAXNREG = 128
LOG2E = math.log2(math.e)


@dataclass
class TritonPlan:
    batch: Batch
    cfg: tp.Config
    units: torch.Tensor  # [U, UNIT_COLS] int32
    merge: torch.Tensor  # [R, 2] int32: (token, splits)
    num_merge: int  # R: query tokens whose row block was split
    anc: torch.Tensor  # [N, W] int64 ancestor bitmasks
    has_tree: bool
    out: torch.Tensor  # [N, Hq, D] batch dtype
    po: torch.Tensor  # [S, R, Hq, D] float32 partial outputs (R = 0: [1, 1, Hq, D], shared, never touched)
    pl: torch.Tensor  # [S, R, Hq] float32 partial LSEs (natural log; R = 0 as po)
    splits_p2: int
    sem: torch.Tensor  # [row blocks, Hkv] int32 arrival counters of the fused merge (kept at 0)
    qk_scale: float
    feat: tf.Features  # the variants' inputs (window, sinks, soft-cap, ALiBi, FP8 scales, positions)
    mode: str = ""  # "interpreted (...)" under TRITON_INTERPRET=1: rows say so (hundreds of times slower)
    gluon_tree: bool = False  # the Gluon tree kernel runs it (triton_tree_gluon.fit passed at plan time)
    gluon_decode: bool = False  # the Gluon decode kernel runs it (triton_decode_gluon.fit passed at plan time)


def _interpret_wanted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_options(kv_a: str, tree: str, v_words, decode: str = "") -> None:
    if set(kv_a) - {"k", "v"}:
        raise ValueError(f"kv_a {kv_a!r}: '', 'k', 'v' or 'kv'")
    for name, value in (("tree", tree), ("decode", decode)):
        if value not in ("", "gluon"):
            raise ValueError(f"{name} {value!r}: '' or 'gluon'")
    if v_words not in (None, True, False, "cvt"):
        raise ValueError(f"v_words {v_words!r}: None, True, False or 'cvt'")


def triton_mode() -> Optional[str]:
    """How this process imported triton: "interpreted", "compiled", or None (not yet).

    ``triton.jit`` reads TRITON_INTERPRET at import time (triton.language's own helpers
    such as ``tl.zeros`` included), so the mode cannot change afterwards."""
    tl = sys.modules.get("triton.language")
    if tl is None:
        return None
    return "interpreted" if type(tl.standard.zeros).__name__ == "InterpretedFunction" else "compiled"


class TritonBackend(Backend):
    name = "triton"
    head_dims = (32, 64, 80, 96, 128, 256)  # 80 and 96 run padded to 128 lanes, the extra ones masked
    max_group = 128
    supports_mla = True  # MLA batches go to triton_mla.py
    # every variant in the one launch (triton_features.py): constexpr-specialized kernels
    supports_window = True
    supports_sinks = True
    supports_softcap = True
    supports_alibi = True
    supports_noncausal = True
    kv_dtypes = tf.FP8_NAMES
    kv_scales = ("per-tensor", "per-head")  # one scale per program either way
    kv_orders = ("NHD", "HND")  # read through the cache's strides

    def __init__(self, splits: Optional[int] = None, fused_merge: bool = False, kv_major: bool = False,
                 half_partials: bool = False, fp8_f16: bool = True, v_pairs: bool = False,
                 v_words: Optional[bool | str] = None, prefill: Optional[str] = PREFILL, mla_wide: bool = True,
                 kv_a: str = "", tree: str = TREE, k_words: bool = False, mla_gluon: bool = True,
                 decode: str = DECODE, **config: Any) -> None:
        """``splits``: force this many KV splits per row block (None: the plan's heuristic).
        ``fused_merge``: the last split to finish merges (one launch) instead of a second merge
        kernel; off by default: on an H100 it was no faster for decode and 7% slower for
        a 64-node tree at 16k (428 vs 398 us, docs/triton_notes.md).
        ``kv_major``: launch the KV heads of a unit side by side (1-D grid, KV head fastest)
        instead of every unit of one KV head first.
        ``half_partials``: split partial outputs in the batch's 16-bit dtype instead of float32
        (half their bytes, at one more rounding of each partial; the LSEs stay float32).
        ``fp8_f16`` (FP8 caches, 16-bit queries): both dots in float16 (q converted once; FP8 ->
        f16 is one instruction per 2 elements, -> bf16 two more per element; |q| must stay below
        65504). On by default: faster on every FP8 case measured on an H200 (decode 8 x 16k 149
        vs 178 us, trees 130 vs 147 / 450 vs 519) and more accurate (docs/triton_notes.md, issue
        33's FP8 round 1). ``v_pairs`` (FP8 caches): V's tile converted in its load layout and
        transposed as 16-bit (ldmatrix) instead of read byte by byte into the dot's layout; off
        (measured slower: 208 vs 178 us alone, 189 vs 149 with ``fp8_f16``). ``v_words`` (FP8
        caches, even head dims): V read as int16 words of two FP8 dims, transposed by 16-bit
        ldmatrix, and P.V as two dots (even dims, odd dims) joined back in registers; None (the
        default): on for decode configs (row blocks <= 32 rows, mma.sync; H200 8 x 16k: 124.9 ->
        111.7 us) without ``v_pairs``, off for the tree config (wgmma: more instructions, a spill), each
        word converted by one PTX cvt.rn.f16x2 at ``CVT_MAXNREG`` registers (with ``fp8_f16``, compiled
        builds; H200 8 x 16k e4m3: 86.9 against 93.5 us); True: on, each word split by shifts and a
        conversion a byte (the interpreter's way); "cvt": the default's words on every config. ``k_words`` (off
        until timed): with V's words, K's too (scores as two half-width dots; one load layout for K and V).
        ``prefill``: batches with a prefill and without trees or variants run
        triton_prefill_kernels.py's kernel with these options (default "lean,fold,heavy,gluon":
        lean/fold/heavy made 4 x 1k prefills 5-14% faster on an H200, issue 33's prefill round;
        gluon: on a Hopper GPU, batches ``triton_prefill_gluon.wanted`` takes get units shaped for
        gluon_prefill_kernels.py's warp-specialized kernel and run it; "": none, the control;
        None: the one-launch kernel for every batch, as before issue 33).
        ``kv_a`` (FP8 caches, the tree config: row blocks of >= 64 rows, wgmma): "k" computes the
        scores as S^T = K Q^T, so K's converted tile is the dot's A operand, read from shared memory
        straight into registers (no second trip through shared memory, P's 4 KB takes one
        instead); "v": O^T = V^T P^T the same for V; "kv" both; "" (default) off, as before
        (docs/triton_notes.md, issue 33's FP8 trees round 1).
        ``tree`` ("gluon", the default, or ""): on a Hopper GPU, tree batches ``triton_tree_gluon.wanted`` takes
        run gluon_tree_kernels.py's warp-specialized kernel (issue 33's tree round 1: 8 x 40-node trees at
        4k / 16k, page 16, H200, 61.5 / 199.6 us against 106.0 / 350.0; FP8 e4m3 caches since round 2: 69.8 / 210.2
        us against 132.0 / 449.5); "": the one-launch kernel.
        ``mla_wide``: MLA batches take ``triton_mla.default_config`` (128 heads: 128-row units, value halves);
        False: round 1's config. ``mla_gluon`` (on; False: the Triton MLA kernel): on Hopper, triton_mla_gluon.wanted's
        batches (16-bit decodes, MTP chains) run gluon_mla_kernels.py's kernel (H200, 8 x 16k, 128 heads: 83.3 against 186.7 us).
        ``decode`` ("gluon", the default, or ""): on Hopper triton_decode_gluon.wanted's FP8 decodes run its kernel.
        ``config``: overrides of choose_config (block_n / block_m / num_warps / num_stages /
        block_nf / maxnreg / fp8_split: FP8's decode split scale, default 1.9)."""
        self.splits, self.fused_merge, self.kv_major, self.half_partials = splits, fused_merge, kv_major, half_partials
        self.fp8_f16 = fp8_f16
        self.v_pairs = v_pairs
        self.v_words, self.k_words = v_words, k_words
        self.prefill = None if prefill is None else triton_prefill.options(prefill)
        self.mla_wide, self.mla_gluon = mla_wide, mla_gluon
        _check_options(kv_a, tree, v_words, decode)
        self.kv_a, self.tree, self.decode = kv_a, tree, decode
        self.config = config
        self._shapes: dict = {}  # (Config, Shape, 16-bit partials, route notes) per step shape (query side, options)
        self._staging = ts.Staging()

    def unsupported(self, batch: Batch) -> list[str]:
        """Device and interpreter rules (CUDA, or the CPU under ``TRITON_INTERPRET=1``)."""
        reasons = []
        if batch.device.type == "cpu":
            if not _interpret_wanted():
                reasons.append("triton runs on CPU tensors only in its interpreter: set TRITON_INTERPRET=1")
            if batch.dtype == torch.bfloat16:
                reasons.append("bfloat16 under the Triton interpreter gives wrong tl.dot results; use float32/float16")
        elif batch.device.type != "cuda":
            reasons.append(f"device {batch.device.type} not supported (cuda, or cpu under TRITON_INTERPRET=1)")
        mode = triton_mode()
        want = "interpreted" if batch.device.type == "cpu" else "compiled"
        if mode is not None and mode != want and (want == "compiled" or _interpret_wanted()):
            reasons.append(f"triton was already imported {mode} in this process (it reads "
                           f"TRITON_INTERPRET at import); run {want} in a new process")
        for name, t in (("q", batch.q), ("k_cache", batch.k_cache), ("v_cache", batch.v_cache)):
            if t.stride(-1) != 1:
                reasons.append(f"{name} must have a contiguous last dimension")
        return reasons + (triton_mla.mla_problems(batch) if is_mla(batch) else [])

    def plan(self, batch: Batch) -> TritonPlan:
        """The step's tables (triton_step.py: the query side cached per shape, the rest rebuilt,
        one host buffer, one copy) and the output and partial buffers (a plan without splits
        shares partials no kernel touches: its device work is the copy and the output)."""
        dev = batch.device
        if is_mla(batch):
            return triton_mla.plan(batch, tp.num_sms(dev), dev.type == "cpu", self.splits, shapes=self._shapes,
                                   staging=self._staging, wide=self.mla_wide, gluon=self.mla_gluon)
        hkv, window = batch.num_kv_heads, tf.window_of(batch)
        want_pos = window > 0 or getattr(batch, "alibi_slopes", None) is not None  # tf.needs_positions
        cfg, sh, half, notes = self._shape(batch, want_pos, window)
        buf, merge_at, units_at, r, s = ts.fill(sh, batch, cfg, tp.num_sms(dev), self.splits, self._staging, want_pos)
        d_buf = self._staging.send(buf, dev)
        n, hq, d = batch.q.shape
        w = sh.words
        if r:
            po = torch.empty(s, r, hq, d, dtype=self._partial_dtype(batch, half), device=dev)
            pl = torch.empty(s, r, hq, dtype=torch.float32, device=dev)
        else:
            po, pl = self._staging.unread(dev, self._partial_dtype(batch, half), hq, d), self._staging.unread(dev, torch.float32, hq)
        plan = TritonPlan(
            batch=batch,
            cfg=cfg,
            units=d_buf.as_strided(((buf.size - units_at) // tp.UNIT_COLS, tp.UNIT_COLS), (tp.UNIT_COLS, 1), units_at),
            merge=d_buf.as_strided((max(r, 1), 2), (2, 1), merge_at),
            num_merge=r,
            anc=d_buf.view(torch.int64).as_strided((w.nw, w.w), (w.w, 1), 0),
            has_tree=w.tree,
            out=torch.empty(n, hq, d, dtype=batch.dtype, device=dev),
            po=po,
            pl=pl,
            splits_p2=2 if s <= 2 else tp.next_pow2(s),
            sem=d_buf.as_strided((sh.nblk, hkv), (hkv, 1), sh.sem_at),
            qk_scale=batch.scale * LOG2E,
            feat=tf.features(batch, d_buf.as_strided((sh.n,), (1,), sh.pos_at) if want_pos else None, sh.bidir),
            # on a CPU triton runs only interpreted (whether or not it is imported yet: issue 24)
            mode="interpreted (TRITON_INTERPRET=1)" if dev.type == "cpu" else "",
        )
        pre, tree, dec = self._routes(plan, notes)
        plan.gluon_tree = tree == triton_tree_gluon.RAN  # (fit once: run reads the answer)
        plan.gluon_decode = dec == triton_decode_gluon.RAN
        if pre or tree or dec:
            plan.mode = "; ".join(m for m in (plan.mode, pre, tree, dec) if m)
        return plan

    def _routes(self, plan: TritonPlan, notes: dict) -> tuple[str, str, str]:
        """The kernels the plan's batch runs with the gluon options (the row says which, or why not Gluon's):
        triton_prefill.route_note, triton_tree_gluon.route_note and triton_decode_gluon.route_note, once per step
        shape (``notes``: the shape's) and cache layout. Each step paid them before: 12-22 us of a tree plan on the
        CPU machine, more on the GPU host (issue 33, eleventh session: the plan table 1.29x dee312b's per case)."""
        b = plan.batch
        q, k, v = b.q, b.k_cache, b.v_cache
        key = (b.device, q.stride(), q.data_ptr() % 16, k.shape, k.stride(), v.stride(), k.data_ptr() % 16,
               v.data_ptr() % 16, getattr(b, "k_scale", None) is None)
        hit = notes.get(key)
        if hit is None:
            if len(notes) >= ts.SHAPES:
                notes.clear()
            hit = notes[key] = (triton_prefill.route_note(plan) if self.prefill and "gluon" in self.prefill else "",
                                triton_tree_gluon.route_note(plan) if self.tree == "gluon" else "",
                                triton_decode_gluon.route_note(plan) if self.decode == "gluon" else "")
        return hit

    def forget_shapes(self) -> None:
        """Drop the per-shape caches: the next plan pays what a step with a new query side pays
        (scripts/dev/triton_plan_time.py's new-shape column)."""
        self._shapes.clear()

    def _shape(self, batch: Batch, want_pos: bool, window: int) -> tuple[tp.Config, ts.Shape, bool, dict]:
        """``choose_config`` and the step's query side (``triton_step.Shape``), once per shape:
        the dims, the query lengths, tree and causal flags, static topologies, and whether the
        longest key range reaches ``LONG_KEYS`` (the one key-side input of the config); and whether
        its split partials are 16-bit (shaped for the Gluon tree kernel: triton_tree_gluon.HALF_PARTIALS); and
        the shape's route notes (``_routes``)."""
        h = batch.host
        keys = int((np.minimum(h.kv_lens, window + h.query_lens) if window else h.kv_lens).max(initial=0))
        key = ts.shape_key(batch, want_pos, keys >= tp.LONG_KEYS, window)
        hit = self._shapes.get(key)
        if hit is None:
            if len(self._shapes) >= ts.SHAPES:
                self._shapes.clear()
            kw = self.config
            tree = False
            if self.prefill and "gluon" in self.prefill and not {"block_m", "block_n"} & kw.keys() \
                    and triton_prefill_gluon.wanted(batch):  # units shaped for the Gluon prefill kernel
                kw = {**kw, **triton_prefill_gluon.config_args(batch)}
            elif self.tree == "gluon" and not {"block_m", "block_n"} & kw.keys() and triton_tree_gluon.wanted(batch):
                kw = {**kw, **triton_tree_gluon.config_args(batch)}  # one row block a request, 64-key tiles
                tree = True
            elif self.decode == "gluon" and "block_nf" not in kw and triton_decode_gluon.wanted(batch):
                kw = {**kw, **triton_decode_gluon.config_args(batch)}  # splits on its tiles
            cfg = tp.choose_config(batch, **kw)
            sh = ts.make_shape(batch, cfg, want_pos)
            sh.waves = tree  # one program an SM: splits counted in waves
            hit = self._shapes[key] = (cfg, sh, tree and triton_tree_gluon.HALF_PARTIALS, {})
        return hit

    def _v_words(self, cfg: tp.Config) -> bool:
        """``v_words`` as set, or by default on for decode configs (<= 32-row blocks) without ``v_pairs``."""
        return self.v_words if self.v_words is not None else cfg.block_m <= 32 and not self.v_pairs

    def _v_words_flag(self, cfg: tp.Config, b: Batch, fp8: bool, interpreted: bool) -> int:
        """The kernel's V_WORDS (FP8 caches, even head dims): 0 off, 1 words split by shifts (``v_words=True``),
        2 words converted by cvt.rn.f16x2 (the default and "cvt", with float16 dots; the interpreter runs no PTX:
        1 there)."""
        if not (fp8 and b.head_dim % 2 == 0 and self._v_words(cfg)):
            return 0
        f16 = self.fp8_f16 and b.q.element_size() == 2  # the kernel's FP8_F16
        return 2 if self.v_words in (None, "cvt") and f16 and not interpreted else 1

    @staticmethod
    def _maxnreg(cfg: tp.Config, v_words: int) -> int:
        """The launch's register cap: the config's (0: none), else ``CVT_MAXNREG`` on the cvt words (V_WORDS 2)."""
        return cfg.maxnreg if cfg.maxnreg is not None else CVT_MAXNREG if v_words == 2 else 0

    def _partial_dtype(self, batch: Batch, half: bool = False) -> torch.dtype:
        return batch.dtype if (self.half_partials or half) and batch.q.element_size() == 2 else torch.float32

    def run(self, p: TritonPlan) -> torch.Tensor:
        if isinstance(p, triton_mla.MlaPlan):
            return triton_mla.run(p)
        if self.prefill is not None and triton_prefill.applies(p):
            return triton_prefill.run(p, self.prefill)
        if p.gluon_tree:
            return p.out if triton_tree_gluon.run(p) else triton_launch.merge(p, pdl=triton_tree_gluon.PDL_MERGE)
        if p.gluon_decode:
            triton_decode_gluon.run(p)
            return triton_launch.merge(p)
        from . import triton_kernels as tk

        b, cfg, f = p.batch, p.cfg, p.feat
        q, k, v, out, po, pl = b.q, b.k_cache, b.v_cache, p.out, p.po, p.pl
        d_pad = tp.next_pow2(b.head_dim)
        dummy = p.units  # the pointer of an input its variant is off for (never read)
        g = b.num_q_heads // b.num_kv_heads
        grid = (p.units.shape[0] * b.num_kv_heads,) if self.kv_major else (p.units.shape[0], b.num_kv_heads)
        vw = self._v_words_flag(cfg, b, f.fp8, tk.INTERPRETED)
        regs = self._maxnreg(cfg, vw)
        tk.paged_attention_kernel[grid](
            q, k, v, out, po, pl, b.block_table, p.units, p.anc, p.sem,
            *(dummy if t is None else t for t in (f.positions, f.sinks, f.slopes, f.k_scale, f.v_scale)),
            *triton_launch.io_strides(p), p.anc.stride(0), p.sem.stride(0),
            1 if f.fp8 and f.k_scale.numel() > 1 else 0,  # per-head scales, or one per tensor
            p.qk_scale, f.cap, f.window,
            G=g, HEAD_DIM=b.head_dim, PAGE=b.page_size,
            BLOCK_M=cfg.block_m, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, BLOCK_NF=cfg.block_nf,
            UNIT_COLS=tp.UNIT_COLS, HAS_TREE=p.has_tree, IEEE=b.dtype == torch.float32,
            TILE_IN_PAGE=b.page_size % cfg.block_nf == 0, FUSED_MERGE=self.fused_merge,
            KV_MAJOR=self.kv_major, NUM_KV=b.num_kv_heads, BLOCK_D=d_pad, PAD_D=d_pad != b.head_dim,
            **f.constexprs(), FP8_F16=self.fp8_f16 and f.fp8 and q.element_size() == 2, V_PAIRS=self.v_pairs and f.fp8,
            V_WORDS=vw, K_WORDS=bool(self.k_words and vw and not ("k" in self.kv_a and cfg.block_m >= 64)),
            KV_A=("k" in self.kv_a) + 2 * ("v" in self.kv_a) if f.fp8 and cfg.block_m >= 64 else 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **({"maxnreg": regs} if regs and not tk.INTERPRETED else {}),
        )
        return out if self.fused_merge else triton_launch.merge(p)
