"""A backend whose Triton kernel stores to a wild address (an illegal memory access that leaves
the CUDA context unusable). Loaded with --backend-file by tests/test_gpu_harness.py; GPU only."""
import torch
import triton
import triton.language as tl

from attnbench.backend import Backend


@triton.jit
def _wild_store(ptr):
    tl.store(ptr + (1 << 40), 1.0)


class Wild(Backend):
    name = "wild"
    capturable = False

    def plan(self, batch):
        return batch

    def run(self, batch):
        out = torch.empty_like(batch.q)
        _wild_store[(1,)](out)
        return out
