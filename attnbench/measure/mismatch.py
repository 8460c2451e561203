"""Where an output differs from the reference: which requests (kind and index in the batch)
and which query heads are over the tolerance, and by how much, so that a mismatch row points
at the cause (trees only? one head? the last request?) instead of one global number."""
from __future__ import annotations

import torch


def _runs(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> ``0-2, 5, 7-8``."""
    out, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def _rel(diff: torch.Tensor, ref: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    return diff.square().sum(dims).sqrt() / ref.square().sum(dims).sqrt().clamp_min(1e-300)


def mismatch_where(out: torch.Tensor, ref: torch.Tensor, query_start_loc, kinds: list[str], tol: float) -> str:
    """``requests tree 5-6 (2 of 7), heads 0-7 (8 of 8); worst: request tree 6 at 0.12 (1200x the
    tolerance), head 3 at 0.09``. ``out``, ``ref``: [N, Hq, D]; ``query_start_loc``: [R + 1]
    token offsets of the requests, whose kinds are ``kinds``. Per part: ‖out − ref‖/‖ref‖ over
    that request's tokens (or that head), against ``tol``."""
    o, r = out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    diff = o - r
    starts = [int(x) for x in query_start_loc.tolist()]
    per_req = [_rel(diff[a:b], r[a:b], (0, 1, 2)).item() if b > a else 0.0 for a, b in zip(starts, starts[1:])]
    per_head = _rel(diff, r, (0, 2)).tolist()
    bad_req = [i for i, e in enumerate(per_req) if not e <= tol]
    bad_head = [h for h, e in enumerate(per_head) if not e <= tol]
    by_kind: dict[str, list[int]] = {}
    for i in bad_req:
        by_kind.setdefault(kinds[i], []).append(i)
    parts = []
    if bad_req:
        parts.append("requests " + "; ".join(f"{k} {_runs(ix)}" for k, ix in by_kind.items())
                     + f" ({len(bad_req)} of {len(per_req)})")
    if bad_head:
        parts.append(f"heads {_runs(bad_head)} ({len(bad_head)} of {len(per_head)})")
    if not parts:
        return ""
    worst = []
    if per_req:
        i = max(range(len(per_req)), key=lambda j: per_req[j])
        worst.append(f"request {kinds[i]} {i} at {per_req[i]:.3g} ({per_req[i] / tol:.3g}x the tolerance)")
    h = max(range(len(per_head)), key=lambda j: per_head[j])
    worst.append(f"head {h} at {per_head[h]:.3g}")
    return "over it: " + ", ".join(parts) + "; worst: " + ", ".join(worst)
