"""Index arrays of a batch's query tokens and tree topologies that both our kernels' plans
(attnbench/kernels/) and the library adapters' metadata (attnbench/backends/_metadata.py) derive
from ``batch.host`` and ``batch.trees``, by array ops (no Python loop over requests or nodes)."""
from __future__ import annotations

import functools

import numpy as np
import torch

from attnbench.workload.batch import Batch
from attnbench.workload.trees import ancestor_masks


def token_ids(batch: Batch, reqs: np.ndarray) -> np.ndarray:
    """Packed query-token ids of the requests ``reqs`` (in that order), int64."""
    h = batch.host
    sizes = h.query_lens[reqs]
    first = np.cumsum(sizes) - sizes  # where each request's tokens start in the output
    return np.repeat(h.query_start_loc[reqs] - first, sizes) + np.arange(int(sizes.sum()))


@functools.lru_cache(maxsize=64)
def topology_masks(topologies: tuple, tmax: int, device: str) -> torch.Tensor:
    """``[K, Tmax, Tmax]`` bool: the ancestor masks of ``K`` static topologies, padded to
    ``tmax``. Built once per (topologies, size, device): an engine derives these at start-up."""
    parents = torch.full((len(topologies), max(tmax, 1)), -1, dtype=torch.long)
    for k, p in enumerate(topologies):  # once per topology, never per step
        parents[k, : len(p)] = torch.tensor(p)
    return ancestor_masks(parents).to(device)
