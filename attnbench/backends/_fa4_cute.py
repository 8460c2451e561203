"""The tree ``mask_mod`` in the CuTe DSL, as FlashAttention-4 4.0.0b36 calls it
(``flash_attn/cute/mask.py``, ``call_mask_mod``: ``mask_mod(batch_idx, head_idx, q_idx, kv_idx,
seqlen_info, aux_tensors)``, the indices as one-element TensorSSA values, the aux tensors as CuTe
tensors). Imported only where FlashAttention-4 is (it imports the CuTe DSL); the tables and the
same predicate in torch: ``_fa4_mask.py``. A module-level function, so that the hash FlashAttention-4
keys its compile cache on (its source) is computed once per process.
"""
import cutlass
import cutlass.cute as cute
from flash_attn.cute import utils


@cute.jit
def attnbench_tree_mask(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
    """Visible when ``lo <= kv <= hi`` or (``kv >= base`` and ``seen[off + kv - base]``): aux
    tensors ``lo, hi, base, off`` (``[B, Qpad]`` int32) and ``seen`` (flat int32)."""
    b = batch_idx[0]
    q = q_idx[0]
    base = aux_tensors[2][b, q]
    seen = aux_tensors[4][aux_tensors[3][b, q] + kv_idx[0] - base]
    lo = utils.scalar_to_ssa(aux_tensors[0][b, q], cutlass.Int32)
    hi = utils.scalar_to_ssa(aux_tensors[1][b, q], cutlass.Int32)
    tree_start = utils.scalar_to_ssa(base, cutlass.Int32)
    seen_ssa = utils.scalar_to_ssa(seen, cutlass.Int32)
    zero = utils.scalar_to_ssa(0, cutlass.Int32)
    return ((kv_idx >= lo) & (kv_idx <= hi)) | ((kv_idx >= tree_start) & (seen_ssa > zero))
