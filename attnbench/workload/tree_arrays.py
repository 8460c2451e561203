"""Tree depths from padded parent arrays by array ops (issue 33): what plans derive from an
engine's per-step tree inputs (``workload.batch.TreeInputs``)."""
from __future__ import annotations

import numpy as np


def deepest(parents: np.ndarray) -> int:
    """The deepest node's depth in ``[Bt, T]`` padded parent arrays (-1: a root or padding)."""
    return int(node_depths(parents).max(initial=0))


def node_depths(parents: np.ndarray) -> np.ndarray:
    """``[Bt, T]`` int64 depth of every node of padded parent arrays (-1: a root or padding,
    depth 0), by pointer doubling (``up``: each node's ancestor ``dist`` levels up, a root its
    own): log2(depth) array steps instead of a Python step per node (issue 33: 64 dynamic trees
    of 61 nodes took ~150 us a plan)."""
    t = parents.shape[1]
    flat = parents.reshape(-1).astype(np.int64)
    node = np.arange(len(flat))
    dist = (flat >= 0).astype(np.int64)
    up = np.where(flat >= 0, flat + node // t * t, node)  # flat rows; a root points at itself
    while True:
        nxt = up[up]
        if (nxt == up).all():  # every pointer is at a root: dist is the depth
            return dist.reshape(parents.shape)
        dist += dist[up]
        up = nxt
