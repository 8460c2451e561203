"""The plan of the MHA / GQA routes (paged, prefill, gluon-prefill, gluon-tree, gluon-decode): the step's tables
(shared/step.py: the query side cached per shape, the rest rebuilt, one host buffer, one copy), the output and split
partial buffers, and the variants' inputs. ``Planner`` keeps the per-shape caches of one backend instance."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.kernels.shared import features as tf
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared import step as ts
from attnbench.workload.batch import Batch

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
    po: torch.Tensor  # [S, R, Hq, D] partial outputs (R = 0: [1, 1, Hq, D], shared, never touched)
    pl: torch.Tensor  # [S, R, Hq] float32 partial LSEs (natural log; R = 0 as po)
    splits_p2: int
    sem: torch.Tensor  # [row blocks, Hkv] int32 arrival counters (kept at 0)
    qk_scale: float
    feat: tf.Features  # the variants' inputs (window, sinks, soft-cap, ALiBi, FP8 scales, positions)
    mode: str = ""  # the row's "ran as" (kernels/routes.py's mode; "interpreted (...)" first on the CPU)
    route: object = None  # the route that runs it (kernels/routes.py; set by the caller)


class Planner:
    """Plans of one backend instance: the config and query side once per (shape, route), the rest every step."""

    def __init__(self) -> None:
        self.shapes: dict = {}  # (shape key, config overrides, waves) -> (Config, Shape)
        self.mla_shapes: dict = {}  # the MLA routes' (mla/plan.py's MlaShape)
        self.staging = ts.Staging()

    def plan(self, batch: Batch, config: dict, splits: Optional[int], half: bool = False,
             waves: bool = False) -> TritonPlan:
        """``config``: ``choose_config``'s overrides (the route's tiles over the options'); ``half``: 16-bit split
        partials; ``waves``: splits counted in waves of one program an SM (the Gluon tree kernel's)."""
        dev = batch.device
        hkv, window = batch.num_kv_heads, tf.window_of(batch)
        want_pos = window > 0 or getattr(batch, "alibi_slopes", None) is not None  # tf.needs_positions
        cfg, sh = self._shape(batch, want_pos, window, config, waves)
        buf, merge_at, units_at, r, s = ts.fill(sh, batch, cfg, tp.num_sms(dev), splits, self.staging, want_pos)
        d_buf = self.staging.send(buf, dev)
        n, hq, d = batch.q.shape
        w = sh.words
        pdt = batch.dtype if half and batch.q.element_size() == 2 else torch.float32
        if r:
            po = torch.empty(s, r, hq, d, dtype=pdt, device=dev)
            pl = torch.empty(s, r, hq, dtype=torch.float32, device=dev)
        else:
            po, pl = self.staging.unread(dev, pdt, hq, d), self.staging.unread(dev, torch.float32, hq)
        return TritonPlan(
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
        )

    def _shape(self, batch: Batch, want_pos: bool, window: int, config: dict, waves: bool):
        """``choose_config`` and the step's query side (``step.Shape``), once per shape and config: the dims, the
        query lengths, tree and causal flags, static topologies, and whether the longest key range reaches
        ``LONG_KEYS`` (the one key-side input of the config)."""
        h = batch.host
        keys = int((np.minimum(h.kv_lens, window + h.query_lens) if window else h.kv_lens).max(initial=0))
        key = (ts.shape_key(batch, want_pos, keys >= tp.LONG_KEYS, window), tuple(sorted(config.items())), waves)
        hit = self.shapes.get(key)
        if hit is None:
            if len(self.shapes) >= ts.SHAPES:
                self.shapes.clear()
            cfg = tp.choose_config(batch, **config)
            sh = ts.make_shape(batch, cfg, want_pos)
            sh.waves = waves  # one program an SM: splits counted in waves
            hit = self.shapes[key] = (cfg, sh)
        return hit
