"""Where pages go: each request's physical page ids in the spec's layout (shared prefix pages
included, SEMANTICS "Paged cache" and "Shared prefixes"), and the per-request copies of a
shared prefix's partial last page."""
from __future__ import annotations

from typing import Any, Sequence

import torch

BatchSpec = Any  # workload.batch.BatchSpec (which imports this module; not imported back)


def page_assignment(spec: BatchSpec, generator: torch.Generator) -> list[list[int]]:
    """Physical page ids of each request's logical pages, in the spec's layout. Page 0 stays free.

    The layout acts on runs (``BatchSpec.page_runs``): a request's own pages, or a prefix
    group's shared pages, which every request of the group then lists first."""
    runs = spec.page_runs()
    counts = [n for _, _, n in runs]
    total = sum(counts)
    layout = spec.layout
    if layout == "interleaved":
        chunks: list[list[int]] = [[] for _ in counts]
        nxt = 1
        for j in range(max(counts, default=0)):
            for r, c in enumerate(counts):
                if j < c:
                    chunks[r].append(nxt)
                    nxt += 1
    else:
        ids = list(range(1, total + 1))
        if layout == "shuffled":
            perm = torch.randperm(total, generator=generator).tolist()
            ids = [ids[p] for p in perm]
        elif layout == "reversed":
            ids = ids[::-1]
        chunks, start = [], 0
        for c in counts:
            chunk = ids[start : start + c]
            if layout == "shuffled-within":
                perm = torch.randperm(c, generator=generator).tolist()
                chunk = [chunk[p] for p in perm]
            chunks.append(chunk)
            start += c
    shared = {g: chunk for (g, _, _), chunk in zip(runs, chunks) if g is not None}
    out: list[list[int]] = [[] for _ in spec.requests]
    for (_, i, _), chunk in zip(runs, chunks):
        if i is not None:
            r = spec.requests[i]
            out[i] = (shared[r.prefix_group] if spec.shared_pages(r) else []) + chunk
    return out


def copy_partial_prefix_pages(spec: BatchSpec, table: torch.Tensor, caches: Sequence[torch.Tensor]) -> None:
    """A shared prefix that ends inside a page: its last ``shared_prefix % page_size`` tokens sit
    in each request's own first page (a copy, as prefix-caching engines make); give every copy
    the K/V of the group's first request, so the whole prefix holds the same tokens."""
    ps = spec.page_size
    first: dict = {}
    for i, r in enumerate(spec.requests):
        tail = r.shared_prefix % ps if r.prefix_group is not None else 0
        if not tail:
            continue
        page = int(table[i, r.shared_prefix // ps])
        src = first.setdefault(r.prefix_group, page)
        if src != page:
            for c in caches:
                c[page, :tail] = c[src, :tail]
