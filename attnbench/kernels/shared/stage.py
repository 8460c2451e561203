"""What a triton plan step writes besides the unit table (plan round 3, issue 33): a dynamic
tree's words (``Words``) and the host buffer every table is written into, with its one copy to
the device (``Staging``). shared/step.py builds the rest of the step's tables."""
from __future__ import annotations

import os

import numpy as np
import torch

from attnbench.kernels.shared import plan as tp
from attnbench.workload.tokens import token_ids


class Words:
    """A step's tree words ``[max(N, 1), W]`` int64 (``tp.host_tree_words``): a static tree's
    packed once per shape (``image``, int32 elements), a dynamic tree's rebuilt every step by
    ``tp.ancestor_words``' pointer doubling (``write``) over the tree tokens only, in token order
    (``compact`` rows: tree i's node j is row ``first[i] + j``), and written straight into the
    buffer: one slice when the tree tokens are contiguous (every token a tree's, or one run of
    them), else one scatter. Kept per shape: each node's own bit, the rows' tree offsets, where
    the tokens go; rebuilt every step: everything that reads the parents."""

    def __init__(self, batch):
        t = batch.trees
        self.w = w = max(1, -(-t.tmax // 64))
        self.dynamic, self.tree = t.dynamic, bool(t.tmax)
        words = np.zeros((max(1, batch.num_tokens), w), np.int64) if t.dynamic or not t.tmax \
            else tp.host_tree_words(batch)[0]
        self.nw, self.size = words.shape[0], words.size * 2
        self.image = words.reshape(-1).view(np.int32)
        if t.dynamic:
            self._dynamic(batch, t, w)

    def _dynamic(self, batch, t, w: int) -> None:
        nt = int(t.sizes.sum())
        first = np.cumsum(t.sizes) - t.sizes  # each tree's root row
        node = np.arange(nt) - np.repeat(first, t.sizes)
        # each padded parent slot's tree offset (flat): the compact row of a parent index
        self.base = np.repeat(first, t.tmax)
        full = bool((t.sizes == t.tmax).all())
        self.real = None if full else np.repeat(np.arange(len(t.reqs)) * t.tmax, t.sizes) + node
        own = np.zeros((nt, w), dtype=np.uint64)
        own[np.arange(nt), node // 64] = np.left_shift(np.uint64(1), (node % 64).astype(np.uint64))
        self.acc0 = own.reshape(-1) if w == 1 else own
        tok = token_ids(batch, t.reqs)
        run = nt > 0 and int(tok[-1]) - int(tok[0]) == nt - 1  # increasing ids: one run of tokens
        self.span = slice(int(tok[0]), int(tok[0]) + nt) if run else None
        self.tok = tok

    def write(self, buf: np.ndarray, batch) -> None:
        """A dynamic step's words into ``buf`` (which holds the zero image). The parents' rows are
        ``max(base + parent, base)`` (a root's -1 is its own row), and the last doubling step ORs
        straight into the buffer when the tree tokens are one run (no copy of the result)."""
        t = batch.trees
        up = np.add(self.base, t.parents_host.reshape(-1))  # int64 (intp): take's own index type
        np.maximum(up, self.base, out=up)
        if self.real is not None:
            up = up[self.real]  # the real nodes' parents, as compact rows
        words = buf[: self.size].view(np.uint64)
        if self.w > 1:
            words = words.reshape(self.nw, self.w)
        acc, steps = self.acc0, t.max_depth.bit_length()  # 2^steps > the deepest depth
        for i in range(1, steps + 1):
            if i == steps and self.span is not None:
                np.bitwise_or(acc, acc.take(up, axis=0, mode="clip"), out=words[self.span])
                return
            acc = acc | acc.take(up, axis=0, mode="clip")  # (every row index is in range: clip skips the check)
            if i < steps:
                up = up.take(up, mode="clip")
        words[self.span if self.span is not None else self.tok] = acc


class Staging:
    """The host buffer a plan writes its tables into, and its one copy to the device.

    On the CPU each plan gets a fresh numpy buffer, which is its tables (no copy). On a GPU, by
    default, a fresh pageable numpy buffer and one plain copy (``Tensor.to``: on CUDA a
    synchronous copy). With ATTNBENCH_TRITON_PINNED_STAGING=1 (until a device run has timed it
    against the default): a pinned buffer from torch's caching host allocator each plan and one
    ``non_blocking`` copy; the allocator records the copy's event itself and hands the block out
    again only after that copy has completed, once the plan has dropped it (round 2's ring did
    this with a Python-side event and stream per plan, which cost about what the pinned copy
    saved: the kernel notes in git history (triton_notes.md), plan round 3)."""

    def __init__(self):
        self.pinned = os.environ.get("ATTNBENCH_TRITON_PINNED_STAGING", "") == "1"
        self._src = None  # the pinned tensor of the plan being built
        self._unread: dict = {}

    def host(self, size: int, device: torch.device) -> np.ndarray:
        if device.type != "cuda" or not self.pinned:
            return np.empty(size, np.int32)  # each plan owns its tables
        self._src = torch.empty(size, dtype=torch.int32, pin_memory=True)
        return self._src.numpy()

    def send(self, buf: np.ndarray, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":  # the buffer itself
            return torch.from_numpy(buf)
        if not self.pinned:
            return torch.from_numpy(buf).to(device)
        src, self._src = self._src, None  # dropped after the copy: the allocator keeps it until done
        return src.to(device, non_blocking=True)

    def unread(self, dev: torch.device, dtype: torch.dtype, *dims: int) -> torch.Tensor:
        """``[1, 1, *dims]``: the partial outputs or LSEs of a plan without splits, which no
        kernel reads or writes (no unit has a partial row, no merge runs): one tensor per
        device, dtype and dims, shared by such plans, instead of two allocations a step."""
        key = (dev, dtype, dims)
        t = self._unread.get(key)
        if t is None:
            t = self._unread[key] = torch.empty(1, 1, *dims, dtype=dtype, device=dev)
        return t
