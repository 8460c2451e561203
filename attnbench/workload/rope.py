"""Fused RoPE (docs/semantics.md "Fused RoPE"): Llama-style rotary embedding, the rotate-half
pairing of dims ``i`` and ``i + D/2``, applied to q and k at their positions.

For position ``p``, dim pair ``i`` (0 <= i < D/2) turns by the angle
``p / rope_scale * rope_theta ** (-2 i / D)``:
``x[i] <- x[i] cos a - x[i + D/2] sin a``, ``x[i + D/2] <- x[i + D/2] cos a + x[i] sin a``.
"""
from __future__ import annotations

import torch


def rope_angles(pos: torch.Tensor, head_dim: int, theta: float, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``[*pos.shape, D/2]`` rotation angles in ``dtype`` for integer positions ``pos``."""
    i = torch.arange(head_dim // 2, device=pos.device, dtype=dtype)
    inv_freq = torch.pow(torch.tensor(float(theta), dtype=dtype, device=pos.device), -2.0 * i / head_dim)
    return (pos.to(dtype) / scale)[..., None] * inv_freq


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., D]`` rotated by ``angles`` ``[..., D/2]`` (broadcast against ``x``'s leading
    dims), computed in ``angles``' dtype; returned in that dtype."""
    half = x.shape[-1] // 2
    x = x.to(angles.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = torch.cos(angles), torch.sin(angles)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
