"""Backends that misbehave on purpose (used with --backend-file by tests/test_isolation.py).

Not collected by pytest (no test_ prefix). Each one fails in one way: raises, segfaults
(a null read through ctypes), aborts, returns NaN, a wrong shape, a wrong dtype, hangs
(past --timeout), returns memory it never wrote, sleeps in `unsupported` (for the
kill-and-resume test), or skips with a blank reason (a malformed row).
"""
import ctypes, os, time
import torch
from attnbench.backend import Backend

class _Good(Backend):
    name = "_good_base"
    def plan(self, batch):
        from attnbench.workload.reference import reference_attention
        self.out = reference_attention(batch)[0].to(batch.dtype)
        return batch
    def run(self, batch):
        return self.out.clone()

class Explodes(Backend):
    name = "explodes"
    def plan(self, batch): return batch
    def run(self, batch): raise RuntimeError("kernel exploded")

class Segfault(Backend):
    name = "segfault"
    def plan(self, batch): return batch
    def run(self, batch): ctypes.string_at(0)

class Aborts(Backend):
    name = "aborts"
    def plan(self, batch): return batch
    def run(self, batch): os.abort()

class Nan(_Good):
    name = "nan"
    def run(self, batch):
        o = self.out.clone(); o[0, 0, 0] = float("nan"); return o

class Shape(_Good):
    name = "shape"
    def run(self, batch): return self.out[:-1].clone()

class Dtype(_Good):
    name = "dtype"
    def run(self, batch): return self.out.double()

class Sleeps(Backend):
    name = "sleeps"
    def plan(self, batch): return batch
    def run(self, batch): time.sleep(600)

class Unwritten(Backend):
    name = "unwritten"
    def plan(self, batch): return batch
    def run(self, batch): return torch.empty_like(batch.q)


class Sleepy(Backend):
    name = "sleepy"
    def unsupported(self, batch):
        time.sleep(0.4)
        return ["sleepy never runs"]
    def plan(self, batch): return batch
    def run(self, plan): return None


class Blank(_Good):
    name = "blank"
    def unsupported(self, batch): return [" "]  # skips without saying why: a malformed row
