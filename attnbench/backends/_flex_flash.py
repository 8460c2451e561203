"""Flex on its FLASH backend (``flex:kernel=flash``): ``kernel_options={"BACKEND": "FLASH"}`` makes
``torch.compile``'s Flex lowering render FlashAttention-4's CuTe kernel
(``torch/_inductor/kernel/flex/flex_flash_attention.py``, template ``flash_attention.py.jinja``:
one ``_flash_attn_fwd`` call with Flex's ``score_mod``/``mask_mod`` rendered into the CuTe DSL,
their captured tensors as aux tensors, and the block mask as block-sparse tensors). The inputs
are Flex's usual ones (K/V gathered and padded in ``convert``); what it refuses, read in
torch 2.13 and flash-attn-4 4.0.0b36, is each a skipped row here:

- no flash-attn-4: torch raises "BACKEND='FLASH' but flash attention cannot be used: CUTE flash
  attention library is not available";
- dtypes: FlashAttention-4 takes float16/bfloat16 (and FP8 on SM100 only); torch refuses mixed
  q/k/v dtypes (an FP8 cache is dequantized to the model dtype in ``convert``, so it runs);
- head dims: Flex needs at least 16; FlashAttention-4 takes 8..256 on sm_90; and on sm_90 its
  block sparsity needs the block mask's KV block (Flex's 128) to equal the kernel's key tile
  (``block_sparsity.py``, ``normalize_block_sparse_config``: "Block sparsity requires
  sparse_block_size[1] ... to match tile_n"), which past head dim 128 is 112 or 80
  (``interface.py``, ``_tile_size_fwd_sm90``);
- a block mask without full-block lists ("Flash attention with block mask but without full
  blocks is not supported yet"): both of Flex's mask builds here give them.

Measured on an H200 (FlashAttention-4 4.0.0b36, torch 2.11): trees run (the row tables are int32,
as the CuTe lowering wants its indices; with int64 tables the tree mask_mod failed to compile); a
batch of one decode is refused (its [1, 1] tables have no layout the lowering takes); batches with
sinks were off the reference until the LSE was read in its true base (``lse_scale``).
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import math
from typing import Any, Optional

import torch


def flash_version() -> str:
    from .flash_attn4 import fa4_version

    return fa4_version()


def flash_unavailable() -> Optional[str]:
    """Why Flex's FLASH backend cannot run here at all (torch without it, no flash-attn-4)."""
    try:
        found = importlib.util.find_spec("torch._inductor.kernel.flex.flex_flash_attention") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return (f"torch {torch.__version__} has no Flex FLASH backend "
                "(torch/_inductor/kernel/flex/flex_flash_attention.py)")
    from .flash_attn4 import FlashAttn4Backend

    why = FlashAttn4Backend.unavailable()
    return None if why is None else f"Flex's FLASH backend runs FlashAttention-4: {why}"


def flash_reasons(batch: Any) -> list[str]:
    """Why Flex's FLASH backend cannot compute ``batch`` here (module docstring)."""
    v, out = flash_version(), []
    if batch.device.type != "cuda":
        out.append(f"Flex's FLASH backend ({v}) needs a CUDA GPU")
    if batch.dtype not in (torch.float16, torch.bfloat16):
        out.append(f"Flex's FLASH backend: {v} takes float16/bfloat16 (flash_attn/cute/interface.py), "
                   f"not {str(batch.dtype).replace('torch.', '')}")
    d, dv = batch.head_dim, batch.v_head_dim
    if min(d, dv) < 16:
        out.append(f"Flex needs head dims of at least 16, got {d}/{dv}")
    if max(d, dv) > 256 or d % 8 or dv % 8:
        out.append(f"Flex's FLASH backend: {v} takes head dims 8..256, multiples of 8, on sm_90 "
                   f"(interface.py, _validate_head_dims), got {d}/{dv}")
    elif batch.device.type == "cuda" and torch.cuda.get_device_capability(batch.device)[0] == 9 and max(d, dv) > 128:
        out.append(f"Flex's FLASH backend: on sm_90 {v} tiles head dims past 128 with 112- or 80-wide key "
                   "tiles (interface.py, _tile_size_fwd_sm90) and its block sparsity needs Flex's 128-wide KV "
                   f"blocks to equal them (block_sparsity.py, normalize_block_sparse_config); got {d}/{dv}")
    if batch.num_requests == 1 and int(batch.host.query_lens.max()) == 1:
        out.append(f"Flex's FLASH backend ({v}): a batch of one request with one query token makes [1, 1] row "
                   "tables, which its CuTe lowering refuses ('Aux tensor layout has no unique stride-1 leading "
                   "dimension', an H200)")
    return out


@functools.lru_cache(maxsize=None)
def lse_scale() -> float:
    """What the LSE Flex returns on its FLASH backend is multiplied by to be natural-log, as the sinks
    need it (``flex.run``): 1 / ln 2 on a torch whose ``flex_attention`` converts every backend's
    statistics from log2, FlashAttention-4's natural-log LSE included (pytorch/pytorch#181645, fixed
    by #181824, after which ``flex_attention`` passes ``stats_are_log2`` as False for FLASH); 1 on a
    torch with the fix. On an H200 with torch 2.11 the sink rows were off by rel. err 0.347 / 0.358 /
    0.266 (gpt-oss full and sliding layers at 4k, full at 16k); multiplying Flex's LSE by ln 2 on the
    CPU gives 0.343 / 0.357 / 0.264 on the same cases."""
    from torch.nn.attention import flex_attention as fa

    try:
        fixed = "stats_are_log2" in inspect.getsource(fa.flex_attention)
    except (OSError, TypeError):  # no source to read: trust the torch (every row is checked anyway)
        fixed = True
    return 1.0 if fixed else 1.0 / math.log(2.0)
