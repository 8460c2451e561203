"""``--save-tensors``: each case's inputs and every backend's output in one ``.pt`` file,
loadable with ``torch.load(path, weights_only=True)``."""
from __future__ import annotations

from pathlib import Path

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.units import safe_name


def save_case_tensors(directory: Path, case_id: str, batch: Batch, outputs: dict) -> Path:
    """Write ``DIRECTORY/<case id>.pt``: the batch (q, paged K/V, block table, lengths, kinds,
    tree parents, scale, attention and the MLA widths) and ``outputs`` (backend name -> its checked first output, on the CPU).

    The attention variants too (docs/semantics.md), so that ``scripts/gpu/check_saved.py`` can
    recompute from the file alone: ``causal`` per request, ``window``, ``softcap``, ``sinks``
    and ``alibi_slopes`` ([Hq] float32 or None), ``k_scale``/``v_scale`` (float32 [1] or [Hkv],
    None without FP8: K = k_cache.float() * k_scale), ``kv_dtype`` and ``kv_order`` (the caches
    are saved NHD-indexed whatever the storage order)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    blob = {
        "q": batch.q.cpu(),
        "k_cache": batch.k_cache.cpu().contiguous(),
        "v_cache": batch.v_cache.cpu().contiguous(),
        "block_table": batch.block_table.cpu(),
        "query_lens": batch.query_lens.cpu(),
        "context_lens": batch.context_lens.cpu(),
        "kinds": batch.kinds,
        "tree_parents": batch.tree_parents,
        "scale": batch.scale,
        "causal": batch.causal,
        "window": batch.window,
        "softcap": batch.softcap,
        "sinks": _cpu(batch.sinks),
        "alibi_slopes": _cpu(batch.alibi_slopes),
        "k_scale": _cpu(batch.k_scale),
        "v_scale": _cpu(batch.v_scale),
        "kv_dtype": batch.spec.kv_dtype,
        "kv_order": batch.kv_order,
        "attention": batch.spec.attention,  # "mla": v_cache is k_cache[..., :kv_lora_rank]
        "kv_lora_rank": batch.spec.kv_lora_rank,
        "rope_dim": batch.spec.rope_dim,
        "outputs": outputs,
    }
    path = d / f"{safe_name(case_id)}.pt"
    torch.save(blob, path)
    return path


def _cpu(t):
    return None if t is None else t.cpu()
